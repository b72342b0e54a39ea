"""Authentication cost per request (issue 11.6): API keys against the password bearer.

Baselines, measured in the same run: the password bearer as it was checked before API
keys (a scrypt verification per uncached request, which every bad guess also costs) and
its per-container cache hit. Then what a call costs now: an API key (warm config cache:
a SHA-256 and two dict lookups), a bad key, a password guess once the limiter refuses
(no scrypt), and a whole getInstanceInfo through the dispatcher with auth off and with
an API key, so the share of authentication in a call shows.

    .venv/bin/python bench/bench_auth.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import row, start_local_aws, timeit_interleaved, timeit_us, valkey_server

PASSWORD = "bench-admin-password"


def build_runtime(client):
    from chalicelib.clock import ManualClock

    aws = start_local_aws()
    from chalicelib.control import ensure_table
    from chalicelib.protocol.codes import Role
    from chalicelib.protocol.models import InstanceGroup, RegisterInstanceRequest, StorageConfig
    from chalicelib.runtime import Runtime, set_runtime
    from chalicelib.settings import Settings

    # A manual clock: the config cache never refreshes mid-run, as in a warm container.
    rt = Runtime(settings=Settings(config_refresh_s=3600, node_id="bench"), clock=ManualClock(), valkey=client)
    ensure_table(rt.aws("dynamodb"), rt.settings.control_table)
    rt.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": "/tmp/kvcm-bench-auth", "key_count_per_file": 8}}
        )
    )
    rt.control.create_group(InstanceGroup.model_validate({"name": "g", "storage_candidates": ["nfs_01"]}))
    rt.control.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "g",
                "instance_id": "bench",
                "block_size": 16,
                "location_spec_infos": [{"name": "tp0", "size": 1024}],
                "model_deployment": {"model_name": "m", "dtype": "bf16"},
            }
        )
    )
    rt.control.add_account("root", PASSWORD, Role.ROLE_ADMIN)
    rt.control.add_account("engine", "", Role.ROLE_ENGINE, groups=["g"])
    api_key, _ = rt.control.create_api_key("engine", 3600)
    set_runtime(rt)
    return rt, aws, api_key


def main() -> None:
    from chalicelib.auth import Authorizer, FailureLimiter
    from chalicelib.protocol.errors import UnauthorizedError
    from chalicelib.routes import meta
    from chalicelib.routes.dispatch import Dispatcher

    with valkey_server() as client:
        rt, aws, api_key = build_runtime(client)
        try:
            auth = rt.auth
            password = {"Authorization": f"Bearer root:{PASSWORD}"}
            key = {"Authorization": f"Bearer {api_key}"}
            bad_key = {"Authorization": f"Bearer {api_key[:-4]}AAAA"}

            def refused(headers, authorizer=auth):
                try:
                    authorizer.authenticate(headers)
                except UnauthorizedError:
                    return
                raise AssertionError("accepted")

            scrypt_us = timeit_us(lambda: rt.control.verify_account("root", PASSWORD), repeat=20, warmup=2)
            locked = Authorizer(rt.config, rt.control, rt.clock, limiter=FailureLimiter(rt.clock, per_name=1))
            refused({"Authorization": "Bearer root:guess"}, locked)
            guess = {"Authorization": "Bearer root:another-guess"}
            figures = timeit_interleaved(
                {
                    "password cached": lambda: auth.authenticate(password),
                    "api key": lambda: auth.authenticate(key),
                    "bad api key": lambda: refused(bad_key),
                    "limited guess": lambda: refused(guess, locked),
                }
            )

            dispatcher = Dispatcher(meta.OPERATIONS)
            body = json.dumps({"instance_id": "bench"})
            off = rt.settings
            on = dataclasses.replace(off, auth_enabled=True)

            def call(settings, headers):
                rt.settings = settings
                status, _ = dispatcher.handle(rt, "getInstanceInfo", body, headers)
                assert status == 200

            calls = timeit_interleaved(
                {"auth off": lambda: call(off, {}), "api key": lambda: call(on, key)}, rounds=10, per_round=200
            )
        finally:
            aws.stop()

    print("Authentication per request (median)")
    print(row("password, scrypt per request (before: bad guess / miss)", scrypt_us))
    print(row("password, container cache hit (before: warm path)", figures["password cached"], scrypt_us))
    print(row("API key, warm config cache (now)", figures["api key"], scrypt_us))
    print(row("bad API key (cached miss)", figures["bad api key"], scrypt_us))
    print(row("password guess refused by the limiter (429, no scrypt)", figures["limited guess"], scrypt_us))
    print("getInstanceInfo through the dispatcher (median)")
    print(row("auth off (baseline)", calls["auth off"]))
    print(row("API key", calls["api key"], calls["auth off"]))


if __name__ == "__main__":
    main()
