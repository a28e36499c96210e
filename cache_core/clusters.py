"""Online intent clusters: nearest centroid, new centroid beyond a radius.

Cluster ids are small integers, assigned in order of creation and never reused,
so ``intent_cluster`` means the same thing across arms and over a process's life
(and ``ArmConfig.cluster_thresholds`` can refer to them).
"""
from __future__ import annotations

import threading

import numpy as np


class OnlineClusters:
    """Assigns unit vectors to the nearest centroid (cosine); opens a new cluster
    when every centroid is below ``radius``. Centroids are running means, re-normalised.
    Once ``max_clusters`` exist, everything joins its nearest one."""

    def __init__(self, dim: int, radius: float = 0.55, max_clusters: int = 1024):
        self.dim = dim
        self.radius = radius
        self.max_clusters = max_clusters
        self._centroids = np.zeros((0, dim), dtype=np.float32)
        self._sums = np.zeros((0, dim), dtype=np.float32)
        self._counts: list[int] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._counts)

    def nearest(self, vec: np.ndarray) -> tuple[int, float]:
        """(cluster id, similarity) without updating; (-1, -1.0) when there are none."""
        with self._lock:
            return self._nearest(vec)

    def assign(self, vec: np.ndarray, update: bool = True) -> int:
        """Cluster id for ``vec``; with ``update`` the centroid moves toward it."""
        vec = np.asarray(vec, dtype=np.float32).reshape(-1)
        with self._lock:
            cluster, sim = self._nearest(vec)
            if cluster < 0 or (sim < self.radius and len(self) < self.max_clusters):
                return self._open(vec)
            if update:
                self._sums[cluster] += vec
                self._counts[cluster] += 1
                norm = np.linalg.norm(self._sums[cluster])
                if norm > 0:
                    self._centroids[cluster] = self._sums[cluster] / norm
            return cluster

    def _nearest(self, vec: np.ndarray) -> tuple[int, float]:
        if not self._counts:
            return -1, -1.0
        sims = self._centroids @ np.asarray(vec, dtype=np.float32).reshape(-1)
        best = int(np.argmax(sims))
        return best, float(sims[best])

    def _open(self, vec: np.ndarray) -> int:
        self._centroids = np.vstack([self._centroids, vec[None, :]])
        self._sums = np.vstack([self._sums, vec[None, :]])
        self._counts.append(1)
        return len(self._counts) - 1
