"""API keys: the bearer credentials of accounts (docs/security.md).

A key reads ``kvcm_<key id>.<secret>``: the key id (16 hex digits) is the lookup key of
its record, the secret 256 random bits. Only SHA-256 of the whole key is stored — with
that much entropy a fast hash is as strong as a slow one, and checking a key costs
microseconds instead of scrypt's tens of milliseconds. The key is shown once, by
createApiKey.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass

PREFIX = "kvcm_"
_KEY = re.compile(r"kvcm_([0-9a-f]{16})\.([A-Za-z0-9_-]{43})")


@dataclass(frozen=True)
class ApiKeyRecord:
    """A stored key: whose it is, its digest, and when it stops working (µs, 0 = never)."""

    key_id: str
    user_name: str
    digest: str
    created_us: int
    expires_us: int

    def expired(self, now_us: int) -> bool:
        return bool(self.expires_us) and now_us >= self.expires_us


def new_api_key() -> tuple[str, str]:
    """A fresh (key id, full key)."""
    key_id = os.urandom(8).hex()
    secret = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")
    return key_id, f"{PREFIX}{key_id}.{secret}"


def digest(api_key: str) -> str:
    """What is stored of a key."""
    return hashlib.sha256(api_key.encode("ascii")).hexdigest()


def key_id_of(token: str) -> str | None:
    """The key id of a well-formed API key, else None."""
    match = _KEY.fullmatch(token)
    return match.group(1) if match else None


def matches(api_key: str, record: ApiKeyRecord) -> bool:
    """Whether ``api_key`` is the key ``record`` was made from (constant-time)."""
    return hmac.compare_digest(digest(api_key), record.digest)
