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
from collections.abc import Sequence
from urllib.parse import quote

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


class Placeholder(str):
    """A ``%`` directive a URI template keeps verbatim (the block-dependent part of a URI)."""


#: A 64-bit value as 16 hex digits (the argument must already be non-negative).
HEX64 = Placeholder("%016x")
#: A non-negative integer in decimal.
DECIMAL = Placeholder("%d")

Part = str | int | Placeholder


def block_key_args(block_key: int, location_id: int, group_id: int, slot: int) -> tuple[int, ...]:
    """URI template arguments of backends addressed by block key: the key for ``HEX64``."""
    return (block_key & _UINT64,)


def _template_text(parts: Part | Sequence[Part], safe: str) -> str:
    if isinstance(parts, (str, int)):
        parts = (parts,)
    return "".join(p if isinstance(p, Placeholder) else quote(str(p), safe=safe).replace("%", "%%") for p in parts)


def uri_template(
    scheme: str, host: str, path: Part | Sequence[Part], params: Sequence[tuple[str, Part | Sequence[Part]]] = ()
) -> str:
    """``scheme://host/path?k=v&...`` as a %-template: path and values are percent-encoded
    (literal ``%`` doubled), ``Placeholder`` parts are kept as directives. A path or value
    is one part or a sequence of parts joined together."""
    query = "&".join(f"{_template_text(key, '')}={_template_text(value, '')}" for key, value in params)
    head = f"{scheme}://{host}".replace("%", "%%") + _template_text(path, "/")
    return f"{head}?{query}" if params else head
