"""Planner units: blocks in bytes and GiB, what the cache costs per storage tier, the net
against the GPU time it saves, and the quota to configure in KVCM.

* **KV bytes per token** come from a model preset -- ``2 (K and V) x layers x KV heads x
  head dim x dtype bytes`` -- or are given directly; a block is ``block_size`` tokens.
* **Storage** is priced per GiB-hour by tier (editable defaults, :data:`STORAGE_TIERS`);
  what is priced is the quota KVCM must be given, not the blocks the cache holds on
  average.
* **The quota.** KVCM's reclaimer starts freeing at ``used_percentage`` of a limit, so a
  cache that must hold ``C`` blocks needs a limit of ``C / used_percentage`` -- unless the
  simulated policy already ran with KVCM's watermark (the ``kvcm`` policy), whose capacity
  *is* the limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from chalicelib.optimizer.errors import ConfigError

GIB = 1 << 30

DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class ModelPreset:
    """The shape of a model's KV cache (and its size, for prefill FLOPs)."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    params: float
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"unknown KV dtype {self.dtype!r}; choose from {', '.join(DTYPE_BYTES)}")
        if min(self.layers, self.kv_heads, self.head_dim) < 1 or self.params <= 0:
            raise ConfigError("layers, kv_heads, head_dim and params must be > 0")

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def describe(self) -> str:
        return f"{self.name} ({self.layers} layers x {self.kv_heads} KV heads x {self.head_dim} dims, {self.dtype})"


#: Published configurations (config.json of each model); params drive the prefill FLOPs.
MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("llama-3.1-8b", 32, 8, 128, 8.0e9),
        ModelPreset("llama-3.1-70b", 80, 8, 128, 70.6e9),
        ModelPreset("qwen2.5-7b", 28, 4, 128, 7.6e9),
        ModelPreset("qwen2.5-32b", 64, 8, 128, 32.8e9),
        ModelPreset("qwen2.5-72b", 80, 8, 128, 72.7e9),
        ModelPreset("mistral-7b", 32, 8, 128, 7.2e9),
    )
}
DEFAULT_MODEL = "llama-3.1-8b"


def model_preset(name: str, dtype: str | None = None) -> ModelPreset:
    """A preset by name (case-insensitive), optionally with another KV dtype."""
    preset = MODEL_PRESETS.get(name.strip().lower())
    if preset is None:
        raise ConfigError(
            f"unknown model preset {name!r}; choose from {', '.join(MODEL_PRESETS)} or give --kv-bytes-per-token"
        )
    return replace(preset, dtype=dtype) if dtype else preset


@dataclass(frozen=True)
class StorageTier:
    """Where the cached blocks live, and what a GiB of it costs per hour."""

    name: str
    storage_type: str  # KVCM's storage type name (quota_config.storage_type)
    gib_hour_price: float
    basis: str  # where the default price comes from


#: Default prices, per GiB-hour: AWS us-east-1 on-demand list prices of 2024, the whole VM
#: charged to the medium it is bought for. Edit them (``--storage-price TIER=PRICE``).
STORAGE_TIERS: dict[str, StorageTier] = {
    t.name: t
    for t in (
        StorageTier("dram", "ST_MOONCAKE", 0.0083, "memory-optimized VM (r7i.xlarge, 32 GiB, 0.265/h)"),
        StorageTier("ssd", "ST_3FS", 0.0004, "NVMe storage VM (i4i.xlarge, 937 GB, 0.343/h)"),
        StorageTier("nfs", "ST_NFS", 0.00044, "managed NFS (EFS Standard, 0.30 per GB-month)"),
        StorageTier("s3", "ST_S3", 0.000034, "object storage (S3 Standard, 0.023 per GB-month; requests extra)"),
    )
}
DEFAULT_TIER = "dram"


