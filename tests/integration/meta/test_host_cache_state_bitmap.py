"""The reporter bitmap behind getHostCacheState (stores/reporters.py, lua/er_*.lua) on real
Valkey: after any sequence of reports, liveness expiries and cleanups, the prefixes and
visible locations equal those of a reference model of UPSTREAM_V2 §2.1/§2.2 (specs carrying
their own generation, visibility by retired set and strict mode), and every bit stands for
exactly one record location."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import msgpack
import pytest

from chalicelib.stores.reporters import (
    Liveness,
    ReporterStore,
    add_event,
    delete_event,
    heartbeat_event,
    host_down_event,
    new_token,
    pack_strings,
    register_event,
    snapshot_event,
)

LIVENESS = Liveness(heartbeat_timeout_ms=1000, cleanup_grace_ms=2000, snapshot_min_interval_ms=0)
TIMEOUTS = {"l1p5": 1000, "l2": 1000}
RIDS = ["l1p5#10.0.0.1:1", "l2#10.0.0.1:1", "l1p5#10.0.0.2:1", "l2#10.0.0.3:1"]
MEDIA = ["gpu", "mem"]
NAMES = ["full_0", "linear_0"]
KEYS = list(range(1, 13))


@dataclass
class RefReporter:
    reg: bool
    hb: int
    gen: str = ""
    com: str = ""
    strict: bool = False
    ret: set[str] = field(default_factory=set)

    def retire(self) -> None:
        if self.gen:
            self.ret.add(self.gen)
        self.gen, self.com, self.strict = "", "", False


class Reference:
    """UPSTREAM_V2 §2.1 as written: each spec carries the generation it was written in."""

    def __init__(self) -> None:
        self.reporters: dict[str, RefReporter] = {}
        # (rid, key) -> medium -> name -> (uri, generation), in insertion order
        self.locations: dict[tuple[str, int], dict[str, dict[str, tuple[str, str]]]] = {}

    def report(self, rid: str, events: list[tuple], now: int, token: str) -> None:
        st = self.reporters.get(rid)
        if st and st.reg and now - st.hb > LIVENESS.heartbeat_timeout_ms + LIVENESS.cleanup_grace_ms:
            st.retire()
            st.reg = False
        for op, *args in events:
            if op == "r":
                if st is None:
                    st = self.reporters[rid] = RefReporter(True, now)
                st.reg, st.hb = True, now
                continue
            if op == "x":
                if st is None:
                    st = self.reporters[rid] = RefReporter(False, now)
                elif st.reg:
                    st.retire()
                    st.reg = False
                continue
            if st is None:
                st = self.reporters[rid] = RefReporter(True, now)
            if not st.reg:
                continue
            if op == "h":
                st.hb = now
            elif op == "a":
                st.gen = st.gen or token
                key, medium, specs = args
                loc = self.locations.setdefault((rid, key), {}).setdefault(medium, {})
                for name, uri in specs:
                    loc[name] = (uri, st.gen)
            elif op == "d":
                st.gen = st.gen or token
                key, medium, names = args
                loc = self.locations.get((rid, key), {}).get(medium)
                if loc is not None:
                    for name in names:
                        loc.pop(name, None)
                    if not loc:
                        del self.locations[(rid, key)][medium]
            elif op == "s":
                st.retire()
                for key, medium, specs in args[0]:
                    self.locations.setdefault((rid, key), {})[medium] = {name: (uri, token) for name, uri in specs}
                st.gen, st.com, st.strict = token, token, True

    def cleanup(self, rid: str, tokens: set[str]) -> None:
        for (owner, _), media in self.locations.items():
            if owner == rid:
                for medium in list(media):
                    media[medium] = {n: s for n, s in media[medium].items() if s[1] not in tokens}
                    if not media[medium]:
                        del media[medium]
        self.reporters[rid].ret -= tokens

    def visible(self, rid: str, key: int, now: int, media: list[str] | None = None) -> dict[str, dict[str, str]]:
        """medium -> visible spec name -> uri of one reporter at one key."""
        st = self.reporters.get(rid)
        if st is None or not st.reg or now - st.hb > LIVENESS.heartbeat_timeout_ms:
            return {}
        out = {}
        for medium, specs in self.locations.get((rid, key), {}).items():
            if media and medium not in media:
                continue
            shown = {n: uri for n, (uri, gen) in specs.items() if gen not in st.ret}
            if shown and (not st.strict or any(gen == st.com for _, gen in specs.values() if gen not in st.ret)):
                out[medium] = shown
        return out

    def host_prefixes(
        self,
        keys: list[int],
        now: int,
        media: list[str] | None = None,
        mamba: tuple[list[str], list[str]] | None = None,
        eagle: bool = False,
    ) -> dict[str, int]:
        hosts: dict[str, list[str]] = {}
        for rid in self.reporters:
            hosts.setdefault(rid.partition("#")[2], []).append(rid)

        def names(host: str, key: int) -> set[str]:
            found: set[str] = set()
            for rid in hosts[host]:
                for specs in self.visible(rid, key, now, media).values():
                    found |= set(specs)
            return found

        result = {}
        for host in hosts:
            held = [names(host, key) for key in keys]
            if not held[0]:
                continue
            if mamba is None:
                length = next((i for i, n in enumerate(held) if not n), len(keys))
                length = max(length - 1, 0) if eagle else length
            else:
                full, states = mamba
                prefix = next((i for i, n in enumerate(held) if not set(full) <= n), len(keys))
                limit = max(prefix - 1, 0) if eagle else prefix
                length = next((i + 1 for i in range(limit - 1, -1, -1) if set(states) <= held[i]), 0)
            if length > 0:
                result[host] = length
        return result


def bitmap_invariant(valkey, store: ReporterStore, instance: str) -> None:
    """Bit s of a key's bitmap is set exactly when slot s's reporter has a record of the key
    in the slot's generation with a location of the slot's signature (medium and spec names);
    no two slots share a number; free slots are in no bitmap."""
    expected: dict[bytes, set[int]] = {}
    owners: dict[int, tuple[str, bytes]] = {}
    for rid in store.reporters(instance):
        slots = {}
        for name, value in valkey.hgetall(store.node_key(instance, rid)).items():
            if name.startswith(b"slot:"):
                _, version, signature = name.split(b":", 2)
                assert int(value) not in owners, "a slot owned twice"
                owners[int(value)] = (rid, name)
                slots[(version.decode(), signature)] = int(value)
        for key, raw in valkey.hgetall(store.records_key(instance, rid)).items():
            version, *locations = msgpack.unpackb(raw)
            assert locations, "an empty record is stored"
            for location in locations:
                signature = pack_strings([location[0], *location[1::2]])
                expected.setdefault(key, set()).add(slots[(version, signature)])
    actual = {}
    for key, raw in valkey.hgetall(store.bits_key(instance)).items():
        assert raw and raw[-1] != 0, "a bitmap is not trimmed"
        actual[key] = {8 * i + b for i, byte in enumerate(raw) for b in range(8) if byte >> b & 1}
    assert actual == expected
    free = {int(m) for m in valkey.zrange(f"{{kvcm:{instance}}}:er:slots:free", 0, -1)}
    assert not free & set(owners)


def _random_events(rng: random.Random) -> list[tuple[tuple, object]]:
    """(reference event, store event) pairs of one request."""
    kind = rng.choices(["deltas", "snapshot", "host_down", "register", "heartbeat"], [60, 8, 5, 8, 10])[0]
    if kind == "host_down":
        return [(("x",), host_down_event())]
    if kind == "register":
        return [(("r",), register_event(MEDIA))]
    if kind == "heartbeat":
        return [(("h",), heartbeat_event())]
    if kind == "snapshot":
        blocks = {}
        for key in rng.sample(KEYS, rng.randint(0, 8)):
            blocks[(key, rng.choice(MEDIA))] = [(n, f"x://s/{key}/{n}") for n in rng.sample(NAMES, rng.randint(1, 2))]
        items = [(key, medium, specs) for (key, medium), specs in blocks.items()]
        return [(("s", items), snapshot_event(items))]
    events: list[tuple[tuple, object]] = []
    for _ in range(rng.randint(1, 10)):
        key, medium = rng.choice(KEYS[:8] if rng.random() < 0.7 else KEYS), rng.choice(MEDIA)
        names = rng.sample(NAMES, rng.randint(1, 2))
        if rng.random() < 0.75:
            specs = [(n, f"x://{rng.randint(0, 9)}/{key}") for n in names]
            events.append((("a", key, medium, specs), add_event(key, medium, specs)))
        else:
            events.append((("d", key, medium, names), delete_event(key, medium, names)))
    return events


@pytest.mark.parametrize("seed", range(6))
def test_prefixes_and_visible_locations_match_the_reference(valkey, seed):
    rng = random.Random(seed)
    store, ref, instance, now = ReporterStore(valkey), Reference(), f"bm{seed}", 10_000
    for step in range(150):
        now += rng.choice([0, 0, 50, 300, 900, 2500])
        rid = rng.choice(RIDS)
        if rng.random() < 0.08 and rid in ref.reporters:  # the liveness job's work
            retired = store.expire(instance, rid, now, LIVENESS).retired
            ref.report(rid, [], now, "")
            if retired:
                assert set(retired.split()) == ref.reporters[rid].ret
                store.cleanup(instance, rid, retired)
                ref.cleanup(rid, set(retired.split()))
        else:
            pairs, token = _random_events(rng), new_token()
            store.report(instance, rid, [e for _, e in pairs], now, LIVENESS, token=token)
            ref.report(rid, [r for r, _ in pairs], now, token)
        bitmap_invariant(valkey, store, instance)
        keys = KEYS[: rng.randint(1, len(KEYS))]
        for media in ([], ["gpu"]):
            plain = store.host_prefixes(instance, keys, now, TIMEOUTS, media)
            assert plain == ref.host_prefixes(keys, now, media), step
            for eagle in (False, True):
                assert store.host_prefixes(
                    instance, keys, now, TIMEOUTS, media, (["full_0"], ["linear_0"]), eagle
                ) == ref.host_prefixes(keys, now, media, (["full_0"], ["linear_0"]), eagle), step
        for key, found in zip(keys, store.visible_locations(instance, keys, now, TIMEOUTS), strict=True):
            got = {
                (rid, medium): {n: uri.rsplit("s_version=", 1)[0][:-1] for n, uri in specs}
                for rid, _, medium, specs in found
            }
            want = {
                (rid, medium): specs for rid in ref.reporters for medium, specs in ref.visible(rid, key, now).items()
            }
            assert got == want, (step, key)


def test_cleanup_frees_slots_for_reuse_and_leaves_no_bits(valkey):
    store, instance, now = ReporterStore(valkey), "reuse", 1_000
    for _ in range(5):  # each round: a generation per reporter, then HOST_DOWN and cleanup
        for rid in RIDS:
            store.report(
                instance,
                rid,
                [register_event(MEDIA)] + [add_event(k, m, [("full_0", f"x://{k}")]) for k in KEYS for m in MEDIA],
                now,
                LIVENESS,
            )
        assert store.host_prefixes(instance, KEYS, now, TIMEOUTS) == {
            "10.0.0.1:1": 12,
            "10.0.0.2:1": 12,
            "10.0.0.3:1": 12,
        }
        for rid in RIDS:
            retired = store.report(instance, rid, [host_down_event()], now, LIVENESS).retired
            assert store.cleanup(instance, rid, retired) == 2 * len(KEYS)
        bitmap_invariant(valkey, store, instance)
        assert valkey.hlen(store.bits_key(instance)) == 0
    # 4 reporters x 2 media: never more than 8 slots, whatever the number of generations
    assert int(valkey.get(f"{{kvcm:{instance}}}:er:slots:next")) == 8


def test_long_prompts_mamba_runs_and_spec_names_across_reporters(valkey):
    """300 keys: full attention everywhere, state every few blocks, partly from the host's
    other reporter (the names of its L1P5 and L2 locations add up), holes near the end."""
    store, ref, instance, now = ReporterStore(valkey), Reference(), "long", 5_000
    keys = list(range(1000, 1300))
    plan = {
        RIDS[0]: [(k, "gpu", [("full_0", "x://f")] + ([("linear_0", "x://l")] if k % 7 == 0 else [])) for k in keys],
        RIDS[1]: [(k, "mem", [("linear_0", "x://l2")]) for k in keys if k % 11 == 0],
        RIDS[2]: [(k, "gpu", [("linear_0", "x://l"), ("full_0", "x://f")]) for k in keys[:290] if k != 1250],
        RIDS[3]: [(k, "mem", [("full_0", "x://f")]) for k in keys if k % 3],
    }
    for rid, adds in plan.items():
        token = new_token()
        store.report(instance, rid, [add_event(k, m, specs) for k, m, specs in adds], now, LIVENESS, token=token)
        ref.report(rid, [("a", k, m, specs) for k, m, specs in adds], now, token)
    bitmap_invariant(valkey, store, instance)
    for media in ([], ["gpu"], ["mem"]):
        for mamba in (None, (["full_0"], ["linear_0"])):
            for eagle in (False, True):
                for length in (1, 7, 77, 250, 300):
                    got = store.host_prefixes(instance, keys[:length], now, TIMEOUTS, media, mamba, eagle)
                    assert got == ref.host_prefixes(keys[:length], now, media, mamba, eagle), (media, mamba, eagle)
    assert store.host_prefixes(instance, keys, now, TIMEOUTS, [], (["full_0"], ["linear_0"])) == {
        "10.0.0.1:1": 299,
        "10.0.0.2:1": 250,
    }  # 1298 = 11 x 118 carries state; 1250 is a hole
