"""Where a store's vectors live: ``Backends`` (the deployment's Milvus and disk-tier
directory) and one vector index for a store's conversation scope, of the kind its arm names:
``milvus`` (cache_core.store.milvus, the vectors in a Milvus collection) or any of the
in-process FAISS kinds (cache_core.store.faiss / kinds)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cache_core.store.base import VectorStore
from cache_core.store.faiss import IndexSpec, VectorIndex


@dataclass(frozen=True)
class Backends:
    """Where the out-of-process kinds keep their vectors (the deployment's, not an arm's)."""

    milvus: object | None = None
    """A ``cache_core.store.milvus.MilvusConfig`` (None: arms of kind ``milvus`` cannot be built)."""
    disk_dir: Path | None = None
    """Where stores keep their disk tiers (cache_core.store.disk_tier), a file each (None: a
    temporary directory of the process)."""


def new_index(dim: int, spec: IndexSpec, backends: Backends | None = None,
              key: tuple[str, str, str] = ("default", "default", "default"),
              scope: str | None = None) -> VectorStore:
    """An empty index for ``spec``; ``key`` (namespace, experiment, arm) and ``scope`` name
    where a shared backend keeps it."""
    if spec.kind == "milvus":
        from cache_core.store.milvus import MilvusIndex  # pymilvus only where an arm uses it

        config = backends.milvus if backends is not None else None
        if config is None:
            raise ValueError("index kind milvus needs a Milvus URI (SCACHE_CACHE__MILVUS_URI)")
        return MilvusIndex(dim, spec, config, key, scope)
    return VectorIndex(dim, spec)


def discard(index: VectorStore) -> None:
    """The store drops ``index``: a shared backend deletes the vectors it held."""
    drop = getattr(index, "discard", None)
    if drop is not None:
        drop()
