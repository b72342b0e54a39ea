"""Radix-tree index of the cached blocks of one instance.

Block keys are prefix-chained (a key identifies its whole token prefix, see API.md "Block
keys"), so the cached blocks form a radix tree whose node ids are the keys themselves: the
parent of ``keys[i]`` in a request is ``keys[i - 1]``. The index keeps those links for the
cached blocks, and for every key the number of its *cached* children -- also for a parent
that is not cached itself, since writes insert children before parents (last block first)
and a partially successful write can store a child without its parent.
"""

from __future__ import annotations


class RadixIndex:
    """Parent links and cached-children counts of cached blocks."""

    __slots__ = ("_parent", "_children")

    def __init__(self) -> None:
        self._parent: dict[int, int | None] = {}
        self._children: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._parent)

    def __contains__(self, key: object) -> bool:
        return key in self._parent

    def add(self, key: int, parent: int | None) -> None:
        """Record a newly cached block under ``parent`` (``None`` for a root block).

        A key listed twice in a row is no parent of itself: it is linked as a root."""
        if key in self._parent:
            return
        if parent == key:
            parent = None
        self._parent[key] = parent
        if parent is not None:
            self._children[parent] = self._children.get(parent, 0) + 1

    def remove(self, key: int) -> int | None:
        """Forget an evicted block; returns its parent so callers can see it become a leaf."""
        parent = self._parent.pop(key)
        if parent is not None:
            left = self._children[parent] - 1
            if left:
                self._children[parent] = left
            else:
                del self._children[parent]
        return parent

    def parent(self, key: int) -> int | None:
        """The parent of a cached block (``None`` for a root)."""
        return self._parent[key]

    def children(self, key: int) -> int:
        """How many cached blocks have ``key`` as their parent."""
        return self._children.get(key, 0)

    def is_leaf(self, key: int) -> bool:
        """True when no cached block has ``key`` as its parent."""
        return key not in self._children
