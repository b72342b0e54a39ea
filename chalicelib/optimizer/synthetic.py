"""Synthetic workloads: a trace for a model not yet served, from a few distributions.

A workload is conversations arriving at random (Poisson): each starts with one of a few
shared system prompts (picked by popularity, Zipf), then takes turns; a turn sends the
whole conversation so far -- system prompt, earlier prompts and answers -- plus a new
prompt, and the model's answer joins the context of the next turn. So prefix reuse comes
from the shared system prompts and from the turns of one conversation, and the time
between turns (think time) decides how long a conversation's blocks must stay cached to
be reused.

Written as Mooncake JSONL (``timestamp`` ms, ``input_length``, ``hash_ids``): block ids
are prefix-aware -- two requests share a block id iff they share every token up to the
block's end -- so the rest of the optimizer reads it like any recorded trace.
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from chalicelib.optimizer.errors import ConfigError


@dataclass(frozen=True)
class Distribution:
    """Token counts: ``fixed:N``, ``uniform:LOW:HIGH`` or ``lognormal:MEDIAN:SIGMA``."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Distribution:
        parts = text.strip().lower().split(":")
        try:
            numbers = [float(p) for p in parts[1:]]
        except ValueError:
            raise ConfigError(f"not a distribution: {text!r}") from None
        arity = {"fixed": 1, "uniform": 2, "lognormal": 2}.get(parts[0])
        if arity is None or len(numbers) != arity:
            raise ConfigError(f"expected fixed:N, uniform:LOW:HIGH or lognormal:MEDIAN:SIGMA, got {text!r}")
        if min(numbers) < 0 or (parts[0] == "uniform" and numbers[0] > numbers[1]):
            raise ConfigError(f"distribution bounds must be >= 0 and ordered: {text!r}")
        return cls(parts[0], *numbers)

    def draw(self, rng: random.Random) -> int:
        """One token count (at least 1)."""
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.uniform(self.a, self.b)
        else:
            value = rng.lognormvariate(math.log(max(self.a, 1.0)), self.b)
        return max(1, int(round(value)))

    def mean(self) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return max(self.a, 1.0) * math.exp(self.b**2 / 2)

    def __str__(self) -> str:
        numbers = [self.a] if self.kind == "fixed" else [self.a, self.b]
        return ":".join([self.kind, *(f"{n:g}" for n in numbers)])


@dataclass(frozen=True)
class Workload:
    """What a model will be asked, statistically (see the module docstring)."""

    rate: float = 1.0  # requests per second, all turns together
    duration: float = 3600.0  # seconds of traffic
    prompt: Distribution = Distribution("lognormal", 1500, 1.0)  # new tokens per turn
    output: Distribution = Distribution("fixed", 300)  # answer tokens, reused next turn
    system: int = 1024  # tokens of a shared system prompt
    system_prompts: int = 4  # distinct system prompts, Zipf-popular
    followup: float = 0.5  # share of requests that continue a conversation
    think: float = 60.0  # mean seconds between the turns of a conversation
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration <= 0:
            raise ConfigError("workload rate and duration must be > 0")
        if not 0 <= self.followup < 1:
            raise ConfigError(f"followup must be in [0, 1), got {self.followup}")
        if self.system < 0 or self.system_prompts < 1 or self.think <= 0:
            raise ConfigError("system >= 0, system_prompts >= 1 and think > 0 are required")

    @classmethod
    def parse(cls, text: str) -> Workload:
        """``rate=2,duration=3600,prompt=lognormal:1500:1,followup=0.6`` (any subset)."""
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in types:
                raise ConfigError(f"unknown workload setting {item!r}; known: {', '.join(types)}")
            kind = types[name]
            try:
                values[name] = (
                    Distribution.parse(value)
                    if kind == "Distribution"
                    else int(value)
                    if kind == "int"
                    else float(value)
                )
            except ValueError:
                raise ConfigError(f"workload setting {name}: not a number: {value!r}") from None
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["prompt"], data["output"] = str(self.prompt), str(self.output)
        return data

    def describe(self) -> str:
        return (
            f"synthetic: {self.rate:g} req/s for {self.duration:g} s, new prompt "
            f"{self.prompt}, output {self.output}, {self.system_prompts} system prompt(s) of "
            f"{self.system} tokens, {self.followup:.0%} follow-ups {self.think:g} s apart"
        )


class _Blocks:
    """Prefix-aware block ids: the id of a block is fixed by its whole prefix."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, int, int], int] = {}

    def of(self, source: tuple[int, int], index: int) -> int:
        key = (*source, index)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids)
        return found


def requests(workload: Workload, block_size: int) -> Iterator[dict[str, Any]]:
    """The workload's requests as Mooncake JSONL objects, in time order."""
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    rng = random.Random(workload.seed)
    blocks = _Blocks()
    weights = [1 / (rank + 1) for rank in range(workload.system_prompts)]
    new_rate = workload.rate * (1 - workload.followup)  # conversations per second
    # (time, conversation, system prompt, context tokens): the next turn of each conversation
    due: list[tuple[float, int, int, int]] = []
    arrival = rng.expovariate(new_rate)
    conversations = 0
    while True:
        if due and due[0][0] <= arrival:
            now, conversation, system, context = heapq.heappop(due)
        else:
            now, conversation, context = arrival, conversations, 0
            system = rng.choices(range(workload.system_prompts), weights)[0]
            conversations += 1
            arrival += rng.expovariate(new_rate)
        if now > workload.duration:
            return
        prompt = context + workload.prompt.draw(rng)
        length = workload.system + prompt
        ids = []
        for index in range(length // block_size):
            inside_system = (index + 1) * block_size <= workload.system
            source = (0, system) if inside_system else (1, conversation)
            ids.append(blocks.of(source, index))
        yield {"timestamp": int(now * 1000), "input_length": length, "hash_ids": ids}
        if rng.random() < workload.followup:  # geometric turns: mean 1 / (1 - followup)
            answer = workload.output.draw(rng)
            heapq.heappush(due, (now + rng.expovariate(1 / workload.think), conversation, system, prompt + answer))


def write_trace(workload: Workload, block_size: int, out: TextIO) -> int:
    """Write the workload as Mooncake JSONL; returns the number of requests."""
    count = 0
    for request in requests(workload, block_size):
        out.write(json.dumps(request, separators=(",", ":")) + "\n")
        count += 1
    return count


def generate(workload: Workload, block_size: int, path: str | Path) -> int:
    """Write the workload's trace to ``path`` (parents created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8") as handle:
        return write_trace(workload, block_size, handle)


def workload_summary(workload: Workload) -> Mapping[str, Any]:
    """The workload and the means it implies, for the report."""
    return {
        **workload.to_dict(),
        "description": workload.describe(),
        "mean_turns": 1 / (1 - workload.followup),
        "mean_new_prompt_tokens": workload.prompt.mean(),
    }
