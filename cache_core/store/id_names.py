"""Entry ids by internal id for a ``VectorIndex`` (cache_core.store.faiss), whose internal
ids only grow (an add takes the next one): a list from ``base`` on, one 8 B slot per id
(None once removed), instead of a ``dict[int, str]`` (~42 B per entry at 10^6: its index
table and its 24 B hash/key/value rows, kept two thirds full).

Removals leave holes; when they are more than half of the list, its older half moves out:
the live ids there (the entries that stay hot while newer ones come and go) into a small
dict, the holes dropped. The list so stays within about twice the entries it names, however
long the store churns.
"""
from __future__ import annotations

import sys

# Below this many slots the list is never cut (a cut costs a pass over half of it).
MIN_CUT = 1024


class InternalNames:
    """``get`` / ``add`` / ``pop`` of the entry id under an internal id."""

    def __init__(self):
        self._base = 0
        """The internal id of ``_names[0]``."""
        self._names: list[str | None] = []
        self._live = 0
        """Names in ``_names`` (not None)."""
        self._old: dict[int, str] = {}
        """Live names under internal ids below ``_base``."""

    def __len__(self) -> int:
        return self._live + len(self._old)

    def nbytes(self) -> int:
        """The list's and the dict's own size (the entry ids are the entries')."""
        return sys.getsizeof(self._names) + sys.getsizeof(self._old)

    def get(self, internal: int) -> str | None:
        """The entry id under ``internal`` (None: removed, never added, or -1, FAISS's empty slot)."""
        at = internal - self._base
        if at >= 0:
            return self._names[at] if at < len(self._names) else None
        return self._old.get(internal)

    def add(self, internal: int, name: str) -> None:
        """Name a new internal id: past every id added so far (ids only grow)."""
        at = internal - self._base
        if at < len(self._names):
            raise ValueError(f"internal id {internal} is not new (next: {self._base + len(self._names)})")
        if at > len(self._names):  # an id skipped: nothing under it
            self._names.extend([None] * (at - len(self._names)))
        self._names.append(name)
        self._live += 1

    def pop(self, internal: int) -> str | None:
        """Forget ``internal``; its entry id, or None if it had none."""
        at = internal - self._base
        if at < 0:
            return self._old.pop(internal, None)
        if at >= len(self._names) or self._names[at] is None:
            return None
        name, self._names[at] = self._names[at], None
        self._live -= 1
        if len(self._names) > max(MIN_CUT, 2 * self._live):
            self._cut()
        return name

    def _cut(self) -> None:
        """Move the older half of the list out: its live names to ``_old``."""
        half = len(self._names) // 2
        for at, name in enumerate(self._names[:half]):
            if name is not None:
                self._old[self._base + at] = name
                self._live -= 1
        del self._names[:half]
        self._base += half
