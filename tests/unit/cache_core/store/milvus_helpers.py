"""A milvus-lite store for tests, or a skip saying why there cannot be one here."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from cache_core.store.factory import Backends


@functools.cache
def _lite_unavailable() -> str | None:
    """Why milvus-lite cannot run here (None: it can): started once per test process."""
    try:
        import milvus_lite  # noqa: F401
        from pymilvus import MilvusClient
    except ImportError as exc:
        return f"pymilvus / milvus-lite not installed (extra `milvus`): {exc}"
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as tmp:
            client = MilvusClient(str(Path(tmp) / "probe.db"))
            client.has_collection("probe")
            client.close()
    except Exception as exc:  # noqa: BLE001 - any reason the embedded server does not start
        return f"milvus-lite does not start here: {exc!r}"
    return None


def milvus_backends(tmp_path: Path, name: str = "milvus.db", **config) -> Backends:
    """``Backends`` on a fresh milvus-lite file under ``tmp_path`` (skips the test if
    milvus-lite cannot start)."""
    reason = _lite_unavailable()
    if reason:
        pytest.skip(reason)
    from cache_core.store.milvus import MilvusConfig

    return Backends(milvus=MilvusConfig(uri=str(tmp_path / name), **config))
