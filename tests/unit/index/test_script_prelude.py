"""Each index script carries only the constants and prelude helpers it uses
(scripts.used_definitions): nothing it calls is left out, nothing else is kept."""

import re

import pytest

from chalicelib.index.layout import lua_constants
from chalicelib.index.scripts import LUA_DIR, load_script, start_constants, used_definitions
from chalicelib.valkey import lua_source

SCRIPTS = sorted(p.stem for p in LUA_DIR.glob("*.lua") if p.stem != "prelude")
SHARED = lua_constants() + start_constants() + lua_source(LUA_DIR, "prelude")
DEFINED = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)", re.M)


def defined(text: str) -> set[str]:
    return {n.strip() for m in DEFINED.finditer(text) for n in (m[1] or m[2]).split(",")}


def words(text: str) -> set[str]:
    return {w for line in text.splitlines() if not line.lstrip().startswith("--") for w in re.findall(r"\w+", line)}


def test_helpers_come_with_what_they_use_in_order_and_with_their_comment():
    shared = (
        "local A, B = 1, 2\n"
        "-- twice a\n"
        "local function twice(x)\n"
        "-- a comment inside, at column 0\n"
        "  return x * A\n"
        "end\n"
        "local function unused() return B end\n"
        "local function quad(x) return twice(twice(x)) end\n"
    )
    assert used_definitions(shared, "return quad(3)") == (
        "local A, B = 1, 2\n"
        "-- twice a\n"
        "local function twice(x)\n"
        "-- a comment inside, at column 0\n"
        "  return x * A\n"
        "end\n"
        "local function quad(x) return twice(twice(x)) end\n"
    )
    assert used_definitions(shared, "-- quad(3) in a comment only\nreturn 1") == ""


def test_a_body_naming_every_definition_keeps_every_line():
    kept = used_definitions(SHARED, " ".join(defined(SHARED))).splitlines()
    assert [line for line in SHARED.splitlines() if line.strip()] == [line for line in kept if line.strip()]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_defines_each_shared_name_it_or_its_helpers_use(name):
    body = lua_source(LUA_DIR, name)
    loaded = load_script(name)
    assert loaded.endswith(body)
    selection = loaded[: -len(body)]
    assert words(loaded) & defined(SHARED) <= defined(selection)


def test_the_touch_script_leaves_the_write_helpers_out():
    selection = load_script("touch")[: -len(lua_source(LUA_DIR, "touch"))]
    assert {"bucket_of", "bucket_count", "key_hash", "level_size", "level_sizes"} <= defined(selection)
    assert not {"grow_buckets", "deleting_charge", "unlink_from_parent", "release_bytes"} & defined(selection)
    assert len(selection) < len(SHARED) / 2
