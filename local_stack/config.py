"""The local stack's own settings (``KVCM_PORT``, ``KVCM_AWS_PORT``, ...), read from the environment.

The app's settings (``KVCM_*`` in ``chalicelib/settings.py``) are not repeated here: the
stack exports the few it decides (Valkey URL, state machine ARNs) into the environment
and lets ``Settings.from_env`` read them like on Lambda.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

SCHEDULE_ENV_PREFIX = "KVCM_LOCAL_SCHEDULE_"
SCHEDULE_ENV_SUFFIX = "_S"

#: Local periods that differ from the deployed rate: reclaim runs every second so a
#: refused write succeeds again within about 2 s (API.md, "Capacity"); the live hit-ratio
#: curves follow a replay within 5 s (a run without new traffic is one round trip).
LOCAL_SCHEDULE_DEFAULTS: Mapping[str, float] = {"RECLAIM": 1.0, "HIT_CURVES": 5.0}


def schedule_key(name: str) -> str:
    """How a schedule name appears in ``KVCM_LOCAL_SCHEDULE_<NAME>_S``."""
    return re.sub(r"[^A-Z0-9]+", "_", name.upper())


def _schedule_overrides(environ: Mapping[str, str]) -> dict[str, float]:
    periods = dict(LOCAL_SCHEDULE_DEFAULTS)
    for key, value in environ.items():
        if key.startswith(SCHEDULE_ENV_PREFIX) and key.endswith(SCHEDULE_ENV_SUFFIX) and value:
            periods[key[len(SCHEDULE_ENV_PREFIX) : -len(SCHEDULE_ENV_SUFFIX)]] = float(value)
    return periods


@dataclass(frozen=True)
class StackConfig:
    """Where the local stack listens and keeps its state. Port 0 means "any free port"."""

    state_dir: Path = REPO_ROOT / ".state"
    host: str = "127.0.0.1"
    port: int = 8000
    aws_port: int = 4566
    #: An already running Valkey; empty = start the embedded one in ``state_dir/valkey``.
    valkey_url: str = ""
    valkey_port: int = 0
    region: str = "us-east-1"
    workflow_dirs: tuple[Path, ...] = (REPO_ROOT / "workflows",)
    #: Period overrides by ``schedule_key(name)``, in seconds.
    schedule_periods: Mapping[str, float] = field(default_factory=lambda: dict(LOCAL_SCHEDULE_DEFAULTS))
    #: How often the control-table journal is checked and, once large, folded into
    #: ``state_dir/control.json`` (0 = only at start and stop).
    snapshot_period_s: float = 5.0
    seed: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> StackConfig:
        """Read the stack's variables; unset ones keep their defaults."""
        base = cls()
        return cls(
            state_dir=Path(environ.get("KVCM_STATE_DIR") or base.state_dir).resolve(),
            host=environ.get("KVCM_HOST") or base.host,
            port=int(environ.get("KVCM_PORT") or base.port),
            aws_port=int(environ.get("KVCM_AWS_PORT") or base.aws_port),
            valkey_url=environ.get("KVCM_VALKEY_URL", base.valkey_url),
            valkey_port=int(environ.get("KVCM_LOCAL_VALKEY_PORT") or base.valkey_port),
            region=environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or base.region,
            schedule_periods=_schedule_overrides(environ),
            snapshot_period_s=float(environ.get("KVCM_LOCAL_SNAPSHOT_S") or base.snapshot_period_s),
            seed=(environ.get("KVCM_LOCAL_SEED") or "true").lower() not in ("0", "false", "no", "off"),
        )

    @property
    def valkey_dir(self) -> Path:
        return self.state_dir / "valkey"

    @property
    def control_snapshot(self) -> Path:
        return self.state_dir / "control.json"

    @property
    def s3_dir(self) -> Path:
        """moto's S3 buckets and objects (``s3.S3Mirror``)."""
        return self.state_dir / "s3"

    @property
    def data_dir(self) -> Path:
        """Root of the file-backend storages the stack seeds."""
        return self.state_dir / "data"
