"""Block keys: as given, or derived from token ids.

By default bit-exactly like upstream (RTP-LLM's rolling hash, API.md "Block keys"). An
instance may register another scheme (``key_scheme``, a KVCM extension, docs/api-v2.md):
the one its engine or router hashes blocks with, so that the keys KVCM derives from a
request's ``token_ids`` are the keys that engine publishes for the same tokens.

- ``vllm_sha256``, ``vllm_sha256_cbor``, ``vllm_xxhash``, ``vllm_xxhash_cbor``: vLLM's
  ``prefix_caching_hash_algo`` chains (0.33): each block hashes ``(parent hash, block tokens,
  extra keys)`` serialized by pickle or canonical CBOR, with SHA-256 or XXH3-128; the first
  block's parent is ``NONE_HASH = hash(seed)``; the key is the hash's low 64 bits, as
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` publishes it.
- ``sglang``: SGLang's page hash (0.5.23): SHA-256 of the parent page's digest and the
  page's tokens as little-endian u32; the key is the digest's first 64 bits.
- ``xxh64``, ``xxh3_64``: XXH64 / XXH3-64 of the parent key (little-endian u64; none for
  the first block) and the block's tokens (little-endian u32), with a seed.

Golden vectors made by the engines' own code pin each (tests/engines/hash_vectors.json).
"""

from __future__ import annotations

import hashlib
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import lru_cache, partial

from .errors import InvalidArgumentError
from .models import KeySchemeConfig
from .validation import invalid

_MASK = (1 << 64) - 1
_SIGN = 1 << 63
_GOLDEN = 0x9E3779B97F4A7C15
_U32_MAX = (1 << 32) - 1
#: Longest seed, LoRA name or path, cache salt a scheme takes (they are kept in the
#: instance's record and hashed into every block).
MAX_SCHEME_TEXT = 1024
#: vLLM's ``NONE_HASH`` seed when PYTHONHASHSEED is unset and the hash is cryptographic
#: (``kv_cache_utils.DEFAULT_NONE_HASH_SEED``); its xxhash chains then seed at random.
VLLM_DEFAULT_SEED = "vllm-none-hash"

#: A block's hash in its scheme's own form: the int64 key (rolling), the unsigned 64-bit
#: value (xxh), or the digest (vLLM, SGLang).
BlockHash = int | bytes


def _signed(value: int) -> int:
    return value - (1 << 64) if value & _SIGN else value


def keys_from_tokens(tokens: Sequence[int], block_size: int, parent_key: int = 0) -> list[int]:
    """Upstream's rolling hash: one key per full block of ``tokens``; a key depends on its
    whole prefix, which ``parent_key`` (the key of the block before ``tokens``) stands for
    when given."""
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


class BlockKeyScheme(ABC):
    """How an instance's token ids become block keys."""

    name: str

    @abstractmethod
    def chain(self, tokens: Sequence[int], block_size: int, parent: BlockHash | None = None) -> list[BlockHash]:
        """The hashes of the full blocks of ``tokens``; ``parent`` is the hash of the block
        before them (None: they start the sequence)."""

    @abstractmethod
    def key(self, block_hash: BlockHash) -> int:
        """The int64 block key of one of ``chain``'s hashes."""

    def keys(self, tokens: Sequence[int], block_size: int) -> list[int]:
        """One key per full block of ``tokens`` (a trailing partial block has none)."""
        key = self.key
        return [key(h) for h in self.chain(tokens, block_size)]


class RollingHash(BlockKeyScheme):
    """Upstream's scheme, the default: a block's hash is its key."""

    name = "rolling"

    def chain(self, tokens: Sequence[int], block_size: int, parent: BlockHash | None = None) -> list[BlockHash]:
        assert not isinstance(parent, bytes), "a rolling-hash parent is its int64 key"
        return list(keys_from_tokens(tokens, block_size, parent or 0))

    def key(self, block_hash: BlockHash) -> int:
        assert isinstance(block_hash, int)
        return block_hash

    def keys(self, tokens: Sequence[int], block_size: int) -> list[int]:
        return keys_from_tokens(tokens, block_size)


