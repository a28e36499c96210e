"""The contract between a partition (cache_core.store.partition) and its vector index.

Vectors are L2-normalised float32 rows, so a score is a cosine. An index maps the
cache's string entry ids to vectors; it is not thread-safe (the partition's lock is held
around every call). Besides ANN search, it keeps a reference copy the partition can scan in
short steps, which is what the sampled ANN-vs-exact check compares against.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from cache_core.store.faiss import IndexMark


class VectorStore(Protocol):
    @property
    def kind(self) -> str:
        """The index kind (an arm's ``index_kind``), as events report it."""
        ...

    def __len__(self) -> int:
        """Live vectors."""
        ...

    def add(self, entry_id: str, vec: np.ndarray) -> None:
        """Add one vector, replacing the entry's previous one."""
        ...

    def remove(self, entry_id: str) -> bool:
        """Remove one vector; False if it was not there."""
        ...

    def search(self, vec: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Top-k (entry_id, cosine), best first, by the index's own (possibly approximate) search."""
        ...

    # -- vectors back, for the entries that keep none (cache_core.store.partition) ----------

    @property
    def compact_entries(self) -> bool:
        """True: the partition's entries drop their float32 vector once added here, and every
        reader (snapshots, demotion to disk, re-layouts, expiry ghosts) asks ``vectors``."""
        ...

    def vectors(self, entry_ids: list[str]) -> np.ndarray:
        """The vectors of held entries as the store keeps them (decoded), (len, dim) float32."""
        ...

    # -- what the ANN check needs (cache_core.store.ann_check) ---------------------------

    def mark(self) -> IndexMark:
        """Where the index is now: an ANN check later judges the entries present at the mark."""
        ...

    def internal_id(self, entry_id: str) -> int | None:
        """The entry's internal id (ids only grow: an id below a mark's was added before it)."""
        ...

    def exact_rows(self) -> int:
        """Rows of the reference copy."""
        ...

    def exact_block_many(self, mat: np.ndarray, start: int, stop: int, k: int,
                         before: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per query, the exact top-k (scores, internal ids) among rows [start, stop) of the twin."""
        ...

    def labels(self, internal_ids) -> list[str | None]:
        """Entry ids of internal ids (None for one no longer live)."""
        ...
