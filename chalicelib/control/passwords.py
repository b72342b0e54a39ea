"""Salted password hashes (scrypt). Only the encoded hash is ever stored.

Encoding: ``scrypt$<log2 n>$<r>$<p>$<salt b64>$<hash b64>``; the parameters travel with
the hash so they can be raised later without invalidating stored accounts.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os

_LOG2_N, _R, _P, _DKLEN, _SALT_BYTES = 14, 8, 1, 32, 16
# 128 * r * n bytes of working memory, plus headroom.
_MAXMEM = 2 * 128 * _R * (1 << _LOG2_N)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _scrypt(password: str, salt: bytes, log2_n: int, r: int, p: int, dklen: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=1 << log2_n,
        r=r,
        p=p,
        dklen=dklen,
        maxmem=max(_MAXMEM, 2 * 128 * r * (1 << log2_n)),
    )


def hash_password(password: str) -> str:
    """A new salted hash of ``password``."""
    salt = os.urandom(_SALT_BYTES)
    digest = _scrypt(password, salt, _LOG2_N, _R, _P, _DKLEN)
    return f"scrypt${_LOG2_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches ``encoded`` (constant-time comparison)."""
    try:
        scheme, log2_n, r, p, salt, digest = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = _scrypt(password, base64.b64decode(salt), int(log2_n), int(r), int(p), len(expected))
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


@functools.cache
def dummy_hash() -> str:
    """A hash to check against when the account does not exist, so that a miss costs as
    much as a wrong password (no user enumeration by timing)."""
    return hash_password(_b64(os.urandom(12)))