ROLLING = RollingHash()


def _u32_words(tokens: Sequence[int]) -> bytes:
    try:
        return struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error:
        raise InvalidArgumentError(f"field 'token_ids': this key scheme takes ids in 0..{_U32_MAX}") from None


# ---------------------------------------------------------------- vLLM


def _cbor_head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes((major << 5 | value,))
    for info, fmt, limit in ((24, ">B", 0xFF), (25, ">H", 0xFFFF), (26, ">I", 0xFFFFFFFF), (27, ">Q", _MASK)):
        if value <= limit:
            return bytes((major << 5 | info,)) + struct.pack(fmt, value)
    raise InvalidArgumentError("field 'token_ids': token ids must fit in 64 bits")


def _cbor(value: object) -> bytes:
    """Canonical CBOR (RFC 8949 §4.2.1; ``cbor2.dumps(value, canonical=True)``) of the
    types a vLLM block hash input holds: ints, bytes, str, tuples, None."""
    if value is None:
        return b"\xf6"
    if isinstance(value, int):
        return _cbor_head(0, value) if value >= 0 else _cbor_head(1, -1 - value)
    if isinstance(value, bytes):
        return _cbor_head(2, len(value)) + value
    if isinstance(value, str):
        data = value.encode("utf-8")
        return _cbor_head(3, len(data)) + data
    assert isinstance(value, tuple), type(value)
    return _cbor_head(4, len(value)) + b"".join(_cbor(item) for item in value)


def _cbor_ints(values: Sequence[int]) -> bytes:
    # A block's tokens, the hot path's part of the input: the usual sizes inline.
    parts = [_cbor_head(4, len(values))]
    for v in values:
        if 0 <= v < 24:
            parts.append(_SMALL[v])
        elif 0 <= v <= 0xFFFF:
            parts.append(b"\x18" + v.to_bytes(1) if v <= 0xFF else b"\x19" + v.to_bytes(2))
        elif 0 <= v <= 0xFFFFFFFF:
            parts.append(b"\x1a" + v.to_bytes(4))
        else:
            parts.append(_cbor(v))
    return b"".join(parts)


_SMALL = [bytes((v,)) for v in range(24)]


def _cbor_input(value: tuple[bytes, tuple[int, ...], object]) -> bytes:
    parent, tokens, extra = value
    return b"\x83" + _cbor(parent) + _cbor_ints(tokens) + _cbor(extra)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xxh3_128(data: bytes) -> bytes:
    import xxhash  # only instances of the xxhash schemes pay for its import

    return xxhash.xxh3_128_digest(data)


#: Each vLLM scheme: whether it serializes with CBOR (else pickle), and its digest.
_VLLM_ALGOS: dict[str, tuple[bool, Callable[[bytes], bytes]]] = {
    "vllm_sha256": (False, _sha256),
    "vllm_sha256_cbor": (True, _sha256),
    "vllm_xxhash": (False, _xxh3_128),
    "vllm_xxhash_cbor": (True, _xxh3_128),
}


class VllmHash(BlockKeyScheme):
    """vLLM's ``hash_block_tokens`` chain under one ``prefix_caching_hash_algo``."""

    def __init__(self, name: str, seed: str, lora: tuple[str, str] | None, cache_salt: str) -> None:
        import pickle  # here: only instances of these schemes pay for its import (cold starts)

        cbor, digest = _VLLM_ALGOS[name]
        dumps = partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)
        self.name = name
        self._serialize: Callable[[tuple[bytes, tuple[int, ...], object]], bytes] = _cbor_input if cbor else dumps
        self._digest = digest
        # ``init_none_hash``: the seed string through the same hash function.
        self._none_hash = digest(_cbor(seed) if cbor else dumps(seed))
        # ``generate_block_hash_extra_keys``: LoRA on every block, the salt on the first.
        self._lora_keys: tuple[tuple[str, ...], ...] = (("lora", *lora),) if lora else ()
        self._salt_keys: tuple[tuple[str, ...], ...] = (("cache_salt", cache_salt),) if cache_salt else ()

    def chain(self, tokens: Sequence[int], block_size: int, parent: BlockHash | None = None) -> list[BlockHash]:
        assert not isinstance(parent, int), "a vLLM parent is its digest"
        serialize, digest, lora = self._serialize, self._digest, self._lora_keys
        hashes: list[BlockHash] = []
        prev = parent or self._none_hash
        for start in range(0, len(tokens) - block_size + 1, block_size):
            extra = lora + self._salt_keys if start == 0 and parent is None else lora
            prev = digest(serialize((prev, tuple(tokens[start : start + block_size]), extra or None)))
            hashes.append(prev)
        return hashes

    def key(self, block_hash: BlockHash) -> int:
        assert isinstance(block_hash, bytes)
        return _signed(int.from_bytes(block_hash[-8:], "big"))


