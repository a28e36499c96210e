"""A trained judge as a file every replica loads: boosted trees over ``judge_features``, calibrated.

Artifact format ``scache-judge/2``: one JSON file ``judge-<version>.json``, numbers and
strings only (no pickle: a judge file comes from a shared store, and loading it must never
run code). It holds the feature names it was trained on, the trees (sklearn's
HistGradientBoosting, exported node by node), the *cosine blend* (below), a monotone
(Platt) calibration map from the blended score to a probability, and the training report,
including the *operating points*: the smallest probability whose hits stayed within 2%, 5%
and 10% wrong on the held-out split. A digest of the content guards against a truncated or
edited file. Version 1 files (no blend) still load. A judge trained with its own encoder (tuned
on the user's pairs, ``judge_encoder_tuning``) names the ONNX export beside it and that export's
digest; the replica runs its token pass on that export instead of the cache's, and a missing or
altered export is a load error like a damaged file.

Cosine blend: the trees' score and the cosine are each turned into a percentile of their
training distribution and combined (``min``: a candidate must rank high on both; ``mean``).
On kinds of pairs the trees never saw, trees alone sometimes fell *below* a plain cosine
threshold (banking77 left out of training: 8.6% of duplicates served at 5% wrong against
cosine's 18.7%), because lexical patterns learnt elsewhere do not hold there; the blend
keeps the cosine's ranking as a floor (18.7%) and still gains where the trees know better
(see bench/judge_quality.py).

Inference is numpy only: a few hundred node lookups per candidate. The judge's cost is the
token vectors of the query and its candidates (one batched encoder call per lookup).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache_core.decision.judge_features import FEATURE_NAMES, TUNED_FEATURE_NAMES, TokenEncoder, pair_features

log = logging.getLogger(__name__)

FORMAT = "scache-judge/2"
FORMATS = ("scache-judge/1", FORMAT)
"""Formats this version reads."""
BLEND_KINDS = ("min", "mean")
VERSION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENCODER_DIR_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A judge's own encoder export: a directory name beside the artifact, never a path (no "/", no "..")."""


class JudgeLoadError(ValueError):
    """A judge artifact that cannot be used: missing, corrupt, or for other features."""


@dataclass(frozen=True)
class Trees:
    """Boosted regression trees: raw score = baseline + sum of each tree's leaf value."""

    baseline: float
    feature: np.ndarray       # (trees, nodes) int
    threshold: np.ndarray     # (trees, nodes) float: go left when x <= threshold
    left: np.ndarray          # (trees, nodes) int
    right: np.ndarray         # (trees, nodes) int
    missing_left: np.ndarray  # (trees, nodes) bool
    leaf: np.ndarray          # (trees, nodes) bool
    value: np.ndarray         # (trees, nodes) float

    def raw(self, X: np.ndarray) -> np.ndarray:
        """Raw (log-odds) scores of the rows of ``X``.

        Every tree descends at once, one level per step (a few numpy calls per level, about
        ten levels), rather than tree by tree: 300 trees one at a time cost ~24 ms for a
        lookup's five candidates, which was most of the judge's time once encoding was cheap."""
        X = np.asarray(X, dtype=np.float64)
        trees = np.arange(self.feature.shape[0])[:, None]
        cols = np.arange(len(X))[None, :]
        node = np.zeros((len(trees), len(X)), dtype=np.int64)
        leaf = self.leaf[trees, node]
        while not leaf.all():
            x = X[cols, self.feature[trees, node]]
            go_left = np.where(np.isnan(x), self.missing_left[trees, node], x <= self.threshold[trees, node])
            node = np.where(leaf, node, np.where(go_left, self.left[trees, node], self.right[trees, node]))
            leaf = self.leaf[trees, node]
        return self.baseline + self.value[trees, node].sum(axis=0)

    def to_json(self) -> dict:
        return {"baseline": self.baseline, **{name: getattr(self, name).tolist() for name in
                                              ("feature", "threshold", "left", "right", "missing_left",
                                               "leaf", "value")}}

    @classmethod
    def from_json(cls, data: dict) -> "Trees":
        def arr(name, dtype):
            return np.asarray(data[name], dtype=dtype)

        trees = cls(float(data["baseline"]), arr("feature", np.int64), arr("threshold", np.float64),
                    arr("left", np.int64), arr("right", np.int64), arr("missing_left", bool),
                    arr("leaf", bool), arr("value", np.float64))
        shapes = {getattr(trees, n).shape for n in ("feature", "threshold", "left", "right",
                                                    "missing_left", "leaf", "value")}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise JudgeLoadError("judge trees have inconsistent shapes")
        nodes = trees.feature.shape[1]
        inner = ~trees.leaf
        if (inner & ((trees.left < 0) | (trees.left >= nodes) | (trees.right < 0) | (trees.right >= nodes))).any():
            raise JudgeLoadError("judge trees point outside themselves")
        return trees


