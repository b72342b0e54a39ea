"""The record layout has one source (chalicelib/index/layout.py): the Lua constants are
generated from it, and the index scripts spell offsets, statuses and codes by name; so do
the other packages' scripts (stores/lua, storage/lua) with the codes they share."""

import re
from pathlib import Path

import pytest

from chalicelib.index import layout
from chalicelib.index.layout import (
    ADOPTER,
    HEADER,
    LOCATION,
    PACKED_GROUP,
    SESSION_ENTRY,
    VICTIM,
    ClaimOutcome,
    FinishStatus,
    StartRefusal,
    lua_constants,
)

LUA_DIR = Path(layout.__file__).with_name("lua")
#: Every directory of Lua scripts the service loads.
SCRIPT_DIRS = (LUA_DIR, LUA_DIR.parents[1] / "stores" / "lua", LUA_DIR.parents[1] / "storage" / "lua")


def _generated() -> dict[str, object]:
    """The generated chunk's constants: name -> int or str."""
    out: dict[str, object] = {}
    for line in lua_constants().splitlines():
        match = re.fullmatch(r"local (.+?) = (.+)", line)
        if not match:
            assert line.startswith("--"), line
            continue
        values = re.findall(r"'[^']*'|-?\d+", match.group(2))
        names = [n.strip() for n in match.group(1).split(",")]
        assert len(names) == len(values), line
        for name, value in zip(names, values, strict=True):
            assert name not in out, f"{name} generated twice"
            out[name] = value[1:-1] if value.startswith("'") else int(value)
    return out


def test_the_encoding_is_the_stored_one():
    # Records already stored must stay readable and a block's memory must not grow.
    assert (HEADER.format, HEADER.size) == (">Bc8HI4BI6B", 23)
    assert (LOCATION.format, LOCATION.size) == (">BBBI5I6H", 16)
    assert (VICTIM.format, VICTIM.size) == (">c8I5BBI6H", 23)
    assert (SESSION_ENTRY.size, PACKED_GROUP.size, ADOPTER.size) == (13, 7, 5)


def test_wide_fields_round_trip():
    values = (3, 7, 250, 2**40 - 3, 2**48 - 5, 65534)
    raw = LOCATION.pack(*values)
    assert len(raw) == LOCATION.size and LOCATION.unpack_from(b"x" + raw, 1) == values
    assert raw[LOCATION.offset("location_id") : LOCATION.offset("group_id")] == (2**40 - 3).to_bytes(5, "big")


def test_read_lua_refreshes_access_time_and_lfu_in_one_splice():
    # lua/read.lua replaces the access time and the LFU counter that follows it at once.
    assert HEADER.offset("lfu") == HEADER.offset("last_access_s") + HEADER.fields["last_access_s"].size


def test_generated_constants_match_the_layout():
    lua = _generated()
    for prefix, struct_ in (
        ("HDR", HEADER),
        ("LOC", LOCATION),
        ("VICTIM", VICTIM),
        ("ADOPTER", ADOPTER),
        ("SESSION_ENTRY", SESSION_ENTRY),
        ("PACKED_GROUP", PACKED_GROUP),
    ):
        assert struct_.lua_name == prefix
        assert (lua[f"{prefix}_FMT"], lua[f"{prefix}_LEN"]) == (struct_.format, struct_.size)
    for field in HEADER.fields.values():  # positions in a record, 1-based as Lua counts
        assert lua[f"H_{field.name.upper()}"] == field.offset + 1
        assert lua[f"H_{field.name.upper()}_FMT"] == ">" + field.code
    for field in LOCATION.fields.values():  # offsets from a location's position
        assert lua[f"L_{field.name.upper()}"] == field.offset
    assert (lua["WRITING"], lua["SERVING"], lua["DELETING"]) == (1, 2, 3)
    assert (lua["HAS_PARENT"], lua["ADOPTED"], lua["UNLINKED"]) == (1, 2, 4)
    assert (lua["MODE_PREFIX"], lua["MODE_RAW"], lua["MARK_ANY"]) == (1, 4, "A")
    assert {lua[f"FINISH_{s.name}"] for s in FinishStatus} == {-1, -2, -3, -4, 1}
    assert [lua[f"REFUSED_{r.name}"] for r in StartRefusal] == [r.value for r in StartRefusal]
    assert [lua[f"CLAIM_{c.name}"] for c in ClaimOutcome] == [c.value for c in ClaimOutcome]
    assert lua["MAX_CHILDREN"] == 65535


