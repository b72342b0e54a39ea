"""``python -m chalicelib.control``: manage accounts straight in the control table.

With auth on, every admin call needs an admin account, so the first one cannot be made
over HTTP: this makes it with the caller's AWS credentials (DynamoDB access to the table
is the privilege). The password is read from ``KVCM_PASSWORD`` or prompted for, never
taken from the command line, where it would show in the process list and shell history.

    KVCM_CONTROL_TABLE=kvcm-control-prod python -m chalicelib.control add-account --user admin --role ROLE_ADMIN
    KVCM_CONTROL_TABLE=kvcm-control-prod python -m chalicelib.control add-account --user vllm-a \
        --role ROLE_ENGINE --groups g1
    KVCM_CONTROL_TABLE=kvcm-control-prod python -m chalicelib.control create-api-key --user vllm-a
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Sequence
from typing import Protocol

import botocore.session

from ..clock import SystemClock
from ..protocol.codes import Role
from ..protocol.errors import InvalidArgumentError, KvcmError
from ..settings import Settings
from .plane import ControlPlane

PASSWORD_ENV = "KVCM_PASSWORD"


class Deployment(Protocol):
    """What the commands act on: a control plane and the settings of its stage (a test
    hands its runtime's)."""

    @property
    def control(self) -> ControlPlane: ...

    @property
    def settings(self) -> Settings: ...


class _StageFromEnvironment:
    """The stage the environment names: its control table, nothing else (no Valkey, no
    runtime: the table is all these commands touch)."""

    def __init__(self) -> None:
        self.settings = Settings.from_env()
        # botocore reads AWS_ENDPOINT_URL and the credentials from the environment itself.
        dynamodb = botocore.session.get_session().create_client("dynamodb", region_name=self.settings.aws_region)
        self.control = ControlPlane(lambda: dynamodb, self.settings.control_table, SystemClock())


def read_password() -> str:
    """The new account's password: ``KVCM_PASSWORD``, else typed twice at a prompt (a terminal)."""
    password = os.environ.get(PASSWORD_ENV)
    if password is not None:
        return password
    if not sys.stdin.isatty():
        # getpass would fall back to reading a pipe with a warning, or die on EOF with a traceback.
        raise InvalidArgumentError(f"no password: set {PASSWORD_ENV} or run this in a terminal to be asked")
    password = getpass.getpass("password: ")
    if getpass.getpass("again: ") != password:
        raise InvalidArgumentError("the two passwords differ")
    return password


def main(argv: Sequence[str] | None = None, runtime: Deployment | None = None) -> int:
    """Run one command on ``runtime`` (a test's), else on the stage the environment names;
    0 when done, 1 with a one-line error."""
    parser = argparse.ArgumentParser(prog="python -m chalicelib.control", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser(
        "add-account",
        help="add an account (an admin's password from KVCM_PASSWORD or a prompt; other roles use API keys)",
        description="Add an account straight in the control table (the first admin of a stage with auth on).",
        epilog=f"environment: {PASSWORD_ENV} (the password of an admin account; else asked twice on a terminal), "
        "KVCM_CONTROL_TABLE (default kvcm-control; deployed: kvcm-control-<stage>), AWS_REGION, "
        "AWS_ENDPOINT_URL and the usual AWS credentials (the local stack: http://127.0.0.1:4566, any "
        "credentials).",
    )
    add.add_argument("--user", required=True, help="the account's user_name")
    add.add_argument(
        "--role",
        choices=[role.name for role in Role],
        default=Role.ROLE_ADMIN.name,
        help="its role (default: %(default)s)",
    )
    add.add_argument("--groups", default="", help="comma-separated instance groups (default: all)")
    add.add_argument("--instance-prefixes", default="", help="comma-separated instance-id prefixes")
    key = commands.add_parser("create-api-key", help="print a new API key of an account (shown only now)")
    key.add_argument("--user", required=True)
    key.add_argument("--expire-seconds", type=int, default=0, help="lifetime (default: KVCM_API_KEY_DEFAULT_TTL_S)")
    commands.add_parser("list-accounts", help="every account's name, role and groups")
    args = parser.parse_args(argv)

    deployment = runtime or _StageFromEnvironment()
    control = deployment.control
    try:
        if args.command == "add-account":
            role = Role[args.role]
            password = read_password() if role == Role.ROLE_ADMIN else ""
            control.add_account(args.user, password, role, _list(args.groups), _list(args.instance_prefixes))
            print(f"added {args.role} account {args.user!r} to {control.table.name}")
        elif args.command == "create-api-key":
            ttl_s = args.expire_seconds or deployment.settings.api_key_default_ttl_s
            api_key, _ = control.create_api_key(args.user, ttl_s)
            print(api_key)
        else:
            for account in control.list_accounts():
                print(f"{account.user_name}\t{account.role.name}\t{','.join(account.instance_groups)}")
    except KvcmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


if __name__ == "__main__":
    sys.exit(main())