@dataclass(frozen=True)
class Calibration:
    """Monotone map raw score -> probability (piecewise linear between the knots; beyond
    them, extended along the first and last segment's slope so the ranking never ties)."""

    x: np.ndarray
    y: np.ndarray

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw, dtype=np.float64)
        out = np.interp(raw, self.x, self.y)
        if len(self.x) >= 2:  # keep order past the ends, within [0, 1]
            lo_slope = (self.y[1] - self.y[0]) / max(self.x[1] - self.x[0], 1e-12)
            hi_slope = (self.y[-1] - self.y[-2]) / max(self.x[-1] - self.x[-2], 1e-12)
            out = np.where(raw < self.x[0], self.y[0] + lo_slope * (raw - self.x[0]), out)
            out = np.where(raw > self.x[-1], self.y[-1] + hi_slope * (raw - self.x[-1]), out)
        return np.clip(out, 0.0, 1.0)


@dataclass(frozen=True)
class CosineBlend:
    """Percentile knots of the trees' raw score and of the cosine on the training rows, and how
    the two percentiles combine into the score that calibration maps to a probability."""

    kind: str
    raw_knots: np.ndarray
    cosine_knots: np.ndarray

    def __call__(self, raw: np.ndarray, cosine: np.ndarray) -> np.ndarray:
        a, b = _percentile(raw, self.raw_knots), _percentile(cosine, self.cosine_knots)
        # A tiny share of each keeps ties (both at the top percentile) in the trees' order.
        if self.kind == "min":
            return np.minimum(a, b) + 1e-3 * (a + b)
        return (a + b) / 2

    @classmethod
    def fit(cls, kind: str, raw: np.ndarray, cosine: np.ndarray, knots: int = 201) -> "CosineBlend":
        if kind not in BLEND_KINDS:
            raise ValueError(f"blend must be one of {BLEND_KINDS}, got {kind!r}")
        qs = np.linspace(0, 1, knots)
        return cls(kind, np.quantile(raw, qs), np.quantile(cosine, qs))

    def to_json(self) -> dict:
        return {"kind": self.kind, "raw_knots": self.raw_knots.tolist(), "cosine_knots": self.cosine_knots.tolist()}

    @classmethod
    def from_json(cls, data: dict) -> "CosineBlend":
        if data.get("kind") not in BLEND_KINDS:
            raise ValueError(f"unknown blend kind {data.get('kind')!r}")
        return cls(data["kind"], np.asarray(data["raw_knots"], float), np.asarray(data["cosine_knots"], float))


