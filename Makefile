# KVCM developer commands. Everything runs from .venv, built from the requirement files
# with Python 3.12 (the Lambda runtime's: SnapStart needs 3.12 or later) and pip; it is
# re-installed only when a requirement file or the Python version changes (the stamp file below).

PYTHON_VERSION := 3.12
comma := ,
IS_VERSION := import sys; assert sys.version_info[:2] == ($(subst .,$(comma) ,$(PYTHON_VERSION)))
# The first interpreter of that version that runs (a pyenv shim of a version not selected exists
# but fails), by its real path.
ifndef PYTHON
PYTHON := $(shell for p in python$(PYTHON_VERSION) $(HOME)/.pyenv/versions/$(PYTHON_VERSION).*/bin/python$(PYTHON_VERSION) python3; do \
	"$$p" -c '$(IS_VERSION); print(sys.executable)' 2>/dev/null && break; done)
endif
# Bytecode goes under .venv, never beside the sources: `chalice package` imports the app and
# then zips chalicelib/ whole, so __pycache__ folders there would ship (~0.8 MB).
export PYTHONPYCACHEPREFIX := $(CURDIR)/.venv/pycache
VENV := .venv
STAMP := $(VENV)/.requirements-$(PYTHON_VERSION).stamp
BIN := $(VENV)/bin
STAGE ?= dev
PACKAGE_DIR := out/$(STAGE)
MERGE_TEMPLATE := out/$(STAGE)-merge-template.json
# Deployment tools whose pins clash with the app's (checkov; aws-sam-translator for the
# rehearsal), in their own venv.
TOOLS_STAMP := .venv-tools/.requirements.stamp
# The engines' wheels (requirements-engines.txt), unpacked off sys.path for the tests to load from.
ENGINES_DIR := $(VENV)/engines
ENGINES_STAMP := $(ENGINES_DIR)/.requirements.stamp

.PHONY: help run test test-fast clean package bench demo test-tools tools scan deploy deploy-infra rehearse
.DEFAULT_GOAL := help

$(STAMP): requirements.txt requirements-dev.txt
	@$(PYTHON) -c '$(IS_VERSION)' 2>/dev/null || { echo "KVCM needs Python $(PYTHON_VERSION) (set PYTHON=...)"; exit 2; }
	@# A .venv of another Python version (an older checkout's) is made anew.
	$(BIN)/python -c '$(IS_VERSION)' 2>/dev/null || \
		{ rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	touch $@

$(ENGINES_STAMP): requirements-engines.txt $(STAMP)
	rm -rf $(ENGINES_DIR)
	$(BIN)/python -m pip install --quiet --no-deps --only-binary=:all: --python-version 3.11 \
		--target $(ENGINES_DIR) -r requirements-engines.txt
	touch $@

## help: this list (what `make` alone prints)
help:
	@echo "KVCM developer commands (make <target>):"
	@awk '/^## /{sub(/^## /, ""); name = $$0; sub(/:.*/, "", name); text = $$0; sub(/^[^:]*: /, "", text); \
		printf "  %-9s %s\n", name, text}' $(MAKEFILE_LIST)

# The `kvcm` command (kvcm_client/cli.py) in .venv/bin, run from this checkout.
$(BIN)/kvcm: $(STAMP)
	printf '#!%s\nimport sys\nsys.path.insert(0, "%s")\nfrom kvcm_client.cli import main\nsys.exit(main())\n' \
		"$(abspath $(BIN))/python" "$(CURDIR)" > $@
	chmod +x $@

# Debian packages the tests use, installed when missing and apt-get can (root): headless
# Chromium for the console tests, jq for the README's examples; without them those tests
# are skipped outside CI.
test-tools:
	@{ command -v chromium && command -v jq; } >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq chromium jq; } || \
		echo "warning: chromium/jq could not be installed: the console and README tests will be skipped"

## run: start the local stack (API on :8000, moto on :4566, Valkey), Ctrl-C to stop
run: $(STAMP) $(BIN)/kvcm
	$(BIN)/python -m local_stack

## lint: ruff (lint + format check) and mypy, configured in pyproject.toml; CI runs it before the tests
.PHONY: lint
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## test: unit, integration and e2e tests (console screenshots in out/console-screenshots)
test: $(STAMP) $(BIN)/kvcm $(ENGINES_STAMP) test-tools $(TOOLS_STAMP)
	$(BIN)/python -m pytest -ra

