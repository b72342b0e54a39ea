"""Golden block-key vectors made by the engines' own hashing code (``hash_vectors.json``).

``python -m tests.engines.make_hash_vectors`` (after ``make``: the wheels of
requirements-engines.txt are unpacked into ``.venv/engines``, off sys.path) loads, by path:

- vLLM 0.33's ``vllm/utils/hashing.py`` (its four ``prefix_caching_hash_algo`` functions) and
  ``vllm/v1/core/kv_cache_utils.py`` (``init_none_hash``, ``get_request_block_hasher``,
  ``generate_block_hash_extra_keys``, ``hash_block_tokens``, ``maybe_convert_block_hash``),
  with the vLLM modules they import stubbed: none of the code run here is in a stub;
- SGLang 0.5.23's ``sglang/srt/mem_cache/utils.py`` (``get_hash_str``, ``hash_str_to_int64``)
  and its C++ page hash ``cpp_utils/hash_binding.cpp``, compiled here with pybind11 the way
  ``cpp_utils/native_hash.py`` builds it (minus torch's loader, which is stubbed).

For each case it records the block hashes the engine computes from the tokens and the int64
keys the engine publishes for them (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, its
0.33 default; SGLang's ``hash_str_to_int64``), as KVCM's signed int64. The unit tests check
``chalicelib/protocol/block_keys.py`` against the file without the wheels;
``tests/integration/engines/test_hash_vectors.py`` runs this again and compares.

The ``xxh64`` and ``xxh3_64`` schemes have no engine code in these wheels (Dynamo's and
Mooncake's are Rust and C++ outside them): their vectors come from the ``xxhash`` library
over the byte layout docs/api-v2.md defines, built here independently of KVCM's code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import sysconfig
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINES_DIR = REPO_ROOT / ".venv" / "engines"
VECTORS = Path(__file__).with_name("hash_vectors.json")
#: Where the SGLang page hash is compiled (once per source file).
BUILD_DIR = REPO_ROOT / ".venv" / "engines-build"

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


class _Stub(types.ModuleType):
    """A module standing in for an engine import: any name is a fresh placeholder class
    (the code run here never uses them; they appear in annotations and imports only)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


@contextmanager
def _modules(stubs: dict[str, types.ModuleType]) -> Iterator[None]:
    """``stubs`` in sys.modules while the engine files load, the previous entries after."""
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _stubs(*names: str, **modules: types.ModuleType) -> dict[str, types.ModuleType]:
    """Stub modules for ``names`` (and their parent packages), and the given real ones."""
    out: dict[str, types.ModuleType] = {}
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            out.setdefault(".".join(parts[:i]), _Stub(".".join(parts[:i])))
    for name, module in modules.items():
        out[name.replace("__", ".")] = module
    return out


# ---------------------------------------------------------------- vLLM


class _LoraRequest:
    def __init__(self, lora_name: str, lora_path: str) -> None:
        self.lora_name, self.lora_path = lora_name, lora_path


class _Request:
    """The attributes of ``vllm.v1.request.Request`` the block hasher reads (text only)."""

    def __init__(self, tokens: list[int], lora: tuple[str, str] | None, cache_salt: str | None) -> None:
        self.all_token_ids = tokens
        self.num_tokens = len(tokens)
        self.block_hashes: list[bytes] = []
        self.mm_features: list[Any] = []
        self.lora_request = _LoraRequest(*lora) if lora else None
        self.cache_salt = cache_salt
        self.prompt_embeds = None


