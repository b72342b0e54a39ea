"""getHostCacheState's walk: each host's prefix of a prompt's keys, over the keys' slot
bitmaps (``T:er:bits``, lua/er_prelude.lua) and the visible slots of the live reporters.

Pure: ``ReporterStore.host_prefixes`` reads the slots and the bitmaps in one transaction
and hands them here. The walk used to run inside the Lua script; reading each key's
bitmap through Lua's bridge to Valkey cost Valkey twice what a client's HMGET of the same
fields costs (docs/api-v2.md, "getHostCacheState at upstream's sizes").

A bitmap is a ``bytes`` value with slot ``s`` at bit ``s % 8`` of byte ``s // 8`` (trailing
zero bytes trimmed), or ``None`` when no slot holds the key. Here it is read as a
little-endian integer, so slot ``s`` is bit ``s``. The keys' bitmaps come as runs
``(bitmap, how many keys in a row have it)`` (``resp.runs``): consecutive blocks of a prompt
mostly share one, and hosts are looked at only where it changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: What a host holds of a key: nothing, the full-attention specs only (Mamba), or all it needs.
NONE, FULL_ONLY, ALL = 0, 1, 2


def _bits(bitmap: bytes | None) -> int:
    return int.from_bytes(bitmap, "little") if bitmap else 0


class HostWalk:
    """The visible slots of one call, ready to walk any number of bitmaps.

    ``slots``: (host, slot number, signature ``[medium, spec name, ...]``) per visible slot
    of a live reporter (lua/er_host_state.lua). ``mediums``: the media to count (empty: all).
    ``mamba``: (full-attention spec names, state spec names) for QT_PREFIX_MATCH_WITH_MAMBA:
    a host's prefix then ends on a key where it holds every one of both; it is cut where
    it lacks a full-attention spec. ``eagle_pop``: each prefix one key shorter."""

    def __init__(
        self,
        slots: Iterable[tuple[str, int, Sequence[str]]],
        mediums: Sequence[str] = (),
        mamba: tuple[Sequence[str], Sequence[str]] | None = None,
        eagle_pop: bool = False,
    ) -> None:
        self._mamba = mamba is not None
        self._full, self._states = (frozenset(mamba[0]), frozenset(mamba[1])) if mamba else (frozenset(), frozenset())
        self._eagle = eagle_pop
        media = frozenset(mediums)
        #: host -> its visible slots as (bit, spec names, level those names give alone)
        self._slots: dict[str, list[tuple[int, frozenset[str], int]]] = {}
        #: slot number -> its host, for the visible slots
        self._slot_host: dict[int, str] = {}
        #: host -> the bits of all its visible slots (a plain prefix needs only these)
        self._masks: dict[str, int] = {}
        known: dict[tuple[str, ...], tuple[frozenset[str], int]] = {}  # a few signatures a call
        for host, slot, signature in slots:
            if media and signature[0] not in media:
                continue
            key = tuple(signature)
            if key not in known:
                names = frozenset(signature[1:])
                known[key] = (names, self._level_of(names))
            names, level = known[key]
            self._slots.setdefault(host, []).append((1 << slot, names, level))
            self._slot_host[slot] = host
            self._masks[host] = self._masks.get(host, 0) | 1 << slot

    def _level_of(self, names: frozenset[str]) -> int:
        """What a key's locations with spec ``names`` give a host (a plain prefix: any)."""
        if not self._mamba:
            return ALL
        if not self._full <= names:
            return NONE
        return ALL if self._states <= names else FULL_ONLY

    def _holds(self, bits: int, host: str) -> int:
        """What ``host`` holds of a key with bitmap ``bits``: across its slots the spec names
        add up (a host may report one key through several signatures); one slot alone is its
        level."""
        if not self._mamba:
            return ALL if bits & self._masks[host] else NONE
        held = [(names, level) for bit, names, level in self._slots[host] if bits & bit]
        if not held:
            return NONE
        if any(level == ALL for _, level in held):
            return ALL
        if len(held) == 1:
            return held[0][1]
        return self._level_of(frozenset().union(*(names for names, _ in held)))

    def prefixes(self, runs: Sequence[tuple[bytes | None, int]], total: int) -> dict[str, int] | None:
        """host -> its prefix (hosts with none left out) of a prompt of ``total`` keys whose
        first keys' bitmaps are ``runs``; ``None`` when they are not enough to know (some
        host still holds the last key given): a first part decides the answer exactly when
        every host's prefix ends inside it, whatever the later keys hold."""
        if not self._slots or not runs:
            return {}
        mamba, eagle = self._mamba, self._eagle
        first = _bits(runs[0][0])
        # The first key names the candidates: the hosts holding it, with their levels.
        levels = {host: level for host in self._slots if (level := self._holds(first, host))}
        # Mamba: per host, the last and the one-before-last key with all its specs (its
        # prefix ends on one of them).
        last_ok = dict.fromkeys(levels, 0)
        prev_ok = dict.fromkeys(levels, 0)
        result: dict[str, int] = {}

        def finish(host: str, prefix: int) -> None:
            del levels[host]
            length = max(prefix - 1, 0) if eagle else prefix
            if mamba:
                length = last_ok[host] if last_ok[host] <= length else prev_ok[host]
            if length > 0:
                result[host] = length

        def close_run(start: int, last: int) -> None:
            """Keys ``start``..``last`` shared one bitmap: the hosts holding all there get them."""
            for host, level in levels.items():
                if level == ALL:
                    prev_ok[host] = last - 1 if last > start else last_ok[host]
                    last_ok[host] = last

        # Only the hosts owning a slot whose bit changed can change where the bitmap
        # changes (_holds reads a host's own slots): a plain prefix loses a host where one of
        # its bits is cleared; Mamba's level moves either way (a state spec's slot set lifts
        # 1 to 2).
        slot_host = self._slot_host
        if not levels:
            return result
        start, run_start, prev = 1, 1, first
        for bitmap, count in runs:
            current = _bits(bitmap)
            if start > 1:  # a change at ``start``
                if mamba:
                    close_run(run_start, start - 1)
                changed = prev & ~current if not mamba else prev ^ current
                while changed:
                    low = changed & -changed
                    host = slot_host.get(low.bit_length() - 1)
                    if host is not None and host in levels:
                        level = self._holds(current, host)
                        if level == NONE:
                            finish(host, start - 1)
                        else:
                            levels[host] = level
                    changed ^= low
                if not levels:
                    return result
            run_start, prev = start, current
            start += count
        if start - 1 < total:  # the keys given end before the prompt's
            return None
        if mamba:
            close_run(run_start, total)
        for host in list(levels):
            finish(host, total)
        return result
