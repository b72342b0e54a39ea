"""Names inside storages: escaped path components, block-key rendering, URI assembly.

Instance ids and spec names are user strings. Every backend that turns one into a path or
an object key passes it through ``escape_component`` first, which guarantees:

- the component never contains ``/``, NUL or another control character and is never
  empty, ``.`` or ``..``, so a path built from it cannot leave the storage's data root
  (a leading ``.`` is escaped too, which also keeps user names apart from KVCM's own
  hidden files such as health-probe files);
- different strings never give the same component (the escape is reversible);
- the component is made of RFC 3986 unreserved characters only, so a URI carries it
  verbatim and a client gets the same path whether or not it percent-decodes.

Characters outside ``[A-Za-z0-9_.-]`` become ``~XX``, one per UTF-8 byte (``~`` itself
included). Components longer than ``MAX_COMPONENT`` (file names are limited to 255 bytes)
keep a readable head and end in ``~~`` plus a SHA-256 digest of the whole name; ``~~``
never occurs in a short escaped name, so the two forms cannot collide.
"""
from __future__ import annotations

import hashlib
import string
from typing import Sequence
from urllib.parse import quote, urlencode

from ..protocol.errors import InvalidArgumentError

MAX_COMPONENT = 200
_HEAD = 160
_PLAIN = frozenset(string.ascii_letters + string.digits + "_.-")
_UINT64 = (1 << 64) - 1


def escape_component(value: str, also: str = "") -> str:
    """``value`` as one safe path component (see the module docstring).

    ``also`` lists extra characters to escape, for formats that use one of the plain
    characters as a separator.
    """
    if not value:
        raise InvalidArgumentError("an empty name cannot be stored (instance id or spec name)")
    out: list[str] = []
    for index, char in enumerate(value):
        if char in _PLAIN and char not in also and not (index == 0 and char == "."):
            out.append(char)
        else:
            # surrogatepass: JSON can carry lone surrogates; they still need a distinct name.
            out.extend(f"~{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    escaped = "".join(out)
    if len(escaped) <= MAX_COMPONENT:
        return escaped
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    head = escaped[:_HEAD]
    # Never cut an escape sequence in half: the head stays a valid prefix of the escape.
    cut = head.rfind("~", len(head) - 2)
    if cut != -1:
        head = head[:cut]
    return f"{head}~~{digest}"


def hex64(value: int) -> str:
    """A signed or unsigned 64-bit value as 16 lower-case hex digits (two's complement)."""
    return f"{value & _UINT64:016x}"


def build_uri(scheme: str, host: str, path: str, params: Sequence[tuple[str, object]]) -> str:
    """``scheme://host/path?k=v&...`` with the path and the values percent-encoded."""
    query = urlencode([(key, str(value)) for key, value in params], quote_via=quote)
    return f"{scheme}://{host}{quote(path, safe='/')}?{query}"