def load_vllm(engines: Path = ENGINES_DIR) -> tuple[types.ModuleType, types.ModuleType]:
    """vLLM's ``hashing`` and ``kv_cache_utils`` modules, loaded from the wheel by path."""
    root = engines / "vllm"
    logger = types.ModuleType("vllm.logger")
    logger.init_logger = lambda name: __import__("logging").getLogger(name)  # type: ignore[attr-defined]
    envs = types.ModuleType("vllm.envs")
    envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True  # type: ignore[attr-defined]  # 0.33's default
    math_utils = types.ModuleType("vllm.utils.math_utils")
    math_utils.cdiv = lambda a, b: -(a // -b)  # type: ignore[attr-defined]
    stubs = _stubs(
        "vllm.config",
        "vllm.multimodal.utils",
        "vllm.v1.kv_cache_interface",
        "vllm.v1.kv_cache_spec_registry",
        "vllm.v1.request",
        "vllm.v1.utils",
        "vllm.v1.core",
        "vllm.utils",
        vllm__logger=logger,
        vllm__envs=envs,
        vllm__utils__math_utils=math_utils,
    )
    stubs["vllm"].envs = envs  # type: ignore[attr-defined]  # ``from vllm import envs``
    with _modules(stubs):
        hashing = _load("vllm.utils.hashing", root / "utils" / "hashing.py")
        utils = _load("vllm.v1.core.kv_cache_utils", root / "v1" / "core" / "kv_cache_utils.py")
    return hashing, utils


def vllm_case(
    hashing: types.ModuleType,
    utils: types.ModuleType,
    algo: str,
    seed: str | None,
    block_size: int,
    tokens: list[int],
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
) -> dict[str, Any]:
    """One vector: vLLM's block hashes of ``tokens`` with PYTHONHASHSEED ``seed`` (None:
    unset), as its request block hasher computes them and its KV events publish them."""
    hash_fn = hashing.get_hash_fn_by_name(algo)
    saved = os.environ.pop("PYTHONHASHSEED", None)
    try:
        if seed is not None:
            os.environ["PYTHONHASHSEED"] = seed
        utils.init_none_hash(hash_fn)
    finally:
        os.environ.pop("PYTHONHASHSEED", None)
        if saved is not None:
            os.environ["PYTHONHASHSEED"] = saved
    hashes = utils.get_request_block_hasher(block_size, hash_fn)(_Request(tokens, lora, cache_salt))
    scheme: dict[str, Any] = {"name": f"vllm_{algo}"}
    if seed is not None:
        scheme["seed"] = seed
    if lora:
        scheme["lora_name"], scheme["lora_path"] = lora
    if cache_salt:
        scheme["cache_salt"] = cache_salt
    return {
        "engine": "vllm==0.33.0",
        "scheme": scheme,
        "block_size": block_size,
        "tokens": tokens,
        "hashes": [bytes(h).hex() for h in hashes],
        "keys": [_signed(utils.maybe_convert_block_hash(h)) for h in hashes],
    }


# ---------------------------------------------------------------- SGLang


def _compile_page_hash(source: Path, name: str, build_dir: Path) -> types.ModuleType:
    """SGLang's C++ page hash as ``native_hash.py`` builds it (-O3 -std=c++17, -lcrypto),
    with pybind11's headers instead of torch's extension loader."""
    import pybind11

    build_dir.mkdir(parents=True, exist_ok=True)
    target = build_dir / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
        include = sysconfig.get_paths()["include"]
        subprocess.run(
            ["g++", "-O3", "-std=c++17", "-DNDEBUG", "-shared", "-fPIC", f"-DTORCH_EXTENSION_NAME={name}"]
            + [f"-I{include}", f"-I{pybind11.get_include()}", str(source), "-lcrypto", "-o", str(target)],
            check=True,
            capture_output=True,
        )
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_sglang(engines: Path = ENGINES_DIR, build_dir: Path = BUILD_DIR) -> types.ModuleType:
    """SGLang's ``mem_cache/utils.py`` from the wheel, with its native page hash compiled."""
    root = engines / "sglang" / "srt" / "mem_cache"
    loader = types.ModuleType("sglang.srt.utils.cpp_extension_loader")

    def load_extension_with_recovery(name: str, sources: list[str], **_: Any) -> types.ModuleType:
        return _compile_page_hash(Path(sources[0]), name, build_dir)

    loader.load_extension_with_recovery = load_extension_with_recovery  # type: ignore[attr-defined]
    stubs = _stubs(
        "sglang.kernels.ops.kvcache.mla_buffer",
        "sglang.srt.environ",
        "sglang.srt.mem_cache.evict_policy",
        "sglang.srt.mem_cache.cpp_utils",
        "sglang.srt.utils",
        sglang__srt__utils__cpp_extension_loader=loader,
    )
    with _modules(stubs):
        native = _load("sglang.srt.mem_cache.cpp_utils.native_hash", root / "cpp_utils" / "native_hash.py")
        native._load_native_hash_module()  # imports the loader: compiled now, cached after
        stubs["sglang.srt.mem_cache.cpp_utils"].native_hash = native  # type: ignore[attr-defined]
        return _load("sglang.srt.mem_cache.utils", root / "utils.py")


def sglang_case(utils: types.ModuleType, block_size: int, tokens: list[int]) -> dict[str, Any]:
    """One vector: SGLang's page hashes of ``tokens`` (full pages) and the int64 its KV
    events publish for each (``hash_str_to_int64``)."""
    full = tokens[: len(tokens) - len(tokens) % block_size]
    hashes = utils.get_hash_str(full, None, page_size=block_size) if full else []
    return {
        "engine": "sglang==0.5.23",
        "scheme": {"name": "sglang"},
        "block_size": block_size,
        "tokens": tokens,
        "hashes": list(hashes),
        "keys": [utils.hash_str_to_int64(h) for h in hashes],
    }


# ---------------------------------------------------------------- XXH64 / XXH3-64


def xxh_case(name: str, seed: int | None, block_size: int, tokens: list[int]) -> dict[str, Any]:
    """One vector of a generic xxHash chain (no engine code: the ``xxhash`` library over
    little-endian u64 parent key + u32 tokens, docs/api-v2.md)."""
    import xxhash

    digest: Callable[..., int] = xxhash.xxh64_intdigest if name == "xxh64" else xxhash.xxh3_64_intdigest
    default_seed = 0 if name == "xxh64" else 1337
    keys: list[int] = []
    parent: bytes = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        data = parent + b"".join(t.to_bytes(4, "little") for t in tokens[start : start + block_size])
        value = digest(data, seed=default_seed if seed is None else seed)
        keys.append(_signed(value))
        parent = value.to_bytes(8, "little")
    scheme: dict[str, Any] = {"name": name}
    if seed is not None:
        scheme["seed"] = str(seed)
    return {
        "engine": "xxhash",  # the library, not an engine
        "scheme": scheme,
        "block_size": block_size,
        "tokens": tokens,
        "hashes": [],
        "keys": keys,
    }


# ---------------------------------------------------------------- the file


def _token_cases() -> list[tuple[int, list[int]]]:
    rng = random.Random(21)
    return [
        (4, list(range(1, 11))),  # two full blocks and a partial one
        (16, [rng.randrange(0, 152_064) for _ in range(64)]),
    ]


def vllm_cases(engines: Path = ENGINES_DIR) -> list[dict[str, Any]]:
    """vLLM's cases, computed by its code loaded from ``engines``."""
    hashing, utils = load_vllm(engines)
    cases = [
        vllm_case(hashing, utils, algo, seed, block_size, tokens)
        for block_size, tokens in _token_cases()
        for algo, seeds in (
            ("sha256", (None, "0")),
            ("sha256_cbor", (None, "1234")),
            ("xxhash", ("0",)),
            ("xxhash_cbor", ("42",)),
        )
        for seed in seeds
    ]
    tokens, lora = list(range(100, 112)), ("sql-lora", "/adapters/sql")
    cases.append(vllm_case(hashing, utils, "sha256", None, 4, tokens, lora=lora))
    cases.append(vllm_case(hashing, utils, "sha256_cbor", "7", 4, tokens, cache_salt="tenant-a"))
    cases.append(vllm_case(hashing, utils, "xxhash", "0", 4, tokens, lora=lora, cache_salt="t"))
    return cases


def sglang_cases(engines: Path = ENGINES_DIR, build_dir: Path = BUILD_DIR) -> list[dict[str, Any]]:
    """SGLang's cases, computed by its code loaded from ``engines`` (compiled into ``build_dir``)."""
    utils = load_sglang(engines, build_dir)
    cases = [sglang_case(utils, block_size, tokens) for block_size, tokens in _token_cases()]
    cases.append(sglang_case(utils, 4, [1, 2, (1 << 32) + 5, 4, 5, 6, 7, 8]))  # a token past u32
    return cases


def xxh_cases() -> list[dict[str, Any]]:
    """The generic xxHash chains' cases."""
    cases = [xxh_case(name, None, size, tokens) for size, tokens in _token_cases() for name in ("xxh64", "xxh3_64")]
    cases.append(xxh_case("xxh64", 99, 4, list(range(100, 112))))
    cases.append(xxh_case("xxh3_64", 0, 4, list(range(100, 112))))
    return cases


def build_vectors(engines: Path = ENGINES_DIR, build_dir: Path = BUILD_DIR) -> dict[str, Any]:
    """Every case."""
    cases = vllm_cases(engines) + sglang_cases(engines, build_dir) + xxh_cases()
    return {"generator": "tests/engines/make_hash_vectors.py", "cases": cases}


def main() -> int:
    VECTORS.write_text(json.dumps(build_vectors(), indent=1) + "\n")
    print(f"wrote {VECTORS.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
