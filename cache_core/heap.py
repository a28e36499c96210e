"""Keep the C heap from ratcheting up under the encoder's batch buffers (glibc).

The encoder allocates its activations per batch; a batch of stores is tens of texts, and
its buffers run to megabytes. glibc raises its mmap threshold each time such a block is
freed (up to 32 MB), so later ones come from the heap arenas, and what they free stays
there: the process's RSS ratchets up though nothing is held. bench/soak.py measured the
service at +550 MB over 20 minutes, and the encoder alone under the same batch mix
(1-3 texts, now and then 8-48) at +166 MB after 200 batches, +29 MB when trimmed every
50 batches, +35 MB with the threshold pinned. The service pins the threshold at start
(``pin_mmap_threshold``: a block of 128 KB or more is mapped on its own and unmapped when
freed) and trims every minute (``trim``, from ``cache_core.lifetime.ExpirySweeper``) for the
smaller blocks. Elsewhere than glibc both do nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_libc = None
M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own initial threshold, kept from then on


def _load():
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = libc if hasattr(libc, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc


def trim() -> bool:
    """Return the free pages of every malloc arena to the OS; True if some were released
    (False also where there is no glibc)."""
    libc = _load()
    if not libc:
        return False
    return bool(libc.malloc_trim(0))


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (it no longer rises as large blocks
    are freed); True if set. A MALLOC_MMAP_THRESHOLD_ in the environment is the operator's
    choice and is left alone."""
    libc = _load()
    if not libc or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    return libc.mallopt(M_MMAP_THRESHOLD, threshold) == 1
