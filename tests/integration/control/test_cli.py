"""``python -m chalicelib.control add-account``: its --help and a clean error without a password."""

import io
import sys

import pytest

from chalicelib.control.__main__ import main


def test_add_account_help_names_the_default_role_and_the_environment(capsys):
    with pytest.raises(SystemExit) as done:
        main(["add-account", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "default: ROLE_ADMIN" in out and "KVCM_PASSWORD" in out and "KVCM_CONTROL_TABLE" in out


def test_no_password_and_no_terminal_is_one_line_not_a_traceback(runtime, monkeypatch, capsys):
    monkeypatch.delenv("KVCM_PASSWORD", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["add-account", "--user", "root"], runtime=runtime) == 1
    assert capsys.readouterr().err == "error: no password: set KVCM_PASSWORD or run this in a terminal to be asked\n"
    assert runtime.control.list_accounts() == []