## test-fast: the edit loop: every test not marked slow (no soak, rehearsal, live replay, e2e stack)
# Bytecode is kept between runs of the edit loop (some shells set PYTHONDONTWRITEBYTECODE:
# every run would then compile the app, the tests and their libraries again, ~10% of it).
test-fast: $(STAMP) $(BIN)/kvcm $(ENGINES_STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -m "not slow"

## test-huge: the sampled curve against the exact one on a generated 10M-block trace (about an hour)
.PHONY: test-huge
test-huge: $(STAMP)
	KVCM_HUGE_TESTS=1 $(BIN)/python -m pytest tests/unit/optimizer/test_shards.py -k large_generated

## clean: forget the local state (control table, Valkey data, file storage) and build outputs (refused while a stack runs on it)
clean:
	if [ -x $(BIN)/python ]; then $(BIN)/python -m local_stack clean; else rm -rf .state; fi
	rm -rf out

## package: CloudFormation (SAM) for STAGE (default dev) in out/<stage>/, then cfn-lint
# chalice package needs a region (any: the template is region-independent), no credentials.
package: export AWS_DEFAULT_REGION ?= us-east-1
package: $(STAMP)
	mkdir -p out
	$(BIN)/python -m infra.merge_template --stage $(STAGE) --output $(MERGE_TEMPLATE)
	$(BIN)/chalice package --stage $(STAGE) --merge-template $(MERGE_TEMPLATE) $(PACKAGE_DIR)
	$(BIN)/cfn-lint $(PACKAGE_DIR)/sam.json
	@echo "packaged: $(PACKAGE_DIR)/sam.json + deployment.zip"

$(TOOLS_STAMP): infra/requirements-tools.txt
	test -x .venv-tools/bin/python || $(PYTHON) -m venv .venv-tools
	.venv-tools/bin/python -m pip install --quiet -r infra/requirements-tools.txt
	touch $@

## tools: the deployment tools' venv .venv-tools (checkov, aws-sam-translator)
tools: $(TOOLS_STAMP)

## scan: checkov on STAGE's packaged template and infra stack (waivers: docs/deploy.md)
scan: package $(TOOLS_STAMP)
	$(BIN)/python -m infra.merge_template --stage $(STAGE) --infra --output out/$(STAGE)-infra.json
	.venv-tools/bin/checkov --config-file infra/checkov.yaml -f $(PACKAGE_DIR)/sam.json -f out/$(STAGE)-infra.json

## deploy: package STAGE, upload to s3://BUCKET, deploy stack kvcm-STAGE (PARAMS="Key=Value ...")
deploy: package
	@test -n "$(BUCKET)" || { echo "BUCKET=<artifact bucket> is required: the template is over CloudFormation's inline limit"; exit 2; }
	$(BIN)/python -m infra.deploy $(DEPLOY_FLAGS) stack --stage $(STAGE) --bucket $(BUCKET) $(PARAMS)

## deploy-infra: stack kvcm-STAGE-infra for `chalice deploy`, then the Chalice stage from its outputs
deploy-infra: $(STAMP)
	$(BIN)/python -m infra.deploy $(DEPLOY_FLAGS) infra --stage $(STAGE) $(if $(BUCKET),--bucket $(BUCKET)) $(PARAMS)
	$(BIN)/python -m infra.deploy $(DEPLOY_FLAGS) configure-stage --stage $(STAGE)

## rehearse: both deploy paths against a local AWS (moto) and Valkey; report in out/rehearsal.json, then PASS or FAIL (the failing step last)
rehearse: $(STAMP) $(TOOLS_STAMP)
	mkdir -p out
	$(BIN)/python -m infra.rehearsal --report out/rehearsal.json

## bench: run every bench/*.py (files starting with _ are helpers)
bench: $(STAMP)
	@set -e; for script in bench/[!_]*.py; do \
		[ -e "$$script" ] || continue; \
		echo "== $$script"; $(BIN)/python "$$script"; \
	done

## demo: optimizer capacity report on the Mooncake conversation trace in traces/ (out/optimizer-demo)
demo: $(STAMP)
	$(BIN)/python -m chalicelib.optimizer report --trace traces/mooncake_conversation.jsonl \
		--format mooncake --out out/optimizer-demo --model llama-3.1-70b --storage-tier ssd
