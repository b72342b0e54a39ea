"""moto's S3 kept on disk, so that blocks copied to an S3 tier survive a stop or a kill.

moto keeps buckets and objects in memory. ``S3Mirror.attach`` wraps the four methods of
moto's S3 backend that every bucket and object write goes through (``create_bucket``,
``delete_bucket``, ``put_object``: PutObject, CopyObject, CompleteMultipartUpload, POST;
``delete_object``: DeleteObject, DeleteObjects): under one lock, moto applies the change,
then the bucket's or the key's new state is written under ``<state>/s3/`` before moto
answers. A start puts it all back into moto (``restore``) before anything can call S3.

Layout: ``<state>/s3/<bucket>/bucket.json`` (region, account) and one file per object,
``<bucket>/objects/<sha256 of the key>``: a JSON header line (key, size) then the bytes,
written to a ``.partial`` file and renamed over the old one. A deleted bucket's directory
is renamed to ``.<bucket>.deleted`` before it is removed. What is kept is each key's
latest bytes: not versions, metadata, tags or ACLs (nothing in the app uses them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chalicelib.observability.logging import logger

BUCKET_FILE = "bucket.json"
OBJECTS_DIR = "objects"
PARTIAL_SUFFIX = ".partial"
DELETED_SUFFIX = ".deleted"
#: Names that are safe as a directory name (S3's own rules are stricter).
SAFE_BUCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: What runs after a wrapped moto method: ``(backend, its result, bucket name, key name)``.
AfterChange = Callable[[Any, Any, str, str], None]


def object_file_name(key_name: str) -> str:
    """A fixed-length file name for any key (keys may be 1 KiB and hold ``/``)."""
    return hashlib.sha256(key_name.encode("utf-8")).hexdigest()


def _write_replacing(path: Path, chunks: tuple[bytes, ...]) -> None:
    """Write ``path`` whole or not at all (a kill leaves the old file or the new one).

    Not fsync'd: the page cache survives the death of the stack, SIGKILL included; only a
    machine crash could lose it, which ``restore`` detects by the size in the header.
    """
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    with open(partial, "wb") as file:
        for chunk in chunks:
            file.write(chunk)
    os.replace(partial, path)


class S3Mirror:
    """moto's S3 buckets and objects mirrored under ``root`` while attached."""

    #: The one instance moto's backend writes to (its methods are patched process-wide).
    _attached: S3Mirror | None = None

    def __init__(self, root: Path) -> None:
        self.root = root
        # Held across a change in moto and its write to disk: the files' order of changes
        # is the order moto applied them in.
        self._lock = threading.Lock()
        self._originals: dict[str, Callable[..., Any]] = {}

    def _bucket_dir(self, bucket_name: str) -> Path | None:
        if SAFE_BUCKET_NAME.fullmatch(bucket_name) is None:
            logger.warning("local S3: bucket %r is not kept on disk (its name is not a safe file name)", bucket_name)
            return None
        return self.root / bucket_name

    # ------------------------------------------------------------ restore

    def restore(self) -> tuple[int, int]:
        """Put every kept bucket and object back into moto; returns ``(buckets, objects)``.

        A bucket whose creation was cut short (no ``bucket.json``), a ``.partial`` file and
        a deleted bucket's leftover are removed; an object file shorter than its header
        says (a machine crash) is skipped with a warning.
        """
        from moto.s3.models import s3_backends

        if not self.root.is_dir():
            return 0, 0
        buckets = objects = 0
        for bucket_dir in sorted(self.root.iterdir()):
            described = bucket_dir / BUCKET_FILE
            if bucket_dir.name.endswith(DELETED_SUFFIX) or not described.is_file():
                shutil.rmtree(bucket_dir, ignore_errors=True)
                continue
            about = json.loads(described.read_text(encoding="utf-8"))
            backend = s3_backends[about["account"]][about["partition"]]
            backend.create_bucket(bucket_dir.name, about["region"])
            buckets += 1
            for path in sorted((bucket_dir / OBJECTS_DIR).iterdir()):
                if path.name.endswith(PARTIAL_SUFFIX):
                    path.unlink()
                    continue
                with open(path, "rb") as file:
                    header = json.loads(file.readline())
                    value = file.read()
                if len(value) != header["size"]:
                    logger.warning("local S3: %s/%s is cut short on disk; skipped", bucket_dir.name, header["key"])
                    continue
                backend.put_object(bucket_dir.name, header["key"], value, disable_notification=True)
                objects += 1
        return buckets, objects

    # ------------------------------------------------------------ mirror

    def attach(self) -> None:
        """Mirror every bucket and object change moto makes from now on, before it answers."""
        from moto.s3.models import S3Backend

        if S3Mirror._attached is not None:
            raise RuntimeError("an S3 mirror is already attached in this process")
        self.root.mkdir(parents=True, exist_ok=True)
        S3Mirror._attached = self
        wrappers = {
            "create_bucket": self._after_create_bucket,
            "delete_bucket": self._after_delete_bucket,
            "put_object": self._after_key_change,
            "delete_object": self._after_key_change,
        }
        for name, after in wrappers.items():
            self._originals[name] = original = getattr(S3Backend, name)
            setattr(S3Backend, name, self._mirrored(original, after))

    def detach(self) -> None:
        """Undo ``attach`` (idempotent)."""
        from moto.s3.models import S3Backend

        for name, original in self._originals.items():
            setattr(S3Backend, name, original)
        self._originals.clear()
        if S3Mirror._attached is self:
            S3Mirror._attached = None

    def _mirrored(self, original: Callable[..., Any], after: AfterChange) -> Callable[..., Any]:
        def change_then_mirror(backend: Any, bucket_name: str, *args: Any, **kwargs: Any) -> Any:
            # put_object and delete_object name the key second, positionally or not (unused
            # by the bucket methods).
            key_name = kwargs.get("key_name", args[0] if args else "")
            with self._lock:
                result = original(backend, bucket_name, *args, **kwargs)  # raises: nothing changed
                after(backend, result, bucket_name, key_name)
            return result

        return change_then_mirror

    def _after_create_bucket(self, backend: Any, bucket: Any, bucket_name: str, key_name: str) -> None:
        bucket_dir = self._bucket_dir(bucket_name)
        if bucket_dir is None:
            return
        (bucket_dir / OBJECTS_DIR).mkdir(parents=True, exist_ok=True)
        about = {"region": bucket.region_name, "account": backend.account_id, "partition": bucket.partition}
        _write_replacing(bucket_dir / BUCKET_FILE, (json.dumps(about).encode(),))

    def _after_delete_bucket(self, backend: Any, bucket: Any, bucket_name: str, key_name: str) -> None:
        bucket_dir = self._bucket_dir(bucket_name)
        if bucket is None or bucket_dir is None or not bucket_dir.exists():  # None: not empty, kept
            return
        # One rename is what makes the deletion stick; the removal may be cut short.
        deleted = bucket_dir.with_name(f".{bucket_name}{DELETED_SUFFIX}")
        os.replace(bucket_dir, deleted)
        shutil.rmtree(deleted)

    def _after_key_change(self, backend: Any, result: Any, bucket_name: str, key_name: str) -> None:
        """Write the key's latest bytes, or remove its file when it has none (deleted, or
        hidden by a delete marker)."""
        from moto.s3.models import FakeKey

        bucket_dir = self._bucket_dir(bucket_name)
        if bucket_dir is None:
            return
        path = bucket_dir / OBJECTS_DIR / object_file_name(key_name)
        latest = backend.get_bucket(bucket_name).keys.get(key_name)
        if isinstance(latest, FakeKey):
            value: bytes = latest.value
            header = json.dumps({"key": key_name, "size": len(value)}).encode() + b"\n"
            _write_replacing(path, (header, value))
        else:
            path.unlink(missing_ok=True)
