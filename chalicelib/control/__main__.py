"""``python -m chalicelib.control``: manage accounts straight in the control table.

With auth on, every admin call needs an admin account, so the first one cannot be made
over HTTP: this makes it with the caller's AWS credentials (DynamoDB access to the table
is the privilege). The password is read from ``KVCM_PASSWORD`` or prompted for, never
taken from the command line, where it would show in the process list and shell history.

    KVCM_CONTROL_TABLE=kvcm-control-prod python -m chalicelib.control add-account --user admin --role ROLE_ADMIN
"""
from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Optional, Sequence

from ..protocol.codes import Role
from ..protocol.errors import InvalidArgumentError, KvcmError
from ..runtime import Runtime
from ..settings import Settings

PASSWORD_ENV = "KVCM_PASSWORD"


def read_password() -> str:
    """The new account's password: ``KVCM_PASSWORD``, else typed twice at a prompt."""
    password = os.environ.get(PASSWORD_ENV)
    if password is not None:
        return password
    password = getpass.getpass("password: ")
    if getpass.getpass("again: ") != password:
        raise InvalidArgumentError("the two passwords differ")
    return password


def main(argv: Optional[Sequence[str]] = None, runtime: Optional[Runtime] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chalicelib.control", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add-account", help="add an account (password from KVCM_PASSWORD or a prompt)")
    add.add_argument("--user", required=True)
    add.add_argument("--role", choices=[Role.ROLE_ADMIN.name, Role.ROLE_USER.name], default=Role.ROLE_ADMIN.name)
    commands.add_parser("list-accounts", help="every account's name and role")
    args = parser.parse_args(argv)

    control = (runtime or Runtime(settings=Settings.from_env())).control
    try:
        if args.command == "add-account":
            control.add_account(args.user, read_password(), Role[args.role])
            print(f"added {args.role} account {args.user!r} to {control.table.name}")
        else:
            for account in control.list_accounts():
                print(f"{account.user_name}\t{account.role.name}")
    except KvcmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
