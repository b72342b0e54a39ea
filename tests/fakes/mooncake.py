"""Test doubles for clients that cannot run here (the Mooncake store needs its cluster)."""

from __future__ import annotations

from chalicelib.storage.mooncake import OBJECT_NOT_FOUND


class FakeMooncakeStore:
    """In-memory ``MooncakeDistributedStore``: same return-code conventions.

    ``fail_codes`` maps a key to the code its next remove/is_exist returns instead.
    """

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail_codes: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []

    def put(self, key: str, value: bytes) -> int:
        self.objects[key] = value
        return 0

    def remove(self, key: str) -> int:
        self.calls.append(("remove", key))
        if key in self.fail_codes:
            return self.fail_codes.pop(key)
        return 0 if self.objects.pop(key, None) is not None else OBJECT_NOT_FOUND

    def is_exist(self, key: str) -> int:
        self.calls.append(("is_exist", key))
        if key in self.fail_codes:
            return self.fail_codes.pop(key)
        return 1 if key in self.objects else 0
