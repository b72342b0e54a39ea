"""Seeded prefix-cache traces of a chosen size, for testing curves across sizes and shapes.

:mod:`chalicelib.optimizer.synthetic` models a workload in tokens and seconds (for ROI);
this module builds Mooncake-shaped request streams fast, straight as :class:`Record`
(``Op.REQUEST``, prefix-chained block ids: two requests share a block id iff they share
every block up to it), stopping at a number of **distinct blocks** -- so a test can sweep
10 thousand to 10 million blocks and vary the shape that makes sampling hard:

* **prefix sharing**: ``system_prompts`` shared prefixes of ``system_blocks`` blocks each
  start every conversation (0: none), picked by Zipf popularity ``system_skew``; a new
  conversation may also **fork** an earlier one (reuse a random prefix of its context);
* **skew**: the ``live`` conversations that can take another turn sit in slots; a turn
  picks a slot by Zipf ``reuse_skew`` (0: uniform), so a few conversations are revisited
  far more often than the rest; a new conversation takes a random slot;
* each turn sends the whole context plus about ``prompt_blocks`` new blocks (geometric);
  the answer's ``answer_blocks`` join the context of the next turn.

The stream is a generator: 10 million distinct blocks never sit in memory as a list.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.traces import DEFAULT_INSTANCE, Op, Record


@dataclass(frozen=True)
class TraceShape:
    """What a generated trace looks like (see the module docstring)."""

    distinct_blocks: int
    seed: int = 0
    system_prompts: int = 4
    system_blocks: int = 32
    system_skew: float = 1.0
    live: int = 2000
    reuse_skew: float = 0.0
    followup: float = 0.7
    fork: float = 0.0
    prompt_blocks: int = 24
    answer_blocks: int = 8
    max_context: int = 1500  # blocks: a conversation this long takes no more turns

    def __post_init__(self) -> None:
        if self.distinct_blocks < 1 or self.live < 1 or self.prompt_blocks < 1:
            raise ConfigError("distinct_blocks, live and prompt_blocks must be >= 1")
        if self.system_prompts < 0 or self.system_blocks < 0 or self.answer_blocks < 0:
            raise ConfigError("system_prompts, system_blocks and answer_blocks must be >= 0")
        if self.distinct_blocks <= self.system_prompts * self.system_blocks:
            raise ConfigError("distinct_blocks must exceed the system prompts' blocks")
        if not (0 <= self.followup < 1 and 0 <= self.fork <= 1):
            raise ConfigError("followup must be in [0, 1) and fork in [0, 1]")

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


def _zipf_picker(count: int, exponent: float, rng: random.Random) -> Iterator[int]:
    """Endless ranks in ``[0, count)``, rank ``r`` with weight ``1 / (r + 1) ** exponent``."""
    cumulative = list(itertools.accumulate(1 / (rank + 1) ** exponent for rank in range(count)))
    total = cumulative[-1]
    random_, bisect_ = rng.random, bisect.bisect_right
    while True:
        yield min(bisect_(cumulative, random_() * total), count - 1)


def generate_records(shape: TraceShape, *, instance: str = DEFAULT_INSTANCE) -> Iterator[Record]:
    """The trace's requests, in order, until ``shape.distinct_blocks`` blocks exist."""
    rng = random.Random(shape.seed)
    fresh = itertools.count()
    systems = [[next(fresh) for _ in range(shape.system_blocks)] for _ in range(shape.system_prompts)]
    pick_system = _zipf_picker(max(1, shape.system_prompts), shape.system_skew, rng)
    pick_slot = _zipf_picker(shape.live, shape.reuse_skew, rng)
    slots: list[list[int] | None] = [None] * shape.live  # a live conversation's context
    mean_prompt = shape.prompt_blocks
    created = len(systems) * shape.system_blocks
    timestamp = 0
    while created < shape.distinct_blocks:
        timestamp += 1000
        slot = next(pick_slot)
        context = slots[slot]
        if context is not None and rng.random() < shape.followup:
            # the next turn: the last answer joins the context (created only now: every
            # block the generator counts is read)
            answer = min(shape.answer_blocks, shape.distinct_blocks - created - 1)  # room for a prompt
            context = context + [next(fresh) for _ in range(answer)]
            created += answer
        else:
            # a new conversation in this slot: a system prompt, or a fork of a live one
            donor = slots[rng.randrange(shape.live)] if shape.fork and rng.random() < shape.fork else None
            if donor:
                context = donor[: rng.randint(1, len(donor))]
            else:
                context = list(systems[next(pick_system)]) if systems else []
        new = min(max(1, round(rng.expovariate(1 / mean_prompt))), shape.distinct_blocks - created)
        keys = context + [next(fresh) for _ in range(new)]
        created += new
        yield Record(instance, timestamp, Op.REQUEST, keys)
        slots[slot] = keys if len(keys) + shape.answer_blocks < shape.max_context else None


def write_mooncake(shape: TraceShape, path: str | Path) -> int:
    """The trace as Mooncake JSONL (``timestamp`` ms, ``hash_ids``); returns the requests."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for record in generate_records(shape):
            out.write(json.dumps({"timestamp": record.timestamp_us // 1000, "hash_ids": list(record.keys)}) + "\n")
            count += 1
    return count
