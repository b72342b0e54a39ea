"""Child counts when a parent block goes away while its child lives, and is written again.

A record's child count is the number of live records linked to it (lua/start.lua, "Child
counts"): a child is linked to the parent record that was live when it was created, or to
the parent record that adopted it (a parent written again with the child as the next key
of the request). A child whose parent record went away is linked to nothing: its drop
must not take a count from the parent's next record.
"""

import random

import pytest

from chalicelib.index import Status
from chalicelib.index.types import MODE_RAW, StartRequest

SIZES = [100]


def start(index, layout, keys, sid):
    req = StartRequest(
        session_id=sid,
        deadline_ms=int(index.clock.now() * 1000) + 30_000,
        storage_name="s3",
        storage_type="ST_S3",
        pack_count=0,
        sizes=SIZES,
        spec_groups=[0] * len(keys),
    )
    return index.start(layout, keys, req)


def finish(index, layout, sid, success=None):
    session = index.session(layout, sid)
    ok = [True] * len(session.entries) if success is None else list(success)
    victims = index.finish(layout, sid, session, ok, SIZES).victims
    index.drop(layout, victims, SIZES)


def write(index, layout, keys, sid, success=None):
    """startWriteCache then finishWriteCache (``success``: per new key, default all)."""
    start(index, layout, keys, sid)
    finish(index, layout, sid, success)


def remove(index, layout, keys):
    """removeCache: mark every location DELETING and drop it."""
    index.drop(layout, index.mark_deleting(layout, list(keys), SIZES), SIZES)


def children(index, layout, keys):
    records = index.read(layout, list(keys), MODE_RAW)
    return {k: (None if r is None else r.children) for k, r in zip(keys, records, strict=True)}


P, C, D = 10, 11, 12


def test_parent_rewritten_after_a_failed_write_counts_its_live_child(index, layout):
    """finish fails P and keeps C: writing [P, C] again gives P a record that counts C,
    and dropping C then takes that count back."""
    write(index, layout, [P, C], "a", [False, True])
    assert children(index, layout, [P, C]) == {P: None, C: 0}
    assert start(index, layout, [P, C], "b").new_flags == [True, False]
    finish(index, layout, "b")
    assert children(index, layout, [P, C]) == {P: 1, C: 0}
    remove(index, layout, [C])
    assert children(index, layout, [P, C]) == {P: 0, C: None}


def test_old_child_drop_leaves_the_rewritten_parent_count_alone(index, layout):
    """P has children C and D; P is removed and written again with D: it counts D only
    (C's parent record is gone), and dropping C does not take D's count."""
    write(index, layout, [P, C], "a")
    write(index, layout, [P, D], "b")
    assert children(index, layout, [P]) == {P: 2}
    remove(index, layout, [P])
    write(index, layout, [P, D], "c")
    assert children(index, layout, [P, C, D]) == {P: 1, C: 0, D: 0}
    remove(index, layout, [C])
    assert children(index, layout, [P, D]) == {P: 1, D: 0}
    remove(index, layout, [D])
    assert children(index, layout, [P]) == {P: 0}


def test_child_of_a_gone_parent_record_is_not_taken_off_a_new_child_count(index, layout):
    """P removed while C lives; P written again with a new child D: C's drop leaves P at 1."""
    write(index, layout, [P, C], "a")
    remove(index, layout, [P])
    write(index, layout, [P, D], "b")
    assert children(index, layout, [P, C, D]) == {P: 1, C: 0, D: 0}
    remove(index, layout, [C])
    assert children(index, layout, [P, D]) == {P: 1, D: 0}


def test_adopted_child_keeps_its_link_across_rewrites_of_its_parent(index, layout):
    """C adopted by a rewritten P; P goes again and is written a third time without C:
    the third record does not count C, and C's drop leaves it alone."""
    write(index, layout, [P, C], "a", [False, True])
    write(index, layout, [P, C], "b")
    assert children(index, layout, [P]) == {P: 1}
    remove(index, layout, [P])
    write(index, layout, [P, D], "c")
    assert children(index, layout, [P]) == {P: 1}
    remove(index, layout, [C])
    assert children(index, layout, [P, D]) == {P: 1, D: 0}


