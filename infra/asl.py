"""ASL definitions as data: discovery, ``${...}`` substitutions and their Lambda names.

Shared by the local stack (fills substitutions with moto ARNs) and the infra template
builder (fills them with ``Fn::GetAtt`` of the packaged functions), so both agree on one
naming rule: ``${ExpireWriteSessionsArn}`` is the function ``expire_write_sessions``,
whose CloudFormation logical id Chalice derives with the same helper used here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from chalice.utils import to_cfn_resource_name

ASL_SUFFIX = ".asl.json"
ARN_SUFFIX = "Arn"

#: Settings variable that carries each workflow's state machine ARN to the app.
STATE_MACHINE_ENV: Mapping[str, str] = {
    "write_session_reaper": "KVCM_REAPER_STATE_MACHINE_ARN",
    "batched_delete": "KVCM_DELETE_STATE_MACHINE_ARN",
    "optimizer_sweep": "KVCM_SWEEP_STATE_MACHINE_ARN",
    "instance_purge": "KVCM_PURGE_STATE_MACHINE_ARN",
    "tier_copy": "KVCM_COPY_STATE_MACHINE_ARN",
}

_SUBSTITUTION = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


class MissingSubstitution(LookupError):
    """An ASL file names a substitution that no Lambda function provides."""


def discover(directories: Iterable[Path]) -> dict[str, Path]:
    """``{workflow name: path}`` for every ``*.asl.json`` in ``directories`` (missing ones skipped)."""
    found: dict[str, Path] = {}
    for directory in directories:
        if directory.is_dir():
            for path in sorted(directory.glob(f"*{ASL_SUFFIX}")):
                found[path.name[: -len(ASL_SUFFIX)]] = path
    return found


def substitutions(definition: str) -> set[str]:
    """Names of the ``${...}`` placeholders in an ASL text."""
    return set(_SUBSTITUTION.findall(definition))


def logical_id(name: str) -> str:
    """The logical id ``chalice package`` gives a function's resource (``expire_write_sessions``
    → ``ExpireWriteSessions``)."""
    return to_cfn_resource_name(name)


def arn_placeholder(function_logical_id: str) -> str:
    """``ExpireWriteSessions`` → ``ExpireWriteSessionsArn``."""
    return function_logical_id + ARN_SUFFIX


def invoked_functions(definition: str, source: str = "ASL") -> set[str]:
    """Logical ids of the functions whose ARNs an ASL text needs."""
    ids = set()
    for placeholder in substitutions(definition):
        if not placeholder.endswith(ARN_SUFFIX):
            raise MissingSubstitution(f"{source}: ${{{placeholder}}} is not a function ARN placeholder")
        ids.add(placeholder[: -len(ARN_SUFFIX)])
    return ids


def substitution_map(function_arns: Mapping[str, str]) -> dict[str, str]:
    """``{placeholder: ARN}`` from ``{function name: ARN}``."""
    return {arn_placeholder(logical_id(name)): arn for name, arn in function_arns.items()}


def render(definition: str, values: Mapping[str, str], source: str = "ASL") -> str:
    """Fill every placeholder; raises MissingSubstitution naming the first unknown one."""
    missing = sorted(substitutions(definition) - set(values))
    if missing:
        raise MissingSubstitution(f"{source}: no Lambda function provides {', '.join(missing)}")
    return _SUBSTITUTION.sub(lambda match: values[match.group(1)], definition)
