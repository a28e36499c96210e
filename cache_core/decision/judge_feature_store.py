"""Judge features kept on disk between ``judge-train`` runs, so the public sets are featurised once.

Featurising is the slow part of training: two encoder passes per pair (the int8 cosine and the
fp32 token pass). The public sets (``--shared-data``, ~12,800 pairs) took 5-10 minutes of a
15-minute run on a loaded 2-core machine, and they are the same every time a user retrains with
a new file of their own. A run therefore keeps each feature matrix it computes under
``$SCACHE_HOME/judge-features`` and reuses it when the same pairs come again.

A matrix is found by a digest of everything that decides it: the pairs' texts (not their
labels: a corrected label needs no new features), the encoder (model and backend), the feature
names, and the source of ``judge_features`` itself, so a changed feature computes afresh rather
than reading stale numbers. A file that cannot be read is recomputed; a directory that cannot be
written costs only the reuse.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from cache_core.decision import judge_features
from cache_core.decision.judge_features import FEATURE_NAMES

log = logging.getLogger(__name__)

KEEP_FILES = 16
"""Matrices kept (newest by use); a public-set matrix is ~1.5 MB."""

Pairs = Sequence[tuple]
"""(cached, query, ...) rows; only the two texts decide the features."""


class FeatureStore:
    """Feature matrices on disk by digest of (encoder, feature code, pair texts)."""

    def __init__(self, directory: Path, encoder_identity: str):
        self.directory = Path(directory)
        self._prefix = json.dumps([encoder_identity, FEATURE_NAMES, _feature_code_digest()])

    def features(self, pairs: Pairs, compute: Callable[[Pairs], np.ndarray]) -> np.ndarray:
        """``compute(pairs)``, or the matrix a previous run computed for the same pairs."""
        path = self.directory / f"features-{self.key(pairs)}.npy"
        stored = self._load(path, len(pairs))
        if stored is not None:
            log.info("features of %d pairs reused from %s", len(pairs), path)
            return stored
        matrix = compute(pairs)
        self._save(path, matrix)
        return matrix

    def key(self, pairs: Pairs) -> str:
        digest = hashlib.sha256(self._prefix.encode())
        for row in pairs:
            digest.update(json.dumps([row[0], row[1]]).encode())
        return digest.hexdigest()[:24]

    @staticmethod
    def _load(path: Path, rows: int) -> np.ndarray | None:
        try:
            matrix = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("unreadable feature file %s (%s): computing afresh", path, exc)
            return None
        if matrix.shape != (rows, len(FEATURE_NAMES)):
            log.warning("feature file %s holds %s, not %d x %d: computing afresh", path, matrix.shape, rows,
                        len(FEATURE_NAMES))
            return None
        os.utime(path)  # newest by use survives the pruning
        return matrix

    def _save(self, path: Path, matrix: np.ndarray) -> None:
        partial = path.with_suffix(f".{os.getpid()}.partial")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with partial.open("wb") as f:
                np.save(f, np.asarray(matrix, dtype=np.float64), allow_pickle=False)
            os.replace(partial, path)  # a reader never sees half a file
            self._prune()
        except OSError as exc:
            log.warning("cannot keep features in %s (%s): the next run computes them again", self.directory, exc)
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)

    def _prune(self) -> None:
        files = sorted(self.directory.glob("features-*.npy"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[KEEP_FILES:]:
            old.unlink(missing_ok=True)


def _feature_code_digest() -> str:
    return hashlib.sha256(inspect.getsource(judge_features).encode()).hexdigest()[:16]


def feature_store_for(settings, disabled: bool = False) -> FeatureStore | None:
    """The store training and evaluation share for the cache's encoder (None: ``disabled``)."""
    from cache_core.runtime import scache_home

    if disabled:
        return None
    from cache_core.embedding.onnx import ENCODING_VERSION

    return FeatureStore(scache_home() / "judge-features",
                        f"{settings.model}|{settings.encoder_backend}|encoding {ENCODING_VERSION}")