def test_a_later_parent_record_is_not_mistaken_for_the_adopter(index, layout):
    """C adopted by P's second record; that record goes, and P's third record gets a
    location id 64 higher (one that a 6-bit tag of the adopter would confuse): C's drop
    must leave the third record's count alone."""
    write(index, layout, [P, C], "a", [False, True])
    write(index, layout, [P, C], "b")  # P's record adopts C
    adopter = index.read(layout, [P], MODE_RAW)[0].locations[0].location_id
    remove(index, layout, [P])
    filler = list(range(1000, 1000 + 63))
    write(index, layout, filler, "filler")
    write(index, layout, [P, D], "c")
    assert index.read(layout, [P], MODE_RAW)[0].locations[0].location_id == adopter + 64
    assert children(index, layout, [P, D]) == {P: 1, D: 0}
    remove(index, layout, [C])
    assert children(index, layout, [P, D]) == {P: 1, D: 0}


def test_a_child_turning_deleting_stops_counting_at_once(index, layout):
    """A child marked DELETING (not dropped yet) no longer counts: its parent is a leaf for
    reclaim at once, its drop does not take it off a second time, and a parent written
    again does not adopt it."""
    write(index, layout, [P, C], "a")
    victims = index.mark_deleting(layout, [C], SIZES)
    assert children(index, layout, [P]) == {P: 0}
    remove(index, layout, [P])
    write(index, layout, [P, C], "b")
    assert children(index, layout, [P]) == {P: 0}
    index.drop(layout, victims, SIZES)
    assert children(index, layout, [P, C]) == {P: 0, C: None}


def test_a_failed_block_stops_counting_when_its_session_finishes(index, layout):
    write(index, layout, [P, C, D], "a", [True, True, False])
    assert children(index, layout, [P, C, D]) == {P: 1, C: 0, D: None}


def _path(node):
    """Keys from the root of a binary tree (heap numbering) down to ``node``."""
    out = []
    while node >= 1:
        out.append(node)
        node //= 2
    return out[::-1]


@pytest.mark.parametrize("seed", range(4))
def test_child_counts_match_links_under_random_writes_and_removals(index, layout, seed):
    """Random writes of prefix chains (some blocks failing), removals and late drops: after
    every step each record counts exactly the live records linked to it (model below), and
    never more than the live records that name it their parent."""
    rng = random.Random(seed)
    nodes = range(1, 32)
    live = {}  # key -> (record sequence number, link: (parent key, parent seq) or None)
    open_sessions, late_victims = [], []

    def sync():
        """Forget records that are gone; return {key: record} of the live ones."""
        recs = dict(zip(nodes, index.read(layout, list(nodes), MODE_RAW), strict=True))
        for key in list(live):
            if recs[key] is None:
                del live[key]
        return {k: r for k, r in recs.items() if r is not None}

    for step in range(250):
        op = rng.random()
        if op < 0.45:
            keys = _path(rng.choice(nodes))
            if rng.random() < 0.15:
                keys = keys[rng.randrange(len(keys)) :]  # a request not starting at the root
            before = set(live)
            sid = f"s{step}"
            out = start(index, layout, keys, sid)
            recs = dict(zip(keys, index.read(layout, keys, MODE_RAW), strict=True))
            for i, (key, new) in enumerate(zip(keys, out.new_flags, strict=True)):
                if new:
                    link = (keys[i - 1], live[keys[i - 1]][0]) if i > 0 else None
                    live[key] = (recs[key].locations[0].location_id, link)
                    nxt = keys[i + 1] if i + 1 < len(keys) else None
                    if nxt in before and recs[nxt].parent == key and recs[nxt].locations[0].status != Status.DELETING:
                        live[nxt] = (live[nxt][0], (key, live[key][0]))
            if any(out.new_flags):  # a start writing no key opens no session
                open_sessions.append(sid)
        if open_sessions and (op >= 0.45 or rng.random() < 0.5):
            sid = open_sessions.pop(rng.randrange(len(open_sessions)))
            n = len(index.session(layout, sid).entries)
            finish(index, layout, sid, [rng.random() < 0.8 for _ in range(n)])
        if op >= 0.75:
            victims = index.mark_deleting(layout, rng.sample(list(nodes), 3), SIZES)
            if rng.random() < 0.3:
                late_victims.extend(victims)
            else:
                index.drop(layout, victims, SIZES)
        if late_victims and rng.random() < 0.2:
            index.drop(layout, late_victims, SIZES)
            late_victims = []
        recs = sync()
        for key, rec in recs.items():
            # A DELETING record no longer counts (unlinked when it turned DELETING).
            linked = sum(
                1
                for k, (_, link) in live.items()
                if link == (key, live[key][0]) and recs[k].locations[0].status != Status.DELETING
            )
            named = sum(1 for r in recs.values() if r.parent == key)
            assert rec.children == linked, (step, key)
            assert rec.children <= named, (step, key)
