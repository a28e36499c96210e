"""Crash-safe file writes (the cache's snapshots, the feedback follower's state, the
publisher's spool). A leaf module: standard library only."""
from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a create, rename or unlink in it) survive a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, data: bytes) -> None:
    """Make ``path`` hold ``data``, all or nothing across a crash: a temporary file beside it,
    fsynced, renamed over it, and the directory fsynced so the rename itself is kept."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
