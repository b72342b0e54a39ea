"""lua/start.lua's KEYS, ARGVs and reply have one definition (chalicelib/index/scripts.py):
the script names every position through the generated tables, and the Python caller
builds its lists through the same ones."""

import re

import pytest

from chalicelib.index.scripts import (
    LUA_DIR,
    START_ARGS,
    START_CANDIDATE_ARGS,
    START_GRANT,
    START_KEYS,
    START_REFUSAL,
    START_TAIL_ARGS,
    start_constants,
)

TABLES = {
    t.lua_name: t for t in (START_KEYS, START_ARGS, START_CANDIDATE_ARGS, START_TAIL_ARGS, START_GRANT, START_REFUSAL)
}
#: KEYS[...] or ARGV[...] whose position holds a number (``ARGV[29 + 6 * n]``, ``KEYS[8]``).
LITERAL_POSITION = re.compile(r"\b(?:KEYS|ARGV)\[[^\]]*?\b\d")
#: A name looked up in one of the generated tables (``ARG.now_ms``).
TABLE_NAME = re.compile(r"\b(" + "|".join(TABLES) + r")\.(\w+)")


def _code(text: str) -> list[tuple[int, str]]:
    return [(n, line.split("--", 1)[0]) for n, line in enumerate(text.splitlines(), 1)]


def problems(text: str) -> list[str]:
    """Positions a script spells as numbers, and table names the tables do not define."""
    found = []
    for n, line in _code(text):
        if LITERAL_POSITION.search(line):
            found.append(f"{n}: a literal KEYS/ARGV position: {line.strip()}")
        for table, name in TABLE_NAME.findall(line):
            if name not in TABLES[table].names:
                found.append(f"{n}: {table}.{name} is not in chalicelib/index/scripts.py")
    return found


@pytest.mark.parametrize(
    "example",
    [
        "local caller = ARGV[31 + 6 * tonumber(ARGV[27])]",
        "redis.call('HGET', KEYS[9], caller)",
        "local a = ARGV[ARG.candidate_count + 6]",
        "local now = tonumber(ARGV[ARG.now_msec])",
        "out[GRANT.first_id] = base",
    ],
)
def test_the_check_catches(example):
    assert problems(example)


def test_start_lua_names_every_position():
    text = (LUA_DIR / "start.lua").read_text()
    assert "ARGV[ARG.now_ms]" in text  # the check reads the script's real spelling
    assert not problems(text), "\n".join(problems(text))


def test_the_generated_tables_are_the_python_ones():
    lua = start_constants()
    for table in TABLES.values():
        entries = re.search(rf"^local {table.lua_name} = \{{(.*)\}}$", lua, re.M)
        assert entries, table.lua_name
        assert dict(re.findall(r"(\w+) = (\d+)", entries.group(1))) == {
            name: str(table.at(name) + 1) for name in table.names
        }
    assert f"local CAND_ARGS = {len(START_CANDIDATE_ARGS.names)}" in lua


def test_the_caller_must_give_every_argument_once():
    given = {name: i for i, name in enumerate(START_TAIL_ARGS.names)}
    assert START_TAIL_ARGS.values(given) == list(range(len(START_TAIL_ARGS.names)))
    with pytest.raises(ValueError, match="missing \\['caller'\\]"):
        START_TAIL_ARGS.values({k: v for k, v in given.items() if k != "caller"})
    with pytest.raises(ValueError, match="unknown \\['callers'\\]"):
        START_TAIL_ARGS.values({**given, "callers": 1})
