"""The background-job lease in Valkey ("leader" in upstream's admin API).

Background singletons (reclaimer, write-session reaper) run only on the node holding the
lease: a key whose value is the holder's node id, set with ``SET NX PX`` and extended by
its holder. Every check-and-change is one Lua script, so a node can never extend or
delete a lease another node took over after ours expired.

A node that lost or released the lease does not campaign again for
``campaign_delay_time_ms`` (stored in Valkey, shared by every container; default 0), so
``leaderDemote`` hands the lease to another node instead of straight back to itself.

Keys share the hash tag ``{<prefix>:lease}`` (one cluster slot):
``{<prefix>:lease}:holder`` (string, PX ttl) and ``{<prefix>:lease}:state`` (hash:
``campaign_delay_ms`` and ``last_loop_ms``, the last elector step of any node).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..clock import Clock, now_ms, now_us
from ..protocol.errors import InvalidArgumentError
from ..valkey import Valkey, valkey_errors

# KEYS: holder, state. ARGV: node id, ttl ms, now ms, may campaign (1/0), default delay ms.
# Extends the lease if we hold it, else takes it if free and we may campaign; records the
# loop time. Returns {held (1/0), campaign delay ms}.
_STEP = """
redis.call('HSET', KEYS[2], 'last_loop_ms', ARGV[3])
local delay = tonumber(redis.call('HGET', KEYS[2], 'campaign_delay_ms') or ARGV[5])
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, delay}
end
if (not holder) and ARGV[4] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, delay}
end
return {0, delay}
"""

# KEYS: holder, state. ARGV: node id, default delay ms. Deletes the lease only if it is ours.
# Returns {released (1/0), campaign delay ms}.
_RELEASE = """
local delay = tonumber(redis.call('HGET', KEYS[2], 'campaign_delay_ms') or ARGV[2])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1, delay}
end
return {0, delay}
"""


@dataclass(frozen=True)
class LeaseStatus:
    """Who holds the lease and until when (µs since the epoch, 0 when nobody)."""

    holder: str | None
    expires_at_us: int


class Lease:
    """This node's view of the background-job lease. Thread-safe."""

    def __init__(
        self, valkey: Valkey, prefix: str, node_id: str, ttl_ms: int, clock: Clock, default_campaign_delay_ms: int = 0
    ) -> None:
        self._valkey = valkey
        self.node_id = node_id
        self.ttl_ms = ttl_ms
        self._clock = clock
        self._default_delay_ms = default_campaign_delay_ms
        tag = f"{{{prefix}:lease}}"
        self._holder_key = f"{tag}:holder"
        self._state_key = f"{tag}:state"
        self._step = valkey.register_script(_STEP)
        self._release = valkey.register_script(_RELEASE)
        self._lock = threading.Lock()
        self._believed_held = False
        self._no_campaign_before_ms = 0

    def try_acquire(self) -> bool:
        """One elector step: extend the lease if held, else take it if it is free and this
        node is not in its campaign delay. True when this node holds the lease now."""
        with self._lock:
            may_campaign = self._believed_held or now_ms(self._clock) >= self._no_campaign_before_ms
        return self._run_step(may_campaign)

    def renew(self) -> bool:
        """Extend the lease only if this node holds it (compare-and-pexpire)."""
        return self._run_step(False)

    def _run_step(self, may_campaign: bool) -> bool:
        now = now_ms(self._clock)
        with valkey_errors("lease store"):
            held, delay = self._step(
                keys=[self._holder_key, self._state_key],
                args=[self.node_id, self.ttl_ms, now, int(may_campaign), self._default_delay_ms],
            )
        with self._lock:
            if self._believed_held and not held:
                self._no_campaign_before_ms = now + int(delay)
            self._believed_held = bool(held)
        return bool(held)

    def release(self) -> bool:
        """Give the lease up if this node holds it (compare-and-delete); True if it did.
        Either way this node then waits the campaign delay before campaigning again."""
        now = now_ms(self._clock)
        with valkey_errors("lease store"):
            released, delay = self._release(
                keys=[self._holder_key, self._state_key], args=[self.node_id, self._default_delay_ms]
            )
        with self._lock:
            self._believed_held = False
            self._no_campaign_before_ms = now + int(delay)
        return bool(released)

    def status(self) -> LeaseStatus:
        """Holder and expiry, read atomically."""
        with valkey_errors("lease store"):
            pipe = self._valkey.pipeline(transaction=True)
            pipe.get(self._holder_key)
            pipe.pttl(self._holder_key)
            raw, pttl = pipe.execute()
        if raw is None or pttl <= 0:
            return LeaseStatus(None, 0)
        return LeaseStatus(raw.decode() if isinstance(raw, bytes) else raw, now_us(self._clock) + pttl * 1000)

    def holder(self) -> str | None:
        """The node id holding the lease, or None."""
        return self.status().holder

    def is_held(self) -> bool:
        """Whether this node holds the lease (asks Valkey)."""
        return self.holder() == self.node_id

    def expires_at_us(self) -> int:
        """When this node's lease expires unless renewed (µs), or 0 if it does not hold it."""
        status = self.status()
        return status.expires_at_us if status.holder == self.node_id else 0

    def campaign_delay_ms(self) -> int:
        """How long a node waits after losing or releasing the lease before campaigning."""
        with valkey_errors("lease store"):
            raw = self._valkey.hget(self._state_key, "campaign_delay_ms")
        return int(raw) if raw is not None else self._default_delay_ms

    def set_campaign_delay_ms(self, delay_ms: int) -> None:
        """Change the campaign delay for every node."""
        if delay_ms < 0:
            raise InvalidArgumentError(f"field 'campaign_delay_time_ms' must be >= 0, got {delay_ms}")
        with valkey_errors("lease store"):
            self._valkey.hset(self._state_key, "campaign_delay_ms", delay_ms)

    def last_loop_time_ms(self) -> int:
        """When any node last ran an elector step (ms since the epoch, 0 if never)."""
        with valkey_errors("lease store"):
            raw = self._valkey.hget(self._state_key, "last_loop_ms")
        return int(raw) if raw is not None else 0
