"""Block keys: as given, or derived from token ids bit-exactly like upstream (RTP-LLM's
rolling hash, see API.md "Block keys")."""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol.errors import InvalidArgumentError

_MASK = (1 << 64) - 1
_SIGN = 1 << 63
_GOLDEN = 0x9E3779B97F4A7C15


def keys_from_tokens(tokens: Sequence[int], block_size: int, parent_key: int = 0) -> list[int]:
    """One key per full block of ``tokens``; a key depends on its whole prefix, which
    ``parent_key`` (the key of the block before ``tokens``) stands for when given."""
    mask, sign, golden = _MASK, _SIGN, _GOLDEN
    keys: list[int] = []
    h = parent_key  # signed 64-bit, so that >> is arithmetic
    full = len(tokens) - len(tokens) % block_size
    for start in range(0, full, block_size):
        for v in tokens[start : start + block_size]:
            u = (h ^ (v + golden + (h << 12) + (h >> 32))) & mask
            h = u - (1 << 64) if u & sign else u
        keys.append(h)
    return keys


def request_keys(
    block_keys: Sequence[int], token_ids: Sequence[int], block_size: int, limit: int, required: bool = True
) -> list[int]:
    """The keys a request names (``block_keys`` win over ``token_ids``), within ``limit``."""
    if block_keys:
        if len(block_keys) > limit:
            raise InvalidArgumentError(f"field 'block_keys': {len(block_keys)} keys exceed the limit of {limit}")
        return list(block_keys)
    if token_ids:
        if len(token_ids) > limit * block_size:
            raise InvalidArgumentError(
                f"field 'token_ids': {len(token_ids)} tokens exceed the limit of {limit} blocks of {block_size}"
            )
        keys = keys_from_tokens(token_ids, block_size)
        if keys or not required:
            return keys
        raise InvalidArgumentError(f"field 'token_ids': fewer tokens than one block ({block_size})")
    if required:
        raise InvalidArgumentError("field 'block_keys': block_keys or token_ids is required")
    return []