def storage_tier(name: str, prices: Mapping[str, float] | None = None) -> StorageTier:
    """A tier by name, its price replaced by ``prices[name]`` when given."""
    tier = STORAGE_TIERS.get(name.strip().lower())
    if tier is None:
        raise ConfigError(f"unknown storage tier {name!r}; choose from {', '.join(STORAGE_TIERS)}")
    price = (prices or {}).get(tier.name)
    if price is None:
        return tier
    if price < 0:
        raise ConfigError(f"storage price of {tier.name} must be >= 0, got {price}")
    return replace(tier, gib_hour_price=price, basis="given")


def parse_prices(items: Iterable[str]) -> dict[str, float]:
    """``["dram=0.01", "ssd=0.0005"]`` -> prices per GiB-hour by tier."""
    prices: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"expected TIER=PRICE, got {item!r}")
        tier = storage_tier(name).name
        try:
            prices[tier] = float(value)
        except ValueError:
            raise ConfigError(f"not a price: {value!r} (in {item!r})") from None
    return prices


def human_bytes(count: float) -> str:
    """``1536`` -> ``1.5 KiB``: three significant digits, binary units."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(count) < 1024 or unit == "PiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.3g} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class CapacityPlan:
    """Turns block capacities into bytes, money and a KVCM quota.

    ``instances`` multiplies a per-instance capacity into what the group holds (1 when the
    simulated capacity is the group's, ``group_rough`` mode).
    """

    block_size: int  # tokens per block
    kv_bytes_per_token: float
    model: str  # the preset's description, or "given"
    tier: StorageTier = field(default_factory=lambda: STORAGE_TIERS[DEFAULT_TIER])
    instances: int = 1
    used_fraction: float = 0.9  # KVCM trigger_strategy.used_percentage
    step_percentage: int = 10  # KVCM reclaim_step_percentage
    currency: str = "USD"

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.kv_bytes_per_token <= 0 or self.instances < 1:
            raise ConfigError("block_size, kv_bytes_per_token and instances must be > 0")
        if not 0 < self.used_fraction <= 1:
            raise ConfigError(f"used_percentage must be in (0, 1], got {self.used_fraction}")
        if not 0 < self.step_percentage <= 100:
            raise ConfigError(f"reclaim_step_percentage must be in (0, 100], got {self.step_percentage}")

    @property
    def block_bytes(self) -> int:
        return math.ceil(self.block_size * self.kv_bytes_per_token)

    def gib(self, blocks: float) -> float:
        """GiB that ``blocks`` blocks of one instance hold."""
        return blocks * self.block_bytes / GIB

    def quota_blocks(self, blocks: int, watermark_simulated: bool = False) -> int:
        """The per-instance limit under which KVCM keeps about ``blocks`` blocks."""
        return blocks if watermark_simulated else math.ceil(blocks / self.used_fraction)

    def storage_cost_per_hour(self, blocks: int, watermark_simulated: bool = False) -> float:
        """What the quota for ``blocks`` blocks per instance costs per hour, all instances."""
        quota = self.quota_blocks(blocks, watermark_simulated)
        return self.gib(quota) * self.instances * self.tier.gib_hour_price

    def row(
        self,
        policy: str,
        blocks: int,
        hit_ratio: float | None,
        savings: Mapping[str, Any],
        watermark_simulated: bool = False,
    ) -> dict[str, Any]:
        """One capacity: its size, its storage cost and the net against ``savings``
        (:meth:`CostModel.savings` of the hits it gives)."""
        storage = self.storage_cost_per_hour(blocks, watermark_simulated)
        saved = savings.get("cost_per_hour")
        return {
            "policy": policy,
            "capacity_blocks": blocks,
            "capacity_gib": self.gib(blocks),
            "quota_gib": self.gib(self.quota_blocks(blocks, watermark_simulated)),
            "block_hit_ratio": hit_ratio,
            "gpus_saved": savings.get("gpus"),
            "gpu_cost_saved_per_hour": saved,
            "storage_cost_per_hour": storage,
            "net_per_hour": None if saved is None else saved - storage,
        }

    def quota(
        self, policy: str, blocks: int, watermark_simulated: bool = False, reclaim_policy: str = "POLICY_LRU"
    ) -> dict[str, Any]:
        """The KVCM settings that keep about ``blocks`` blocks per instance: per-instance
        ``max_key_count``, the group's byte quota on the tier, and the watermark."""
        per_instance = self.quota_blocks(blocks, watermark_simulated)
        group_bytes = per_instance * self.block_bytes * self.instances
        return {
            "policy": policy,
            "cache_blocks_per_instance": blocks,
            "max_key_count": per_instance,
            "group_quota_bytes": group_bytes,
            "group_quota": human_bytes(group_bytes),
            "instances": self.instances,
            "instance_group": {
                "quota": {
                    "capacity": group_bytes,
                    "quota_config": [{"storage_type": self.tier.storage_type, "capacity": group_bytes}],
                },
                "cache_config": {
                    "reclaim_strategy": {
                        "reclaim_policy": reclaim_policy,
                        "trigger_strategy": {"used_percentage": self.used_fraction},
                        "reclaim_step_percentage": self.step_percentage,
                    },
                    "meta_indexer_config": {"max_key_count": per_instance},
                },
            },
        }

    def assumptions(self) -> list[str]:
        """The planner's assumptions, one line each, for stdout and the plots."""
        tier = self.tier
        return [
            f"model {self.model}: {human_bytes(self.kv_bytes_per_token)} of KV per token",
            f"block = {self.block_size} tokens = {human_bytes(self.block_bytes)}"
            + (f", x {self.instances} instances" if self.instances > 1 else ""),
            f"storage {tier.name} ({tier.storage_type}) at {tier.gib_hour_price:g} "
            f"{self.currency}/GiB-h ({tier.basis})",
            f"KVCM watermark {self.used_fraction:.0%}, step {self.step_percentage}%: the kvcm "
            f"policy runs with it (its capacity is the quota); for the others quota = cache / "
            f"{self.used_fraction:g}; storage is priced on the quota",
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "block_bytes": self.block_bytes,
            "model": self.model,
            "storage_tier": {
                "name": self.tier.name,
                "storage_type": self.tier.storage_type,
                "gib_hour_price": self.tier.gib_hour_price,
                "basis": self.tier.basis,
            },
            "instances": self.instances,
            "used_percentage": self.used_fraction,
            "reclaim_step_percentage": self.step_percentage,
            "currency": self.currency,
        }


def build_plan(
    *,
    block_size: int,
    instances: int = 1,
    model: str = DEFAULT_MODEL,
    kv_dtype: str | None = None,
    kv_bytes_per_token: float | None = None,
    tier: str = DEFAULT_TIER,
    prices: Mapping[str, float] | None = None,
    used_percentage: float = 0.9,
    reclaim_step_percentage: int = 10,
    currency: str = "USD",
) -> tuple[CapacityPlan, ModelPreset]:
    """The plan the options describe, and the model preset (its parameters drive the
    prefill FLOPs unless given otherwise)."""
    preset = model_preset(model, kv_dtype)
    given = kv_bytes_per_token is not None
    plan = CapacityPlan(
        block_size=block_size,
        kv_bytes_per_token=kv_bytes_per_token if kv_bytes_per_token is not None else preset.kv_bytes_per_token,
        model="given" if given else preset.describe(),
        tier=storage_tier(tier, prices),
        instances=instances,
        used_fraction=used_percentage,
        step_percentage=reclaim_step_percentage,
        currency=currency,
    )
    return plan, preset


def for_people(value: Any, digits: int = 4) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (recursively)."""
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return value
        return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))
    if isinstance(value, Mapping):
        return {k: for_people(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [for_people(v, digits) for v in value]
    return value
