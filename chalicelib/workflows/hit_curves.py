"""The ``hit_curves`` schedule: each instance's hit feed (a Valkey stream,
``observability.hit_feed``) into its group's live hit-ratio curve (``optimizer.live``),
saved in Valkey between runs, and what getGroupHitCurve serves and the metrics export.

A run (the lease holder only) asks every instance's stream length in one pipelined round
trip and stops there when all are empty: the cheap case. A group with new entries is
loaded (one key), fed at most ``max_entries`` entries per instance (the oldest first; the
rest wait for the next run), saved with its view (the curve against the group quota in
bytes, the ratios at x0.5, x1 and x2 the quota, its freshness), and the consumed entries
are trimmed. The tuning job reads the curves back (``LiveCurves``) and leaves its
recommendation next to them (the console marks it).

Gauges, per group: ``kvcm.hit_curve.hit_ratio{instance_group, quota=x0.5|x1|x2}``, the
curve at that share of the current quota (the capacity an instance keeps under its quota
is the tuning job's: quota x watermark / bytes per block), only while the curve is
``confident`` (``optimizer.live.MIN_KEPT_KEYS``); ``kvcm.hit_curve.confident`` (1 or 0);
``kvcm.hit_curve.age_s``.
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, Any

from ..clock import Clock
from ..control import ControlPlane
from ..index.types import InstanceLayout
from ..observability.hit_feed import STREAM_SUFFIX, FeedEntry, HitFeed
from ..observability.metrics import MetricsRegistry
from ..protocol.models import InstanceGroup
from ..stores.lease import Lease
from ..valkey import Valkey, valkey_errors

if TYPE_CHECKING:
    from ..optimizer.mrc import HitRatioCurve

#: Entries one run feeds per instance at most (the rest wait for the next run).
MAX_ENTRIES = 50_000
#: KEYS: epoch, state, view. ARGV: the epoch the state was loaded at, state, view. Saves
#: only when no reset came in between (a reset increments the epoch): 1 saved, 0 not.
_SAVE_UNLESS_RESET = """
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[3], ARGV[3])
return 1
"""


class HitCurveStore:
    """Where the live curves live in Valkey: per group, the state (every instance's
    ``LiveCurve``), the view getGroupHitCurve serves and the tuning job's last
    recommendation; per instance, the feed stream (in the instance's slot)."""

    def __init__(self, client: Valkey, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._save = client.register_script(_SAVE_UNLESS_RESET)

    def _key(self, group: str, part: str) -> str:
        return f"{{{self.prefix}:grp:{group}}}:hc:{part}"

    def stream(self, instance_id: str) -> bytes:
        return InstanceLayout(self.prefix, instance_id, 0).key(STREAM_SUFFIX)

    def lengths(self, instances: list[str]) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for instance in instances:
            pipe.xlen(self.stream(instance))
        with valkey_errors("hit curves"):
            return [int(n) for n in pipe.execute()]

    def entries(self, instance_id: str, count: int) -> list[tuple[bytes, FeedEntry]]:
        with valkey_errors("hit curves"):
            raw: list[tuple[bytes, dict[bytes, bytes]]] = self.client.xrange(  # type: ignore[assignment]
                self.stream(instance_id), count=count
            )
        return [(entry_id, FeedEntry.from_fields(fields)) for entry_id, fields in raw]

    def trim(self, instance_id: str, last_id: bytes) -> None:
        """Drop the entries up to ``last_id`` (consumed)."""
        ms, seq = last_id.split(b"-")
        with valkey_errors("hit curves"):
            self.client.xtrim(self.stream(instance_id), minid=b"%s-%d" % (ms, int(seq) + 1), approximate=False)

    def load(self, group: str) -> dict[str, Any]:
        """The group's saved state (empty: none), with the ``epoch`` it was loaded at."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self._key(group, "state"))
        pipe.get(self._key(group, "epoch"))
        with valkey_errors("hit curves"):
            blob, epoch = pipe.execute()
        state = json.loads(zlib.decompress(blob)) if isinstance(blob, bytes) else {}
        return {**state, "epoch": int(epoch or 0)}

    def save(self, group: str, state: dict[str, Any], view: dict[str, Any]) -> bool:
        """Save a state loaded by ``load`` and its view, unless the group's curve was reset
        since (then nothing is saved: False)."""
        blob = zlib.compress(json.dumps(state, separators=(",", ":")).encode())
        keys = [self._key(group, part) for part in ("epoch", "state", "view")]
        with valkey_errors("hit curves"):
            return bool(self._save(keys=keys, args=[state["epoch"], blob, json.dumps(view, separators=(",", ":"))]))

    def reset(self, group: str, instances: list[str]) -> None:
        """Start the group's curve over: its instances' unread feed entries, then its state
        and view go. In that order, a run that loaded the state before the reset either
        saved it before (deleted here) or finds the epoch moved and saves nothing; a run
        loading after reads only entries appended after."""
        if instances:
            self.drop_streams(instances)
        pipe = self.client.pipeline(transaction=True)
        pipe.incr(self._key(group, "epoch"))
        pipe.delete(self._key(group, "state"), self._key(group, "view"))
        with valkey_errors("hit curves"):
            pipe.execute()

    def view(self, group: str) -> dict[str, Any] | None:
        with valkey_errors("hit curves"):
            raw = self.client.get(self._key(group, "view"))
        return json.loads(raw) if raw else None

    def recommend(self, group: str, recommendation: dict[str, Any]) -> None:
        """Keep the tuning job's last recommendation for the group (the console marks it)."""
        with valkey_errors("hit curves"):
            self.client.set(self._key(group, "rec"), json.dumps(recommendation, separators=(",", ":")))

    def recommendation(self, group: str) -> dict[str, Any] | None:
        with valkey_errors("hit curves"):
            raw = self.client.get(self._key(group, "rec"))
        return json.loads(raw) if raw else None

    def drop_streams(self, instances: list[str]) -> None:
        """Delete the feed streams of instances no longer registered."""
        with valkey_errors("hit curves"):
            self.client.delete(*(self.stream(instance) for instance in instances))


class LiveCurves:
    """``optimizer.instance_tuning.LiveSource`` over the store."""

    def __init__(self, store: HitCurveStore) -> None:
        self.store = store

    def curves(self, group: str) -> dict[str, HitRatioCurve]:
        from ..optimizer.live import curves_of

        return curves_of(self.store.load(group))

    def recommend(self, group: str, recommendation: dict[str, Any]) -> None:
        self.store.recommend(group, recommendation)


class HitCurves:
    """The ``hit_curves`` job (see the module doc)."""

    def __init__(
        self,
        lease: Lease,
        control: ControlPlane,
        store: HitCurveStore,
        feed: HitFeed,
        metrics: MetricsRegistry,
        clock: Clock,
        s_max: int,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.lease = lease
        self.control = control
        self.store = store
        self.feed = feed
        self.metrics = metrics
        self.clock = clock
        self.s_max = s_max
        self.max_entries = max_entries

    def run(self) -> dict[str, Any]:
        """Feed every group's new entries; how many groups and entries."""
        if not self.lease.try_acquire():
            return {"skipped": "lease held by another node"}
        records = self.control.list_instances()
        lengths = self.store.lengths([r.instance_id for r in records]) if records else []
        fresh: dict[str, list[str]] = {}
        for record, length in zip(records, lengths, strict=True):
            if length:
                fresh.setdefault(record.group, []).append(record.instance_id)
        fed = 0
        for name, instances in sorted(fresh.items()):
            fed += self._update(name, instances, records)
        return {"groups": len(fresh), "entries": fed}

    def _update(self, name: str, instances: list[str], records: list[Any]) -> int:
        # Imported when run: the optimizer costs the API's cold start a third of a second.
        from ..optimizer.live import LiveCurve

        group = self.control.get_group(name)
        block_bytes = {r.instance_id: sum(s.size for s in r.location_spec_infos) for r in records if r.group == name}
        state = self.store.load(name)
        saved: dict[str, Any] = state.get("instances", {})
        last_ms = int(state.get("through_ms", 0))
        consumed: dict[str, bytes] = {}
        fed = 0
        for instance in instances:
            if instance in saved:
                curve = LiveCurve.from_dict(saved[instance])
                curve.lower(self.feed.threshold or curve.threshold)
            else:
                curve = LiveCurve(threshold=self.feed.threshold or 1, s_max=self.s_max)
            entries = self.store.entries(instance, self.max_entries)
            for _, entry in entries:
                curve.feed(entry)
                last_ms = max(last_ms, entry.time_ms)
            if entries:
                consumed[instance] = entries[-1][0]
                fed += len(entries)
            saved[instance] = curve.to_dict()
        # a removed instance's curve leaves the group's, and its stream goes
        gone = [n for n in saved if n not in block_bytes]
        if gone:
            self.store.drop_streams(gone)
        kept = {n: c for n, c in saved.items() if n in block_bytes}
        state = {"instances": kept, "through_ms": last_ms, "epoch": state["epoch"]}
        if not self._save(group, state, block_bytes):
            return 0  # reset meanwhile: what this run fed is gone with the old curve
        # saved before trimmed: a run dying between the two feeds the entries twice next
        # run rather than losing them
        for instance, last_id in consumed.items():
            self.store.trim(instance, last_id)
        return fed

    def _save(self, group: InstanceGroup, state: dict[str, Any], block_bytes: dict[str, int]) -> bool:
        from ..optimizer.live import group_view, live_curves_of

        now = self.clock.now()
        view = group_view(group, live_curves_of(state), block_bytes)
        view.update(group=group.name, updated_at=now, through_s=state["through_ms"] / 1000)
        if not self.store.save(group.name, state, view):
            return False
        tags = {"instance_group": group.name}
        self.metrics.gauge("kvcm.hit_curve.confident", float(view["confident"]), tags)
        for mark, value in view["at_quota"].items():
            if value is not None and view["confident"]:
                self.metrics.gauge("kvcm.hit_curve.hit_ratio", value, {**tags, "quota": mark})
        self.metrics.gauge("kvcm.hit_curve.age_s", max(0.0, now - view["through_s"]), {"instance_group": group.name})
        return True
