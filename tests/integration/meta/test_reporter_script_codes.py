"""The event-report scripts' item codes come from ``ErrorCode`` (generated Lua constants,
``reporters.lua_codes``), so the wire codes and the scripts' cannot drift apart."""

from __future__ import annotations

import re

from chalicelib.protocol.codes import ErrorCode
from chalicelib.stores.reporters import LUA_DIR, SCRIPT_CODES, lua_codes

_CODE_NAMES = "|".join(member.name for member in ErrorCode)


def test_no_script_spells_a_code_by_hand():
    """No er_*.lua declares a local named as an ErrorCode member (its value would be a copy)."""
    declared = re.compile(rf"\blocal\b[^=\n]*\b({_CODE_NAMES})\b[^=\n]*=")
    for path in sorted(LUA_DIR.glob("er_*.lua")):
        assert not declared.search(path.read_text()), path.name


def test_every_code_a_script_names_is_generated():
    """A script naming a code absent from SCRIPT_CODES would read an undeclared global."""
    named = set()
    for path in LUA_DIR.glob("er_*.lua"):
        named |= set(re.findall(rf"\b({_CODE_NAMES})\b", path.read_text()))
    assert named <= {code.name for code in SCRIPT_CODES}
    assert {"OK", "NODE_NOT_REGISTERED", "SNAPSHOT_RATE_LIMITED"} <= named


def test_the_generated_constants_are_the_wire_values_in_valkey(valkey):
    script = valkey.register_script(lua_codes() + "return {" + ", ".join(c.name for c in SCRIPT_CODES) + "}")
    assert script() == [code.value for code in SCRIPT_CODES]