def _percentile(values: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Share of training values below each value, interpolated between the stored quantiles
    (duplicate knots, from ties, are spread so the map stays increasing)."""
    knots = knots + np.arange(len(knots)) * 1e-12
    return np.interp(np.asarray(values, dtype=np.float64), knots, np.linspace(0, 1, len(knots)))


@dataclass(frozen=True)
class JudgeArtifact:
    """A trained judge: what it reads, how it scores, where to cut, how it was trained."""

    version: str
    encoder: str
    feature_names: tuple[str, ...]
    trees: Trees
    calibration: Calibration
    operating_points: dict[str, float]
    """Target false-hit rate (as "0.05") -> smallest probability that met it on held-out pairs."""
    report: dict
    blend: CosineBlend | None = None
    tuned_encoder: dict | None = None
    """With an encoder of its own (``judge_encoder_tuning``): ``{"dir": its export's directory
    name beside the artifact, "sha256": the export's graph file digest}``."""

    @property
    def reads_tuned_encoder(self) -> bool:
        return self.tuned_encoder is not None

    def scores(self, X: np.ndarray) -> np.ndarray:
        """The uncalibrated score: the trees' raw score, blended with the cosine (column 0)."""
        X = np.asarray(X, dtype=np.float64)
        raw = self.trees.raw(X)
        return raw if self.blend is None else self.blend(raw, X[:, 0])

    def probabilities(self, X: np.ndarray) -> np.ndarray:
        return self.calibration(self.scores(X))

    def accept_at(self, max_false_hit_rate: float) -> float:
        """The probability cut for a target false-hit rate: the held-out operating point of the
        largest trained target not above it (the strictest if none is)."""
        known = sorted((float(k), v) for k, v in self.operating_points.items())
        fitting = [v for k, v in known if k <= max_false_hit_rate + 1e-12]
        return fitting[-1] if fitting else (known[0][1] if known else 0.5)

    # -- files -----------------------------------------------------------------------------

    def to_json(self) -> dict:
        body = {"format": FORMAT, "version": self.version, "encoder": self.encoder,
                "feature_names": list(self.feature_names), "trees": self.trees.to_json(),
                "calibration": {"x": self.calibration.x.tolist(), "y": self.calibration.y.tolist()},
                "operating_points": self.operating_points, "report": self.report,
                "blend": None if self.blend is None else self.blend.to_json()}
        if self.tuned_encoder is not None:  # absent otherwise, so older artifacts' digests hold
            body["tuned_encoder"] = dict(self.tuned_encoder)
        return body | {"sha256": _digest(body)}

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / artifact_name(self.version)
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(self.to_json()))
        staging.replace(path)
        return path

    @classmethod
    def load(cls, path: Path, *, check_encoder: bool = True) -> "JudgeArtifact":
        """Read and check an artifact; ``JudgeLoadError`` says what is wrong with it.
        ``check_encoder=False``: a reader that only wants its cuts (the control panel, which may
        run where the judge's own encoder export was not copied) skips that export's check."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise JudgeLoadError(f"judge artifact {path} does not exist") from None
        except (OSError, ValueError) as exc:
            raise JudgeLoadError(f"judge artifact {path} is not readable JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") not in FORMATS:
            raise JudgeLoadError(f"judge artifact {path}: format is not one of {FORMATS}")
        stored = data.pop("sha256", None)
        if stored != _digest(data):
            raise JudgeLoadError(f"judge artifact {path}: content digest does not match (truncated or edited)")
        tuned = data.get("tuned_encoder")
        names = TUNED_FEATURE_NAMES if tuned is not None else FEATURE_NAMES
        if tuple(data.get("feature_names", ())) != names:
            raise JudgeLoadError(f"judge artifact {path} was trained on other features "
                                 f"({data.get('feature_names')}); retrain it with this version")
        if tuned is not None and check_encoder:
            _check_tuned_encoder(Path(path), tuned)
        try:
            cal = data["calibration"]
            return cls(version=str(data["version"]), encoder=str(data["encoder"]),
                       feature_names=names, trees=Trees.from_json(data["trees"]), tuned_encoder=tuned,
                       calibration=Calibration(np.asarray(cal["x"], float), np.asarray(cal["y"], float)),
                       operating_points={str(k): float(v) for k, v in data["operating_points"].items()},
                       report=dict(data.get("report", {})),
                       blend=CosineBlend.from_json(data["blend"]) if data.get("blend") else None)
        except JudgeLoadError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise JudgeLoadError(f"judge artifact {path} is incomplete: {exc!r}") from None


def _check_tuned_encoder(path: Path, tuned) -> None:
    """The artifact's own encoder export is beside it and is the one it was trained with."""
    from cache_core.embedding.onnx import ONNX_FILE

    if not isinstance(tuned, dict) or not ENCODER_DIR_PATTERN.fullmatch(str(tuned.get("dir"))):
        raise JudgeLoadError(f"judge artifact {path}: tuned_encoder must name a directory beside it")
    graph = path.parent / tuned["dir"] / ONNX_FILE
    if not graph.is_file():
        raise JudgeLoadError(f"judge artifact {path} reads its own encoder, but {graph} does not exist "
                             f"(copy {tuned['dir']}/ beside the artifact)")
    if graph_digest(graph) != tuned.get("sha256"):
        raise JudgeLoadError(f"judge artifact {path}: {graph} is not the encoder it was trained with "
                             "(digest differs)")


def graph_digest(path: Path) -> str:
    """sha256 of a file, streamed (an encoder export's graph: ~90 MB)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def artifact_name(version: str) -> str:
    if not VERSION_PATTERN.match(version):
        raise ValueError(f"judge version must match {VERSION_PATTERN.pattern}, got {version!r}")
    return f"judge-{version}.json"


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class LearnedJudge:
    """An artifact at an operating point, scoring a lookup's candidates in one encoder call."""

    def __init__(self, artifact: JudgeArtifact, tokens: TokenEncoder, accept_at: float):
        self.artifact = artifact
        self.version = artifact.version
        self.accept_at = accept_at
        self._tokens = tokens

    def score_many(self, query: str, cached_queries: Sequence[str], cosines: Sequence[float]) -> np.ndarray:
        """Probability, per candidate, that its answer fits ``query``."""
        if not cached_queries:
            return np.zeros(0)
        vectors = self._tokens([query, *cached_queries])
        tuned = self.artifact.reads_tuned_encoder
        X = np.array([pair_features(cached, query, cos, vec, vectors[0], encoder_cosine=tuned)
                      for cached, cos, vec in zip(cached_queries, cosines, vectors[1:])])
        return self.artifact.probabilities(X)

    def score(self, query: str, cached_query: str, cosine: float, *, cached_answer: str = "") -> float:
        return float(self.score_many(query, [cached_query], [cosine])[0])


class JudgeShelf:
    """The judges a replica has loaded, by version, from one directory (``cache.judge_dir``).

    Loads lazily on the first lookup that names a version and keeps it; a version that
    fails to load is remembered with its error (logged once) and retried after
    ``retry_s``, so a judge file copied in later is picked up without a restart.
    """

    def __init__(self, directory: Path, tokens: Callable[[], TokenEncoder], retry_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.directory = Path(directory)
        self._tokens = tokens
        self._retry_s = retry_s
        self._clock = clock
        self._loaded: dict[str, JudgeArtifact] = {}
        self._own_tokens: dict[str, TokenEncoder] = {}
        """Versions with an encoder of their own: its token pass, loaded with the artifact."""
        self._failed: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def artifact(self, version: str) -> JudgeArtifact | None:
        """The artifact, or None while it cannot be loaded (``error(version)`` says why)."""
        with self._lock:
            if version in self._loaded:
                return self._loaded[version]
            failed = self._failed.get(version)
            if failed is not None and self._clock() - failed[0] < self._retry_s:
                return None
            try:
                artifact = JudgeArtifact.load(self.directory / artifact_name(version))
                if artifact.reads_tuned_encoder:
                    self._own_tokens[version] = own_token_encoder(self.directory, artifact)
            except (JudgeLoadError, ValueError) as exc:
                if failed is None or failed[1] != str(exc):
                    log.error("judge unavailable", extra={"judge_version": version, "error": str(exc)})
                self._failed[version] = (self._clock(), str(exc))
                return None
            self._failed.pop(version, None)
            self._loaded[version] = artifact
            log.info("judge loaded", extra={"judge_version": version, "trees": artifact.trees.feature.shape[0]})
            return artifact

    def judge(self, version: str, accept_at: float) -> LearnedJudge | None:
        artifact = self.artifact(version)
        if artifact is None:
            return None
        tokens = self._own_tokens.get(version) or self._tokens()
        return LearnedJudge(artifact, tokens, accept_at)

    def error(self, version: str) -> str | None:
        failed = self._failed.get(version)
        return None if failed is None else failed[1]


def own_token_encoder(directory: Path, artifact: JudgeArtifact) -> TokenEncoder:
    """The token pass of a judge's own encoder; ``JudgeLoadError`` when its export cannot run."""
    from cache_core.decision.judge_tokens import export_token_encoder
    from cache_core.embedding.embedder import EmbedderError

    try:
        return export_token_encoder(directory / artifact.tuned_encoder["dir"])
    except (EmbedderError, OSError, ValueError, RuntimeError) as exc:
        raise JudgeLoadError(f"judge {artifact.version}: its own encoder cannot run: {exc}") from None
