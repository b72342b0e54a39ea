"""The index scripts as Valkey runs them, and lua/start.lua's arguments and reply by name.

Every script is loaded as the layout's constants (``layout.lua_constants``) and the
prelude's helpers it uses (``used_definitions``: Lua runs every definition again on each
call), then the script. start.lua's KEYS, ARGVs and reply have one definition too, here: the
script gets each table as a Lua table of name -> 1-based position (``ARG.now_ms``), and
``TagIndex.grant`` builds the lists and reads the reply through the same tables, so the
two cannot drift (tests/unit/index/test_start_args.py checks the script uses no other).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from ..valkey import lua_source
from .layout import lua_constants

LUA_DIR = Path(__file__).with_name("lua")

T = TypeVar("T")


class Positions:
    """The named positions of a script's argument list or reply: Lua reads
    ``<lua_name>.<name>`` (1-based), Python ``at(name)`` (0-based)."""

    def __init__(self, lua_name: str, names: tuple[str, ...]) -> None:
        self.lua_name = lua_name
        self.names = names
        self._at = {name: i for i, name in enumerate(names)}

    def at(self, name: str) -> int:
        """The 0-based position of ``name`` (a Python index into the list)."""
        return self._at[name]

    def values(self, given: Mapping[str, T]) -> list[T]:
        """``given`` in this table's order; every name given exactly once."""
        if len(given) == len(self.names):
            try:
                return [given[name] for name in self.names]
            except KeyError:
                pass  # one missing, one unknown: named below
        missing, extra = sorted(self._at.keys() - given.keys()), sorted(given.keys() - self._at.keys())
        raise ValueError(f"{self.lua_name}: missing {missing}, unknown {extra}")

    def lua(self) -> str:
        """The table as one Lua local."""
        return f"local {self.lua_name} = {{" + ", ".join(f"{n} = {i}" for i, n in enumerate(self.names, 1)) + "}"


#: lua/start.lua's KEYS (docs in the script).
START_KEYS = Positions(
    "KEY",
    ("meta", "usage", "storages", "groups", "deadlines", "session", "occupied", "pending", "caller_sessions"),
)
#: Its fixed ARGVs; then ``candidate_count`` times START_CANDIDATE_ARGS, then START_TAIL_ARGS.
START_ARGS = Positions(
    "ARG",
    (
        "keys",
        "now_ms",
        "session_id",
        "deadline_ms",
        "storage_name",
        "storage_type",
        "pack_count",
        "sizes",
        "spec_groups",
        "explicit_groups",
        "group_capacity",
        "group_bytes",
        "type_capacity",
        "group_type_bytes",
        "max_keys",
        "bucket_prefix",
        "records_per_bucket",
        "instance_id",
        "incarnation",
        "max_sessions",
        "instance_capacity",
        "min_replicas",
        "stale",
        "covers",
        "spec_group_count",
        "by_location",
        "candidate_count",
    ),
)
#: The ARGVs of each further candidate, from its base (``ARG.candidate_count`` + CAND_ARGS per earlier one).
START_CANDIDATE_ARGS = Positions(
    "CAND", ("name", "storage_type", "pack_count", "type_capacity", "group_type_bytes", "by_location")
)
#: The ARGVs after the candidates, from ``ARG.candidate_count`` + CAND_ARGS x the count.
START_TAIL_ARGS = Positions("TAIL", ("partial", "pending_deadline", "caller_cap", "caller", "positions"))
#: A grant's reply; (storage type, bytes added) pairs follow from ``by_type`` on.
START_GRANT = Positions(
    "GRANT",
    (
        "result",
        "first_location_id",
        "written_to",
        "storage_indexes",
        "new_bytes",
        "victims",
        "created",
        "charge",
        "marks",
        "by_type",
    ),
)
#: A refusal's reply (no shortfall for REFUSED_GONE and REFUSED_STORAGES).
START_REFUSAL = Positions("REFUSAL", ("result", "reason", "shortfall"))


def start_constants() -> str:
    """start.lua's tables, as Lua locals."""
    tables = (START_KEYS, START_ARGS, START_CANDIDATE_ARGS, START_TAIL_ARGS, START_GRANT, START_REFUSAL)
    lines = ["-- Generated from chalicelib/index/scripts.py when the script is loaded: do not edit."]
    lines += [table.lua() for table in tables]
    lines.append(f"local CAND_ARGS = {len(START_CANDIDATE_ARGS.names)}")
    return "\n".join(lines) + "\n"


#: A top-level definition of the constants or the prelude: ``local function f`` or ``local a, b =``.
_DEFINITION = re.compile(r"local (?:function (\w+)|([\w, ]+?) =)")
_NAME = re.compile(r"[A-Za-z_]\w*")


def used_definitions(shared: str, body: str) -> str:
    """The top-level definitions of ``shared`` (Lua locals) that ``body`` uses, directly or
    through one another, in their order, each with the comment above it.

    Lua defines every local again on each call of a script, so a script carries only what
    it needs. Conservative: a name counts as used wherever it appears as a word outside a
    whole-line comment (strings and trailing comments included), and a local is reachable
    only by its name, so nothing a script calls can be left out. A definition's body sees
    only the locals defined before it (a later one would be a global), so one walk from the
    end finds every dependency."""
    chunks: list[tuple[set[str], list[str]]] = []
    comment: list[str] = []
    for line in shared.splitlines(keepends=True):
        found = _DEFINITION.match(line)
        if found:
            names = {found[1]} if found[1] else {n.strip() for n in found[2].split(",")}
            chunks.append((names, comment + [line]))
            comment = []
        elif line.startswith("--"):
            comment.append(line)
        elif chunks:  # the rest of the definition above (its body, its `end`, a comment in it)
            chunks[-1][1].extend([*comment, line])
            comment = []

    def words(text: str) -> set[str]:
        return {w for line in text.splitlines() if not line.lstrip().startswith("--") for w in _NAME.findall(line)}

    needed = words(body)
    kept: list[str] = []
    for names, lines in reversed(chunks):
        if names & needed:
            text = "".join(lines)
            kept.append(text)
            needed |= words(text)
    return "".join(reversed(kept))


def load_script(name: str) -> str:
    """An index script: of the layout's constants (start.lua's tables too) and the prelude,
    the definitions it uses (``used_definitions``), then the script."""
    shared = lua_constants() + (start_constants() if name == "start" else "") + lua_source(LUA_DIR, "prelude")
    body = lua_source(LUA_DIR, name)
    return used_definitions(shared, body) + "\n" + body
