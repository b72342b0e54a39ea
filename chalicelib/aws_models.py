"""botocore's service models, read the way a cold container can afford.

botocore's own loader costs a fresh process about 20 ms on its first client: before
loading a model it lists every service directory it ships (some 450) to check that the
service exists, once per model type, and it parses every JSON file with an
``OrderedDict`` hook, a Python call per object of the 1.2 MB ``endpoints.json``.
``ModelLoader`` answers the same questions with the same data: a service exists when
it has an API version with a model of the type asked (what botocore's listing checks,
asked of that one service), and files parse to plain dicts, which keep the file's order
as ``OrderedDict`` did. docs/cold-start.md has the figures.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any, overload

from botocore.exceptions import DataNotFoundError
from botocore.loaders import JSONFileLoader, Loader

#: The suffixes (and how to open them) botocore's data files come with, in its order.
_OPENERS: tuple[tuple[str, Any], ...] = ((".json", open), (".json.gz", gzip.open))


class JsonFiles(JSONFileLoader):  # type: ignore[misc]  # botocore is untyped
    """botocore's JSON file loader, parsing to plain dicts."""

    def load_file(self, file_path: str) -> Any:
        for suffix, opener in _OPENERS:
            path = file_path + suffix
            if os.path.isfile(path):
                with opener(path, "rb") as file:
                    return json.loads(file.read())
        return None


class ServiceNames(Sequence[str]):
    """What ``Loader.list_available_services`` answers, listed only when read as a list:
    ``in`` asks the loader for that service's API versions of the model type."""

    def __init__(self, loader: ModelLoader, type_name: str) -> None:
        self._loader = loader
        self._type_name = type_name

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or not name or name in (os.curdir, os.pardir) or os.sep in name:
            return False  # never a directory of a search path
        try:
            self._loader.list_api_versions(name, self._type_name)
        except DataNotFoundError:
            return False
        return True

    @cached_property
    def _names(self) -> list[str]:
        names: list[str] = Loader.list_available_services(self._loader, self._type_name)
        return names

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        return self._names[index]

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)


class ModelLoader(Loader):  # type: ignore[misc]  # botocore is untyped
    """botocore's loader (the same search paths and extras), checking a service's name
    without listing every service and parsing files to plain dicts."""

    def __init__(self) -> None:
        super().__init__(file_loader=JsonFiles())

    def list_available_services(self, type_name: str) -> Sequence[str]:
        return ServiceNames(self, type_name)