# ---------------------------------------------------------------- SGLang


class SglangPageHash(BlockKeyScheme):
    """SGLang's chained page hash (``mem_cache/utils.get_hash_str``)."""

    name = "sglang"

    def chain(self, tokens: Sequence[int], block_size: int, parent: BlockHash | None = None) -> list[BlockHash]:
        assert not isinstance(parent, int), "an SGLang parent is its digest"
        sha256 = hashlib.sha256
        hashes: list[BlockHash] = []
        prev = parent or b""
        for start in range(0, len(tokens) - block_size + 1, block_size):
            page = tokens[start : start + block_size]
            if max(page) > _U32_MAX:
                # A page with a token past u32 is hashed as u64s behind a 0xff tag.
                if min(page) < 0 or max(page) > _MASK >> 1:
                    raise InvalidArgumentError("field 'token_ids': token ids must be non-negative int64")
                data = b"\xff" + struct.pack(f"<{len(page)}Q", *page)
            else:
                data = _u32_words(page)
            prev = sha256(prev + data).digest()
            hashes.append(prev)
        return hashes

    def key(self, block_hash: BlockHash) -> int:
        assert isinstance(block_hash, bytes)
        return _signed(int.from_bytes(block_hash[:8], "big"))  # ``hash_str_to_int64``


# ---------------------------------------------------------------- XXH64 / XXH3-64


class XxhChain(BlockKeyScheme):
    """XXH64 or XXH3-64 of the parent key and the block's tokens, seeded."""

    def __init__(self, name: str, seed: int) -> None:
        import xxhash

        self.name = name
        self._digest: Callable[..., int] = xxhash.xxh64_intdigest if name == "xxh64" else xxhash.xxh3_64_intdigest
        self._seed = seed

    def chain(self, tokens: Sequence[int], block_size: int, parent: BlockHash | None = None) -> list[BlockHash]:
        assert not isinstance(parent, bytes), "an xxh parent is its unsigned 64-bit hash"
        digest, seed = self._digest, self._seed
        hashes: list[BlockHash] = []
        prefix = b"" if parent is None else struct.pack("<Q", parent & _MASK)
        for start in range(0, len(tokens) - block_size + 1, block_size):
            value = digest(prefix + _u32_words(tokens[start : start + block_size]), seed=seed)
            hashes.append(value)
            prefix = struct.pack("<Q", value)
        return hashes

    def key(self, block_hash: BlockHash) -> int:
        assert isinstance(block_hash, int)
        return _signed(block_hash)


_XXH_DEFAULT_SEEDS = {"xxh64": 0, "xxh3_64": 1337}  # 1337: Dynamo's router seed

#: Every scheme name a registration may give ("" is ``rolling``).
SCHEME_NAMES = ("rolling", *_VLLM_ALGOS, "sglang", *_XXH_DEFAULT_SEEDS)


# ---------------------------------------------------------------- from the registration


_TEXT_FIELDS = ("seed", "lora_name", "lora_path", "cache_salt")


def _refuse_unused(config: KeySchemeConfig, path: str, allowed: tuple[str, ...]) -> None:
    for field in _TEXT_FIELDS:
        if field not in allowed and getattr(config, field):
            raise invalid(f"{path}.{field}", f"does not apply to key scheme {config.name or 'rolling'!r}")


