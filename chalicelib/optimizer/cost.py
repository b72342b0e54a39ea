"""Cost model: prefill tokens a cache saves, in GPU time and money.

Every token served from the cache is a token the GPUs do not prefill. Prefill costs about
``2 x parameters`` FLOPs per token (one multiply-add per weight; attention over long
contexts adds more, so this is a floor). A GPU delivers ``peak FLOP/s x MFU``, so

    GPU-seconds saved = saved tokens x FLOPs per token / (peak FLOP/s x MFU)

Spread over the time the trace spans, that is an average number of GPUs, and at a price per
GPU-hour, money. Only *external* hits count: internal hits (``block_mask``) were already
on the engine and the cache under study did not provide them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from chalicelib.optimizer.errors import ConfigError


@dataclass(frozen=True)
class CostModel:
    """Model size, GPU speed and price. Defaults: an 8B-parameter model on H100 SXM GPUs
    (989 TFLOP/s dense BF16) at 40 % MFU, 2.50 per GPU-hour."""

    model_params: float = 8e9
    flops_per_token: float | None = None  # None: 2 x model_params
    gpu_flops: float = 989e12
    mfu: float = 0.4
    gpu_hour_price: float = 2.5
    currency: str = "USD"

    def __post_init__(self) -> None:
        if self.model_params <= 0 or self.gpu_flops <= 0 or self.gpu_hour_price < 0:
            raise ConfigError("model_params and gpu_flops must be > 0, gpu_hour_price >= 0")
        if self.flops_per_token is not None and self.flops_per_token <= 0:
            raise ConfigError("flops_per_token must be > 0")
        if not 0 < self.mfu <= 1:
            raise ConfigError(f"mfu must be in (0, 1], got {self.mfu}")

    @property
    def token_flops(self) -> float:
        """Prefill FLOPs per token."""
        return self.flops_per_token if self.flops_per_token is not None else 2 * self.model_params

    def savings(self, saved_tokens: float, duration_s: float) -> dict[str, Any]:
        """What ``saved_tokens`` of prefill over ``duration_s`` seconds are worth.

        ``gpus`` (average GPUs freed) and the per-hour rate need a duration; they are None
        for a trace whose requests all share one timestamp.
        """
        flops = saved_tokens * self.token_flops
        gpu_seconds = flops / (self.gpu_flops * self.mfu)
        gpu_hours = gpu_seconds / 3600
        cost = gpu_hours * self.gpu_hour_price
        hours = duration_s / 3600
        return {
            "saved_prefill_tokens": saved_tokens,
            "saved_flops": flops,
            "gpu_seconds": gpu_seconds,
            "gpu_hours": gpu_hours,
            "gpus": gpu_seconds / duration_s if duration_s > 0 else None,
            "cost": cost,
            "cost_per_hour": cost / hours if hours > 0 else None,
            "cost_per_day": 24 * cost / hours if hours > 0 else None,
            "currency": self.currency,
            "duration_s": duration_s,
        }

    def assumptions(self) -> list[str]:
        """The model's assumptions, one line each, for stdout and the plots."""
        source = (
            f"{_si(self.flops_per_token)}FLOP/token given"
            if self.flops_per_token
            else f"2 x {self.model_params / 1e9:.3g} B params = {_si(self.token_flops)}FLOP/token"
        )
        return [
            f"prefill {source}; GPU {self.gpu_flops / 1e12:g} TFLOP/s at "
            f"{self.mfu:.0%} MFU, {self.gpu_hour_price:g} {self.currency}/GPU-h"
        ]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["token_flops"] = self.token_flops
        return data


def _si(value: float) -> str:
    """``7.06e10`` -> ``70.6 G``: three significant digits and a decimal prefix, for people."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g} "