def _code(text: str) -> list[tuple[int, str]]:
    """(line number, line without its comment) of a Lua text."""
    return [(n, line.split("--", 1)[0]) for n, line in enumerate(text.splitlines(), 1)]


_RECORD = r"(?:rec|crec|prec)"
_NAMED_STRINGS = "|".join(re.escape(v.value) for e in (StartRefusal, ClaimOutcome) for v in e)
#: Spellings a name exists for (docs/record-layout.md), each with an example of what it catches.
LITERALS = {
    "record bytes at a numeric position": (
        rf"\b(?:string\.)?(?:byte|sub)\({_RECORD}\s*,\s*(?!1\s*[,)])\d",
        "local lfu = byte(rec, 16)",
    ),
    "a record field read with a literal format": (
        rf"struct\.unpack\('[^']*',\s*{_RECORD}\b",
        "local children = struct.unpack('>H', rec, 10)",
    ),
    "a layout format spelled out": (
        r"'>(?:Bc8HI4BI6B|BBBI5I6H|c8I5BBI6H|BI6|c8I5|Bc8)'",
        "local VICTIM_FMT = '>c8I5BBI6H'",
    ),
    "an offset past the header": (r"HDR_LEN\s*[-+]\s*\d", "local seq = struct.unpack(fmt, rec, HDR_LEN + 4)"),
    "a status or flag byte compared with a number": (
        rf"\bbyte\({_RECORD}[^)]*\)\s*(?:[=~]=|%)\s*\d",
        "if byte(rec, first) == 2 then",
    ),
    "flag arithmetic": (r"\bflags\s*%\s*\d|string\.char\(\d", "if flags % 4 < 2 then"),
    "a location status compared with a number": (r"\b(?:st|status)\s*[=~]=\s*\d", "if st == 1 then"),
    "a read mode as a number": (r"\bmode\s*[=~]=\s*\d", "if mode == 4 then"),
    "a mark scope as a letter": (r"\bwhich\s*[=~]=\s*'", "local any = which == 'A'"),
    "a reply code as a number": (r"return\s*\{\s*-?\d|\bstatus\s*=\s*-?\d", "return {-1, ''}"),
    "a reply reason spelled out": (rf"return\s*\{{[^}}]*'(?:{_NAMED_STRINGS})'", "return {0, 'gone'}"),
    "a code given as a number": (
        r"^\s*local\s+[A-Z][A-Z0-9_]*(?:\s*,\s*[A-Z][A-Z0-9_]*)*\s*=\s*-?\d",
        "local OK, NODE_NOT_REGISTERED = 1, 10",
    ),
}
#: (script, spelling) -> why the script keeps it for now.
KNOWN_EXCEPTIONS = {
    # Its codes are generated (reporters.lua_codes); FIRST is the first item's ARGV position.
    ("er_report.lua", "a code given as a number"): "local FIRST = 8: an ARGV position, not a code",
    # Not a record flag: msgpack's header of a one-location record.
    ("er_prelude.lua", "flag arithmetic"): "string.char(0x92): a msgpack header byte, not a flag",
    ("er_host_state.lua", "flag arithmetic"): "string.char(0x90 + n) ...: msgpack array headers, not flags",
}


@pytest.mark.parametrize("what", LITERALS)
def test_the_check_catches_the_literal_spelling(what):
    pattern, example = LITERALS[what]
    assert re.search(pattern, example)


def _literals(path: Path) -> list[str]:
    """The spellings of ``LITERALS`` found in a script, known exceptions left out."""
    return [
        f"{path.name}:{n}: {what}: {line.strip()}"
        for n, line in _code(path.read_text())
        for what, (pattern, _) in LITERALS.items()
        if re.search(pattern, line) and (path.name, what) not in KNOWN_EXCEPTIONS
    ]


@pytest.mark.parametrize(
    "script", sorted(str(p.relative_to(LUA_DIR.parents[1])) for d in SCRIPT_DIRS for p in d.glob("*.lua"))
)
def test_scripts_name_offsets_statuses_and_codes(script):
    found = _literals(LUA_DIR.parents[1] / script)
    assert not found, "\n".join(found)


def test_every_known_exception_still_holds_its_spelling():
    # An exception fixed in its script goes from the list (the check then covers it).
    scripts = {p.name: p for d in SCRIPT_DIRS for p in d.glob("*.lua")}
    for script, what in KNOWN_EXCEPTIONS:
        assert any(re.search(LITERALS[what][0], line) for _, line in _code(scripts[script].read_text())), script