def scheme_from_config(config: KeySchemeConfig | None, path: str = "key_scheme") -> BlockKeyScheme:
    """The scheme a registration's ``key_scheme`` names (None: the default), or
    InvalidArgumentError naming the bad field."""
    if config is None:
        return ROLLING
    return _scheme(config.name, config.seed, config.lora_name, config.lora_path, config.cache_salt, path)


@lru_cache(maxsize=256)
def _scheme(name: str, seed: str, lora_name: str, lora_path: str, cache_salt: str, path: str) -> BlockKeyScheme:
    # Cached: a scheme hashes its seed once, and every context of the same configuration
    # shares it (schemes are immutable).
    config = KeySchemeConfig(name=name, seed=seed, lora_name=lora_name, lora_path=lora_path, cache_salt=cache_salt)
    for field in _TEXT_FIELDS:
        if len(getattr(config, field)) > MAX_SCHEME_TEXT:
            raise invalid(f"{path}.{field}", f"is longer than {MAX_SCHEME_TEXT} characters")
    if name in _VLLM_ALGOS:
        if bool(lora_name) != bool(lora_path):
            missing = "lora_path" if lora_name else "lora_name"
            raise invalid(f"{path}.{missing}", "is required with a LoRA adapter (vLLM hashes its name and path)")
        if not seed and "xxhash" in name:
            raise invalid(
                f"{path}.seed",
                "is required: without PYTHONHASHSEED vLLM seeds its xxhash chains at random; give the engine's",
            )
        return VllmHash(name, seed or VLLM_DEFAULT_SEED, (lora_name, lora_path) if lora_name else None, cache_salt)
    if name in ("", "rolling"):
        _refuse_unused(config, path, ())
        return ROLLING
    if name == "sglang":
        _refuse_unused(config, path, ())
        return SglangPageHash()
    if name in _XXH_DEFAULT_SEEDS:
        _refuse_unused(config, path, ("seed",))
        if not seed:
            return XxhChain(name, _XXH_DEFAULT_SEEDS[name])
        if not seed.isdigit() or not seed.isascii() or int(seed) > _MASK:
            raise invalid(f"{path}.seed", f"must be a decimal integer in 0..{_MASK} for key scheme {name!r}")
        return XxhChain(name, int(seed))
    raise invalid(f"{path}.name", f"names unknown key scheme {name!r} (known: {', '.join(SCHEME_NAMES)})")


def scheme_from_text(text: str) -> BlockKeyScheme:
    """The scheme a command line names: a scheme name, or the JSON of a ``key_scheme``
    (e.g. ``{"name": "vllm_sha256", "seed": "0"}``); "" is the default."""
    if not text.lstrip().startswith("{"):
        return scheme_from_config(KeySchemeConfig(name=text.strip()))
    try:
        config = KeySchemeConfig.model_validate_json(text)
    except ValueError as exc:
        raise invalid("key_scheme", f"is not a key scheme's JSON: {exc}") from None
    return scheme_from_config(config)


def request_keys(
    block_keys: Sequence[int],
    token_ids: Sequence[int],
    scheme: BlockKeyScheme,
    block_size: int,
    limit: int,
    required: bool = True,
) -> list[int]:
    """The keys a request names (``block_keys`` win over ``token_ids``, which become keys by
    the instance's ``scheme``), within ``limit``."""
    if block_keys:
        if len(block_keys) > limit:
            raise InvalidArgumentError(f"field 'block_keys': {len(block_keys)} keys exceed the limit of {limit}")
        return list(block_keys)
    if token_ids:
        if len(token_ids) > limit * block_size:
            raise InvalidArgumentError(
                f"field 'token_ids': {len(token_ids)} tokens exceed the limit of {limit} blocks of {block_size}"
            )
        keys = scheme.keys(token_ids, block_size)
        if keys or not required:
            return keys
        raise InvalidArgumentError(f"field 'token_ids': fewer tokens than one block ({block_size})")
    if required:
        raise InvalidArgumentError("field 'block_keys': block_keys or token_ids is required")
    return []
