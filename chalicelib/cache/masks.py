"""Block masks: which request keys the engine already holds (offset or bool list)."""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol.errors import InvalidArgumentError
from ..protocol.models import BlockMask, BoolMasks


def masked_flags(mask: BlockMask | None, count: int, field: str) -> list[bool]:
    """One flag per key, True = masked. Offsets beyond ``count`` and bool lists of
    another length are errors naming ``field``."""
    if mask is None:
        return [False] * count
    if mask.offset is not None:
        if mask.offset > count:
            raise InvalidArgumentError(f"field '{field}.offset': {mask.offset} is beyond the {count} keys")
        return [i < mask.offset for i in range(count)]
    if mask.bool_masks is not None:
        values = mask.bool_masks.values
        if len(values) != count:
            raise InvalidArgumentError(f"field '{field}.bool_masks.values': {len(values)} values for {count} keys")
        return list(values)
    return [False] * count


def mask_of(present: Sequence[bool]) -> BlockMask:
    """The most compact mask for ``present`` (True = masked): an offset when the unmasked
    keys form a suffix, else a bool list."""
    first_new = next((i for i, p in enumerate(present) if not p), len(present))
    if any(present[first_new:]):
        return BlockMask(bool_masks=BoolMasks(values=list(present)))
    return BlockMask(offset=first_new)
