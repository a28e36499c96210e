"""Intent clusters: online nearest-centroid assignment, periodic k-means retrains.

Hot path (``assign``): the nearest centroid by cosine; a query farther than
``radius`` from every centroid opens a new cluster (until ``max_clusters``).
Centroids are running means, re-normalised.

Retrain: every query seen is offered to a reservoir sample. When the number
seen reaches ``retrain_min`` and then each time it grows by ``retrain_growth``
(x2 by default), spherical ``faiss.Kmeans`` is fitted to the sample (in a
background thread unless ``background=False``), with k = the current number of
clusters (bounded by the sample size). The new centroids are matched to the
old ones by maximum total cosine (Hungarian algorithm); a new centroid whose
match is at least ``min_match`` inherits the old id, the others get fresh ids.

Ids are small integers, never reused, so ``intent_cluster`` means the same
thing across arms, across retrains (as far as the clusters themselves persist)
and across restarts (the state is part of the cache snapshot), and
``ArmConfig.cluster_thresholds`` can refer to them.

Across replicas (cache_core.state.replication) the ids must mean the same intent on every
replica, so there one model is shared: ``fleet_ids`` draws new ids at random from
[FLEET_ID_MIN, 2^31) (no coordination, and no clash with the small ids a single
instance had); the ``listener`` hears of every cluster opened here and of every
retrained model, and the other replicas take them in with ``adopt_open`` and
``adopt_model``. Models are ordered by (generation, origin): a retrain publishes
generation + 1, and when two replicas retrain at once every replica keeps the same
one. Adopting a model keeps the clusters it cannot know (opened after its sample was
taken) and drops those it retired. Centroids still move with each replica's own
traffic between retrains; the ids do not.

Concurrent opens. An intent first seen on two replicas within the replication lag
gets a cluster on each, under two ids. So every open (own and adopted) is remembered
for a while (opening vector, time, origin), and two opens from different origins at
most ``concurrent_open_window_ms`` apart whose opening vectors are within ``radius``
are one intent: the one with the smaller (opened_at_ms, id) survives, the other is
folded into it (or, arriving, not added), on every replica alike, since each decides
from the same two messages. Opens join transitively (a loser's open is remembered
too), so while they are remembered the outcome does not depend on the order they
arrive in. A local query that would open a cluster within reach of such a concurrent
open joins it instead. Merged ids (loser -> survivor, ``merged_ids``) are logged,
later opens of a loser are ignored, and a model naming a loser is read as naming its
survivor. An open delivered more than ``OPEN_MEMORY_MS`` behind the newest one (a long
outage) is no longer matched; the retrain merge below catches the pair once the two
centroids agree that closely.

Retrain merge. Before k-means, old centroids at least ``merge_above`` alike are merged
(survivor: the larger count, then the smaller id), so k shrinks when two clusters have
drifted into one (also on a single instance); the merged-away ids count as retired.

Refresh. The topic is time-retained and retrains grow rare (the sample must double), so
the model message and the opens that built the current set fall out of it; a replica
starting without a snapshot would then know only the clusters opened within the retention
and give every older intent a new id of its own. So the model in use is re-sent
(``model_in_use``; when, see cache_core.state.replication) as the same model: the same
generation, model origin and ``trained_at_ms``, with every cluster held now (ids, counts,
centroids), the open times of those opened after ``trained_at_ms`` and ``merged_ids``.
Because it orders like the model it re-sends, ``adopt_model`` takes it as follows:

* a replica on a later model ignores it, as any older model;
* a replica on an earlier one (a fresh replica: generation 0) installs it like a retrain:
  the re-sender's ids and centroids, plus the clusters it heard opened after
  ``trained_at_ms`` that the re-sender had not heard of yet (their opens were on their
  way; with ``trained_at_ms = now`` it would drop them), less those the merges name;
  the open times come along, so a later model's adoption keeps the same clusters as on
  the replicas that were there;
* a replica on the same model (every replica running: the model in use everywhere, also
  before any retrain, at (0, "")) only adds the clusters and merges it does not know.
  Normally there are none, since it saw them opened: its ids, centroids, generation and
  the clusters opened since stay as they are. (A fresh replica that read the re-sent model
  from the topic but lost opens older than the topic's start gets them back this way.)

A bumped generation would instead be a new model for everyone: each running replica's
centroids replaced by the re-sender's, and any cluster opened meanwhile elsewhere dropped.
A cluster opened here is left out of a refresh until its open is queued, so the open
precedes it in the topic and every replica remembers it for the concurrent-open merge.

Size. ``OnlineClusters`` is one class over ~500 lines, past the project's ~300: assign,
open, merge, retrain, refresh and its state round trip all read and write the same
centroids under one lock (and a second one for retrains), and their ordering rules above
are invariants of that shared state. Splitting it by operation would spread one lock's
invariants over several modules; a split by state (the model vs. the opens and merges
remembered for the topic) is the candidate when it grows again.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field

import faiss
import numpy as np
from scipy.optimize import linear_sum_assignment

from cache_core.state.codec import decode_vec, encode_vec

log = logging.getLogger(__name__)

MIN_POINTS_PER_CLUSTER = 5
FLEET_ID_MIN = 1_000_000
FLEET_ID_MAX = 2**31 - 1
OPEN_MEMORY_MS = 10 * 60_000  # opens remembered for the concurrent-open merge, behind the newest one
OPENS_MAX = 512  # ... and at most this many (1.5 KB each at 384 dims)
MERGED_MAX = 1024  # loser -> survivor pairs kept


@dataclass
class ClusterModel:
    """A retrained set of clusters, as replicas exchange it (centroids: rows, unit length)."""

    generation: int
    origin: str
    trained_at_ms: int
    """When the retrain took its sample: clusters opened later are not in it, and survive its adoption."""
    ids: list[int]
    counts: list[int]
    centroids: np.ndarray = field(repr=False)
    opened_at_ms: dict[int, int] = field(default_factory=dict)
    """Open times of the clusters among ``ids`` opened after ``trained_at_ms`` (see "Refresh")."""
    merged_ids: dict[int, int] = field(default_factory=dict)
    """Loser -> survivor, as the sender knows them (a refresh carries them)."""

    def order(self) -> tuple[int, str]:
        return self.generation, self.origin


@dataclass
class RetrainReport:
    k: int
    sample: int
    kept_ids: int
    new_ids: int
    retired_ids: int
    mean_match_similarity: float
    seconds: float
    merged_ids: int = 0
    """Old ids merged into another before k-means (counted in ``retired_ids`` too)."""


@dataclass
class _Open:
    """A cluster open as every replica sees it: what the concurrent-open merge compares."""

    vec: np.ndarray
    at_ms: int
    origin: str


def _unit_rows(mat: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return (mat / np.where(norms > 0, norms, 1.0)).astype(np.float32)


class OnlineClusters:
    """Cluster ids for unit vectors (see the module docstring)."""

    def __init__(self, dim: int, radius: float = 0.55, max_clusters: int = 1024, *,
                 retrain_min: int = 2000, retrain_growth: float = 2.0,
                 reservoir_size: int = 20_000, min_match: float = 0.5, k: int | None = None,
                 background: bool = True, seed: int = 0, concurrent_open_window_ms: int = 2000,
                 # banking77/MiniLM: same-intent half centroids cos >= 0.913 (median 0.991), different intents <= 0.897
                 merge_above: float = 0.92):
        self.dim = dim
        self.radius = radius
        self.max_clusters = max_clusters
        self.retrain_growth = retrain_growth
        self.reservoir_size = reservoir_size
        self.min_match = min_match
        self.k = k
        self.background = background
        self.seed = seed
        self.concurrent_open_window_ms = concurrent_open_window_ms
        self.merge_above = merge_above
        self._ids: list[int] = []
        self._centroids = np.zeros((0, dim), dtype=np.float32)
        self._sums = np.zeros((0, dim), dtype=np.float32)
        self._counts: list[int] = []
        self._next_id = 0
        self._reservoir = np.zeros((reservoir_size, dim), dtype=np.float32)
        self._filled = 0
        self._seen = 0
        self._next_retrain = retrain_min
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._retraining = threading.Lock()
        self.retrains: list[RetrainReport] = []
        # Sharing one model across replicas (see the module docstring).
        self.fleet_ids = False
        self.origin = ""
        self.listener = None
        """Optional: ``cluster_opened(id, vec, at_ms)`` and ``clusters_retrained(ClusterModel)``."""
        self.generation = 0
        self.model_origin = ""
        self.trained_at_ms = 0
        """The sample time of the model in use (0: none yet, or a snapshot older than it)."""
        self._opened_at_ms: dict[int, int] = {}  # opened or adopted since the last model
        self._opens: dict[int, _Open] = {}  # recent opens with an origin (see "Concurrent opens")
        self._merged: dict[int, int] = {}  # loser -> survivor, oldest first
        self.merges: dict[str, int] = {}
        """Merges made here since start, by reason (concurrent_open, retrain)."""
        self._id_rng = random.SystemRandom()
        self._unannounced: set[int] = set()  # opened here, open not yet handed to the listener

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def seen(self) -> int:
        return self._seen

    def ids(self) -> list[int]:
        with self._lock:
            return list(self._ids)

    @property
    def merged_ids(self) -> dict[int, int]:
        """Cluster ids merged into another (loser -> survivor), the latest ``MERGED_MAX``."""
        with self._lock:
            return dict(self._merged)

    def nearest(self, vec: np.ndarray) -> tuple[int, float]:
        """(cluster id, similarity) without updating; (-1, -1.0) when there are none."""
        with self._lock:
            row, sim = self._nearest(vec)
            return (self._ids[row] if row >= 0 else -1), sim

    def assign(self, vec: np.ndarray, update: bool = True) -> int:
        """Cluster id for ``vec``; with ``update`` the centroid moves toward it and the
        vector joins the retrain sample (a retrain may start)."""
        vec = np.asarray(vec, dtype=np.float32).reshape(-1)
        opened_at_ms = None
        with self._lock:
            if update:
                self._sample(vec)
            row, sim = self._nearest(vec)
            if row < 0 or (sim < self.radius and len(self) < self.max_clusters):
                # opened_at_ms is read here: an adoption may drop the cluster later.
                cluster, opened_at_ms = self._open(vec)
                row = -1 if opened_at_ms is not None else self._ids.index(cluster)
                if opened_at_ms is not None and self.listener is not None:
                    self._unannounced.add(cluster)  # kept out of a refresh until its open is queued
            else:
                cluster = self._ids[row]
            if update and row >= 0:
                self._move(row, vec)
            due = update and self._seen >= self._next_retrain
            if due:
                self._next_retrain = int(self._seen * self.retrain_growth) + 1
        if opened_at_ms is not None and self.listener is not None:
            try:
                self.listener.cluster_opened(cluster, vec, opened_at_ms)
            finally:
                with self._lock:
                    self._unannounced.discard(cluster)
        if due:
            self._start_retrain()
        return cluster

    def retrain(self) -> RetrainReport | None:
        """Fit k-means to the sample and re-key the clusters (None if the sample is too small)."""
        with self._retraining:
            with self._lock:
                sampled_at_ms = int(time.time() * 1000)
                sample = self._reservoir[:self._filled].copy()
                old_ids, old_centroids, old_counts = list(self._ids), self._centroids.copy(), list(self._counts)
            started = time.perf_counter()
            kept_ids, kept_centroids, kept_counts, merges = self._merge_close(old_ids, old_centroids, old_counts)
            k = self.k or len(kept_ids)
            k = min(k, len(sample) // MIN_POINTS_PER_CLUSTER, self.max_clusters)
            if k < 2:
                return None
            # Warm start from the current centroids (the k largest when k is capped):
            # k-means then refines the clusters rather than redrawing them, so far
            # more of them survive the match under their old ids.
            centroids, counts = self._kmeans(sample, k, self._warm_start(kept_centroids, kept_counts, k))
            new_ids, report = self._match(centroids, kept_ids, kept_centroids)
            report.merged_ids = len(merges)
            report.retired_ids += len(merges)
            with self._lock:
                self._install(centroids, counts, new_ids, old_ids)
                for loser, survivor in merges:
                    self._note_merge(loser, survivor, "retrain")
                self.generation, self.model_origin = self.generation + 1, self.origin
                self.trained_at_ms = sampled_at_ms
                self._opened_at_ms = {c: t for c, t in self._opened_at_ms.items() if t > sampled_at_ms}
                model = self._model(range(len(self._ids)))
            report.seconds, report.sample = time.perf_counter() - started, len(sample)
            self.retrains.append(report)
            log.info("intent clusters retrained", extra=report.__dict__)
            if self.listener is not None:
                self.listener.clusters_retrained(model)
            return report

    # -- sharing one model across replicas ----------------------------------------------

    def adopt_open(self, cluster_id: int, vec: np.ndarray, opened_at_ms: int, *, origin: str = "") -> bool:
        """Take in a cluster replica ``origin`` opened (False: known already, merged into a
        concurrent open of the same intent, or no room). Without an origin it is never merged."""
        vec = _unit_rows(np.asarray(vec, dtype=np.float32).reshape(1, -1))[0]
        with self._lock:
            if (cluster_id in self._ids or cluster_id in self._merged or cluster_id in self._opens
                    or len(self) >= self.max_clusters):
                return False
            return self._admit(cluster_id, vec, opened_at_ms, origin, local=False) == cluster_id

    def adopt_model(self, model: ClusterModel) -> bool:
        """Take in another replica's retrained (or re-sent) model if it orders after the one in
        use; a re-sent copy of the model in use only adds what is not known here (see "Refresh").
        False: nothing changed."""
        if model.order() < (self.generation, self.model_origin):
            return False
        centroids = _unit_rows(np.asarray(model.centroids, dtype=np.float32).reshape(len(model.ids), self.dim))
        with self._lock:
            if model.order() < (self.generation, self.model_origin):
                return False
            if model.order() == (self.generation, self.model_origin):
                return self._fill_in(model, centroids)
            self._take_merges(model.merged_ids)
            # A model trained before a merge reached its replica names the loser: read the survivor.
            ids, centroids, counts = self._combine([self._resolve(cid) for cid in model.ids], centroids,
                                                   model.counts)
            known = set(ids)
            # Opened after the model's sample was taken: it cannot know them, so they stay.
            late = [row for row, cid in enumerate(self._ids)
                    if cid not in known and cid not in self._merged
                    and self._opened_at_ms.get(cid, -1) > model.trained_at_ms]
            opened = {self._ids[row]: self._opened_at_ms[self._ids[row]] for row in late}
            self._opened_at_ms = {**{self._resolve(cid): int(at) for cid, at in model.opened_at_ms.items()
                                     if self._resolve(cid) in known}, **opened}
            self._replace(ids, centroids, counts, late)
            self.generation, self.model_origin = model.generation, model.origin
            self.trained_at_ms = model.trained_at_ms
            return True

    def model_in_use(self) -> ClusterModel | None:
        """The model in use with every cluster held now, to re-send it (see "Refresh");
        None when there are no clusters."""
        with self._lock:
            rows = [row for row, cid in enumerate(self._ids) if cid not in self._unannounced]
            return self._model(rows) if rows else None

    # -- persistence ------------------------------------------------------------------

    def export_state(self) -> dict:
        """Ids, centroids and counters (``centroids`` is an array, the rest JSON-able)."""
        with self._lock:
            return {"ids": list(self._ids), "centroids": self._centroids.copy(),
                    "counts": list(self._counts), "next_id": self._next_id, "seen": self._seen,
                    "next_retrain": self._next_retrain, "generation": self.generation,
                    "model_origin": self.model_origin, "trained_at_ms": self.trained_at_ms,
                    "opened_at_ms": [[cid, at] for cid, at in self._opened_at_ms.items()],
                    "opens": [[cid, o.at_ms, o.origin, encode_vec(o.vec)] for cid, o in self._opens.items()],
                    "merged_ids": [[loser, survivor] for loser, survivor in self._merged.items()]}

    def load_state(self, state: dict) -> None:
        centroids = np.asarray(state["centroids"], dtype=np.float32).reshape(-1, self.dim)
        with self._lock:
            self._ids = [int(i) for i in state["ids"]]
            self._centroids = centroids
            self._counts = [int(c) for c in state["counts"]]
            self._sums = centroids * np.asarray(self._counts, dtype=np.float32)[:, None]
            self._next_id = int(state["next_id"])
            self._seen = int(state.get("seen", 0))
            self._next_retrain = int(state.get("next_retrain", self._next_retrain))
            self.generation = int(state.get("generation", 0))
            self.model_origin = str(state.get("model_origin", ""))
            # Older snapshots have neither: a refresh then keeps all a fresh replica heard opened.
            self.trained_at_ms = int(state.get("trained_at_ms", 0))
            self._opened_at_ms = {int(cid): int(at) for cid, at in state.get("opened_at_ms", [])}
            # Older snapshots have neither: nothing to merge with, nothing merged.
            self._opens = {int(cid): _Open(decode_vec(vec), int(at_ms), str(origin))
                           for cid, at_ms, origin, vec in state.get("opens", [])}
            self._merged = {int(loser): int(survivor) for loser, survivor in state.get("merged_ids", [])}

    # -- internals --------------------------------------------------------------------

    def _nearest(self, vec: np.ndarray) -> tuple[int, float]:
        if not self._ids:
            return -1, -1.0
        sims = self._centroids @ np.asarray(vec, dtype=np.float32).reshape(-1)
        best = int(np.argmax(sims))
        return best, float(sims[best])

    def _open(self, vec: np.ndarray) -> tuple[int, int | None]:
        """(new cluster, its open time), or (an existing cluster, None) when ``vec`` is the intent
        of a concurrent open from another replica already here."""
        cluster, at_ms = self._fresh_id(), int(time.time() * 1000)
        survivor = self._admit(cluster, vec, at_ms, self.origin, local=True)
        return (cluster, at_ms) if survivor == cluster else (survivor, None)

    # -- refresh (see the module docstring) ----------------------------------------------

    def _model(self, rows) -> ClusterModel:
        """The model in use, as made of the clusters at ``rows``."""
        ids = [self._ids[row] for row in rows]
        return ClusterModel(self.generation, self.model_origin, self.trained_at_ms, ids,
                            [self._counts[row] for row in rows], self._centroids[list(rows)].copy(),
                            opened_at_ms={cid: self._opened_at_ms[cid] for cid in ids if cid in self._opened_at_ms},
                            merged_ids=dict(self._merged))

    def _fill_in(self, model: ClusterModel, centroids: np.ndarray) -> bool:
        """A copy of the model in use: add the clusters and merges not known here."""
        changed = False
        for cid, row, count in zip(model.ids, centroids, model.counts):
            if self._resolve(cid) != cid or cid in self._ids or len(self) >= self.max_clusters:
                continue  # known, or merged here (into a survivor held, or retired: not brought back)
            self._append(cid, row)
            self._counts[-1], self._sums[-1] = int(count), row * max(int(count), 1)
            if cid in model.opened_at_ms:
                self._opened_at_ms[cid] = int(model.opened_at_ms[cid])
            changed = True
        return self._take_merges(model.merged_ids) or changed  # after: a survivor may just have come

    def _take_merges(self, merges: dict[int, int]) -> bool:
        """Note the sender's merges not known here; a loser held here is folded into its
        survivor (or dropped, the survivor not being here). Quiet: they are not new."""
        changed = False
        for loser, survivor in merges.items():
            loser, survivor = int(loser), int(survivor)
            if loser in self._merged or loser == survivor or self._resolve(survivor) == loser:
                continue
            self._merged[loser] = survivor
            if loser in self._ids:
                if self._resolve(survivor) in self._ids:
                    self._fold(loser, self._resolve(survivor))
                else:
                    self._drop(loser)
            changed = True
        self._trim_merged()
        return changed

    def _trim_merged(self) -> None:
        while len(self._merged) > MERGED_MAX:  # the oldest go first
            del self._merged[next(iter(self._merged))]

    def _drop(self, cluster: int) -> None:
        keep = [r for r, cid in enumerate(self._ids) if cid != cluster]
        self._ids = [self._ids[r] for r in keep]
        self._centroids, self._sums = self._centroids[keep], self._sums[keep]
        self._counts = [self._counts[r] for r in keep]
        self._opened_at_ms.pop(cluster, None)

    # -- concurrent opens (see the module docstring) ------------------------------------

    def _admit(self, cluster: int, vec: np.ndarray, at_ms: int, origin: str, *, local: bool) -> int:
        """Open ``cluster`` unless a concurrent open of the same intent orders before it;
        fold the ones it orders before into it. Returns the survivor."""
        present = set(self._ids)
        # A rival whose cluster a model has retired no longer counts: here as on the replica that
        # opened ``cluster``, which (on the same model) opened it as usual.
        rivals = {r for r in (self._resolve(c) for c in self._concurrent(vec, at_ms, origin)) if r in present}

        def order(cid: int) -> tuple[int, int]:  # a forgotten open is older than any remembered
            return (at_ms if cid == cluster else self._opens[cid].at_ms if cid in self._opens else -1), cid

        survivor = min(rivals | {cluster}, key=order)
        if local and survivor != cluster:
            return survivor  # not opened: never published, nothing to remember
        if origin:
            self._remember(cluster, vec, at_ms, origin)  # a loser too: it may link later opens
        if survivor == cluster:
            self._append(cluster, vec)
            self._opened_at_ms[cluster] = at_ms
        else:
            self._note_merge(cluster, survivor, "concurrent_open")
        if survivor in self._ids:
            for rival in sorted(rivals - {survivor}):
                if rival in present:
                    self._fold(rival, survivor)
                    self._note_merge(rival, survivor, "concurrent_open")
        return survivor

    def _concurrent(self, vec: np.ndarray, at_ms: int, origin: str) -> list[int]:
        """Remembered opens from other replicas that are ``vec``'s intent, opened around ``at_ms``."""
        if not origin:
            return []
        return [cid for cid, o in self._opens.items()
                if o.origin != origin and abs(o.at_ms - at_ms) <= self.concurrent_open_window_ms
                and float(o.vec @ vec) >= self.radius]

    def _remember(self, cluster: int, vec: np.ndarray, at_ms: int, origin: str) -> None:
        self._opens[cluster] = _Open(np.array(vec, dtype=np.float32), at_ms, origin)
        horizon = max(o.at_ms for o in self._opens.values()) - OPEN_MEMORY_MS
        keep = {cid for _, cid in sorted((o.at_ms, cid) for cid, o in self._opens.items()
                                         if o.at_ms >= horizon)[-OPENS_MAX:]}
        if len(keep) < len(self._opens):
            self._opens = {cid: o for cid, o in self._opens.items() if cid in keep}

    def _resolve(self, cluster: int) -> int:
        for _ in range(len(self._merged)):  # bounded: a chain is never longer than the map
            if cluster not in self._merged:
                break
            cluster = self._merged[cluster]
        return cluster

    def _note_merge(self, loser: int, survivor: int, reason: str) -> None:
        self.merges[reason] = self.merges.get(reason, 0) + 1
        self._merged[loser] = survivor
        self._trim_merged()
        log.info("intent clusters merged", extra={"loser": loser, "survivor": survivor, "reason": reason,
                                                  "origin": self.origin})

    def _fold(self, loser: int, survivor: int) -> None:
        """Add cluster ``loser``'s counts and sums to ``survivor``'s and drop it."""
        row, into = self._ids.index(loser), self._ids.index(survivor)
        self._sums[into] += self._sums[row]
        self._counts[into] += self._counts[row]
        self._recentre(into)
        self._drop(loser)

    def _append(self, cluster: int, vec: np.ndarray) -> None:
        self._ids.append(cluster)
        self._centroids = np.vstack([self._centroids, vec[None, :]])
        self._sums = np.vstack([self._sums, vec[None, :]])
        self._counts.append(1)

    def _move(self, row: int, vec: np.ndarray) -> None:
        self._sums[row] += vec
        self._counts[row] += 1
        self._recentre(row)

    def _recentre(self, row: int) -> None:
        """The centroid at ``row``: its running sum, re-normalised."""
        norm = np.linalg.norm(self._sums[row])
        if norm > 0:
            self._centroids[row] = self._sums[row] / norm

    def _sample(self, vec: np.ndarray) -> None:
        """Reservoir sampling (algorithm R): a uniform sample of everything seen."""
        self._seen += 1
        if self._filled < self.reservoir_size:
            self._reservoir[self._filled] = vec
            self._filled += 1
            return
        slot = int(self._rng.integers(0, self._seen))
        if slot < self.reservoir_size:
            self._reservoir[slot] = vec

    def _start_retrain(self) -> None:
        if not self.background:
            self.retrain()
            return
        if self._retraining.locked():
            return  # one at a time; the next growth step triggers again
        threading.Thread(target=self._retrain_quietly, name="scache-cluster-retrain",
                         daemon=True).start()

    def _retrain_quietly(self) -> None:
        try:
            self.retrain()
        except Exception:  # the online assignment keeps working either way
            log.exception("intent cluster retrain failed")

    @staticmethod
    def _warm_start(old_centroids: np.ndarray, counts: list[int], k: int) -> np.ndarray | None:
        if len(old_centroids) < k:
            return None
        return np.ascontiguousarray(old_centroids[np.argsort(-np.asarray(counts), kind="stable")[:k]])

    def _merge_close(self, ids: list[int], centroids: np.ndarray, counts: list[int]):
        """Merge the clusters whose centroids are at least ``merge_above`` alike (transitively):
        (ids, centroids, counts) after it, and the (loser, survivor) pairs."""
        parent = list(range(len(ids)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i, j in zip(*np.nonzero(np.triu(centroids @ centroids.T >= self.merge_above, k=1))):
            parent[root(int(i))] = root(int(j))
        groups: dict[int, list[int]] = {}
        for i in range(len(ids)):
            groups.setdefault(root(i), []).append(i)
        survivor, merges = {}, []
        for group, rows in groups.items():
            best = ids[min(rows, key=lambda r: (-counts[r], ids[r]))]
            survivor[group] = best
            merges += [(ids[r], best) for r in rows if ids[r] != best]
        merged_ids, merged_centroids, merged_counts = self._combine(
            [survivor[root(i)] for i in range(len(ids))], centroids, counts)
        return merged_ids, merged_centroids, merged_counts, merges

    @staticmethod
    def _combine(ids: list[int], centroids: np.ndarray, counts) -> tuple[list[int], np.ndarray, list[int]]:
        """Rows sharing an id become one: the count-weighted mean centroid, the summed count
        (first occurrence's position)."""
        if len(set(ids)) == len(ids):
            return list(ids), centroids, [int(c) for c in counts]
        order = list(dict.fromkeys(ids))
        at = {cid: n for n, cid in enumerate(order)}
        sums = np.zeros((len(order), centroids.shape[1]), dtype=np.float32)
        total = [0] * len(order)
        for cid, row, count in zip(ids, centroids, counts):
            sums[at[cid]] += row * max(int(count), 1)
            total[at[cid]] += int(count)
        return order, _unit_rows(sums), total

    def _kmeans(self, sample: np.ndarray, k: int,
                init: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        kmeans = faiss.Kmeans(self.dim, k, niter=20, spherical=True, seed=self.seed, verbose=False,
                              min_points_per_centroid=1, max_points_per_centroid=10_000)
        kmeans.train(np.ascontiguousarray(sample), init_centroids=init)
        centroids = _unit_rows(kmeans.centroids)
        labels = np.argmax(sample @ centroids.T, axis=1)
        counts = np.bincount(labels, minlength=k)
        keep = counts > 0  # an empty centroid names no one
        return centroids[keep], counts[keep]

    def _match(self, centroids: np.ndarray, old_ids: list[int],
               old_centroids: np.ndarray) -> tuple[list[int | None], RetrainReport]:
        """New centroid -> inherited old id (or None: needs a fresh id)."""
        new_ids: list[int | None] = [None] * len(centroids)
        sims: list[float] = []
        if old_ids:
            similarity = centroids @ old_centroids.T
            rows, cols = linear_sum_assignment(-similarity)
            for row, col in zip(rows, cols):
                if similarity[row, col] >= self.min_match:
                    new_ids[row] = old_ids[col]
                    sims.append(float(similarity[row, col]))
        kept = sum(i is not None for i in new_ids)
        return new_ids, RetrainReport(
            k=len(centroids), sample=0, kept_ids=kept, new_ids=len(centroids) - kept,
            retired_ids=len(old_ids) - kept, mean_match_similarity=float(np.mean(sims)) if sims else 0.0,
            seconds=0.0)

    def _install(self, centroids: np.ndarray, counts: np.ndarray, new_ids: list[int | None],
                 old_ids: list[int]) -> None:
        # An id merged into a concurrent open while k-means ran lives on as its survivor.
        ids, centroids, counts = self._combine([self._fresh_id() if i is None else self._resolve(i) for i in new_ids],
                                               centroids, counts)
        named = set(ids)
        # Clusters opened online while k-means ran are kept as they are.
        self._replace(ids, centroids, counts,
                      [row for row, cid in enumerate(self._ids) if cid not in old_ids and cid not in named])

    def _replace(self, ids: list[int], centroids: np.ndarray, counts, keep: list[int]) -> None:
        """Install ``ids`` / ``centroids`` / ``counts`` (a retrained or adopted model), followed by
        the current clusters at rows ``keep`` as they are."""
        counts_f = np.asarray(counts, dtype=np.float32)
        self._ids = list(ids) + [self._ids[row] for row in keep]
        self._centroids = np.vstack([centroids] + [self._centroids[row][None] for row in keep])
        self._sums = np.vstack([centroids * counts_f[:, None]] + [self._sums[row][None] for row in keep])
        self._counts = [int(c) for c in counts] + [self._counts[row] for row in keep]

    def _fresh_id(self) -> int:
        if self.fleet_ids:  # unique across replicas without asking any of them
            taken = set(self._ids) | set(self._merged) | set(self._opens)
            while (cluster := self._id_rng.randint(FLEET_ID_MIN, FLEET_ID_MAX)) in taken:
                pass
            return cluster
        cluster = self._next_id
        self._next_id += 1
        return cluster
