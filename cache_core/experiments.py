"""Experiment definitions and deterministic, sticky arm assignment.

Kept free of heavy imports: the dashboard, the Flink job and the tests use it.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

IndexKind = Literal["flat", "ivf", "hnsw", "sq_fp16", "sq_int8", "sq_int4",
                    "hnsw_sq_fp16", "hnsw_sq_int8", "hnsw_sq_int4", "ivf_sq_fp16", "ivf_sq_int8",
                    "ivf_sq_int4", "ivf_pq", "semhash", "milvus"]
"""What each kind keeps and how it searches: cache_core.store.kinds; ``milvus`` (the vectors in a
Milvus collection that replicas share): cache_core.store.milvus."""
TtlPolicy = Literal["absolute", "sliding", "adaptive"]
PartitionMode = Literal["partitioned", "shared"]
GuardName = Literal["negation", "numbers", "dates", "entities"]

Variant = Literal["base", "canary"]
SimilarityKind = Literal["cosine", "multi"]
LexicalKind = Literal["word", "char3"]

HOLDOUT_ARM = "holdout"


class _Closed(BaseModel):
    """Every level of an experiment config refuses unknown fields: on a control panel a typo
    ("treshold") that silently does nothing is the worst failure. Input from outside (the
    experiments file, the admin API, the control topic) is also validated with ``strict=True``
    (``parse_experiment`` / ``parse_experiment_json``): "2" or true is not a number there."""

    model_config = ConfigDict(extra="forbid")


class JudgeConfig(_Closed):
    """A learned second stage (cache_core.decision.judge): candidates at or above the arm's
    threshold (then a floor, not the rule) are served only if the judge's probability that
    the cached answer fits reaches the operating point."""

    version: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """The artifact ``judge-<version>.json`` in the cache's ``judge_dir``."""
    max_false_hit_rate: float = Field(0.05, gt=0.0, lt=1.0)
    """Operating point: the artifact's held-out cut for this share of wrong hits."""
    accept_at: float | None = Field(None, ge=0.0, le=1.0)
    """An explicit probability cut instead (what auto-tune and canaries move)."""
    candidates: int = Field(5, ge=1, le=20)
    """How many of the best candidates above the floor the judge reads (one encoder call)."""
    on_unavailable: Literal["miss", "threshold"] = "miss"
    """If the artifact cannot be loaded: "miss" (safe: nothing unjudged is served; every
    lookup goes to the model) or "threshold" (serve by the arm's cosine threshold alone)."""


AUDIT_BELOW_DELTA = 0.05
"""Error-bounded arms audit their curves by default when δ is below this (``ErrorBoundedThresholds.audit``)."""


class ErrorBoundedThresholds(_Closed):
    """Learn the threshold from verdicts under an error bound (cache_core.decision.error_bound):
    per cached entry, shrunk toward its intent cluster and the arm (``estimator``), once the arm
    holds enough verdicts to certify ``delta``; before that the arm's ``threshold``."""

    kind: Literal["error_bounded"] = "error_bounded"
    delta: float = Field(gt=0.0, lt=0.5)
    """The bound on the share of wrong hits (P(wrong | served)) the learnt thresholds keep."""
    estimator: Literal["curves", "staircase"] = "curves"
    """"curves": a logistic P(wrong | similarity) per entry, shrunk toward its cluster's and the
    arm's (cache_core.decision.error_curves); the arm decides once it has ``verdicts_needed``
    verdicts, and from then on every entry and cluster has a threshold. "staircase": the first
    design, a Clopper-Pearson test per level run from 1.0 down, each level deciding only with
    ``verdicts_needed`` verdicts of its own (kept as the bench's reference)."""
    confidence: float = Field(0.95, ge=0.5, lt=1.0)
    """How sure each level must be that its threshold keeps ``delta``: curves, the quantile of the
    curve's bound; staircase, of its one-sided Clopper-Pearson bound. (Staircase: at 0.9 the
    bench's δ=0.05 run on banking77 overshot, 6.5% wrong, at 0.95 it held, 4.2%. Curves, verdicts
    weighed by their check probability: at 0.5, no margin, it overshot, 5.3%; at 0.95 it held, 3.0%.)"""
    min_verdicts: int | None = Field(None, ge=1, le=100_000)
    """Verdicts a level needs before it decides (curves: the arm only; every entry and cluster
    decides with it). None: the fewest that can certify ``delta`` at ``confidence`` with no wrong
    verdict, e.g. 59 for 0.05 at 0.95."""
    floor: float = Field(0.5, ge=-1.0, le=1.0)
    """The lowest threshold a level may learn."""
    step: float = Field(0.005, gt=0.0, le=0.1)
    """Spacing of the candidate thresholds, tested from 1.0 down to ``floor``."""
    audit: bool | None = None
    """Curves: rest the thresholds on evidence, not on the curves' word alone
    (cache_core.decision.error_bound): every cut rises by the margin the arm's out-of-sample verdicts
    certify at ``confidence`` (none certified: serve nothing), a level whose own verdicts show δ
    broken is raised, and an entry goes below its cluster only as far as its own verdicts certify.
    False: the curves' cuts alone. None (default): audited when ``delta`` < ``AUDIT_BELOW_DELTA``.
    Measured (bench.error_bound --compare-audit, two streams, five seeds): the curves alone kept
    δ = 0.05 and 0.10 on every run but gave 2.0-5.3% wrong at δ = 0.02; audited, 0.02 held (it
    served nothing: no cut had the 149 clean verdicts 2% needs) while 0.05 served a fifth to a
    third as much, and one run went 0.4 point over."""
    start_threshold: float = Field(1.0, ge=-1.0, le=1.0)
    """The cold start: until a lookup's threshold is learnt (``threshold_source`` "static": the arm
    holds fewer than ``verdicts_needed`` verdicts, or no level decides yet) it serves only at or above
    the higher of this and the arm's ``threshold``. The default 1.0 serves only exact repeats then, so
    the start is bounded by construction; the verdicts still come from the shadow checks of near-misses
    in the band below it. A lower value (e.g. the arm's ``threshold``) serves more while it learns, with
    no bound (bench.error_bound: at 0.90 on its mixed stream at δ = 0.02 all wrong hits came then)."""

    @property
    def audited(self) -> bool:
        """Whether the audit runs: ``audit``, or by default below ``AUDIT_BELOW_DELTA``."""
        return self.audit if self.audit is not None else self.delta < AUDIT_BELOW_DELTA

    @model_validator(mode="after")
    def _can_certify(self) -> "ErrorBoundedThresholds":
        needed = verdicts_to_certify(self.delta, self.confidence)
        if self.min_verdicts is not None and self.min_verdicts < needed:
            raise ValueError(f"threshold_policy: min_verdicts={self.min_verdicts} cannot certify delta={self.delta} "
                             f"at confidence={self.confidence}: it needs at least {needed} verdicts")
        return self

    @property
    def verdicts_needed(self) -> int:
        """``min_verdicts``, or the fewest verdicts that can certify ``delta``."""
        if self.min_verdicts is not None:
            return self.min_verdicts
        return verdicts_to_certify(self.delta, self.confidence)


def verdicts_to_certify(delta: float, confidence: float) -> int:
    """The fewest verdicts, all correct, whose one-sided Clopper-Pearson upper bound at
    ``confidence`` on the wrong share is at most ``delta``: 1 - (1 - confidence)^(1/n) <= delta."""
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - delta) - 1e-9)


class GlobalThreshold(_Closed):
    """The arm's ``threshold`` (and ``cluster_thresholds``) decide: the default."""

    kind: Literal["global"] = "global"


ThresholdPolicy = Annotated[GlobalThreshold | ErrorBoundedThresholds, Field(discriminator="kind")]


class CanaryConfig(_Closed):
    """A pending threshold (and, on a multi arm, score floor / answer margin) change tried
    on a share of one arm's units first.

    Units of the arm whose canary hash falls under ``share`` see ``threshold``;
    the dashboard promotes the canary (it becomes the arm's threshold) or rolls it
    back, automatically when its false-hit rate breaches the target with confidence.
    """

    threshold: float = Field(ge=-1.0, le=1.0)
    share: float = Field(gt=0.0, le=1.0)
    target_false_hit_rate: float = Field(0.05, gt=0.0, lt=1.0)
    started_at_ms: int = 0
    score_floor: float | None = Field(None, ge=-1.0, le=1.0)
    """Multi arms only: the mixed-score floor the canary units use (None: the arm's)."""
    answer_margin: float | None = Field(None, ge=0.0, le=1.0)
    """Multi arms only: the answer margin the canary units use (None: the arm's)."""
    judge: JudgeConfig | None = None
    """The judge (version, operating point) the canary units use (None: the arm's): a new judge
    version goes out as a canary like a threshold."""

    @property
    def multi_override(self) -> dict[str, float]:
        """The MultiSimilarityConfig fields this canary sets."""
        return {name: value for name, value in (("threshold", self.score_floor),
                                                ("answer_margin", self.answer_margin)) if value is not None}


class MultiSimilarityConfig(_Closed):
    """Re-ranking of the top-k candidates by a mixed score (cache_core.decision.rerank).

    Defaults chosen on tuning data only (GPTCache mock pairs with even index, a
    banking77 train split held out from the rest of train): the most correct hits
    on both while at most halving cosine's false hits on the mock pairs. Character
    trigrams beat word overlap there (paraphrases keep stems, not words), and a
    small margin suffices: it mostly refuses near-ties between stored questions
    with different answers. bench/results/compare_gptcache.md has the figures,
    including the held-out ones."""

    token: float = Field(0.5, ge=0.0, le=1.0)
    phrase: float = Field(0.6, ge=0.0, le=1.0)
    intent: float = Field(0.2, ge=0.0, le=1.0)
    lexical: LexicalKind = "char3"
    """What the token level compares: word tokens or character trigrams."""
    threshold: float = Field(0.55, ge=-1.0, le=1.0)
    """Mixed-score floor, applied after the arm's cosine threshold."""
    answer_margin: float = Field(0.005, ge=0.0, le=1.0)
    """The served candidate must beat every candidate with another answer by this much."""

    @model_validator(mode="after")
    def _some_weight(self) -> "MultiSimilarityConfig":
        if self.token + self.phrase + self.intent <= 0:
            raise ValueError("multi similarity needs a positive weight")
        return self


class ArmConfig(_Closed):
    name: str = Field(min_length=1, max_length=64)
    # Finite: an infinite weight makes the arm probabilities NaN (every unit in the last arm).
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    threshold: float = Field(0.82, ge=-1.0, le=1.0)
    cluster_thresholds: dict[int, Annotated[float, Field(ge=-1.0, le=1.0)]] = Field(default_factory=dict)
    index_kind: IndexKind = "flat"
    ivf_nlist: int = Field(64, ge=1)
    ivf_nprobe: int = Field(8, ge=1)
    hnsw_m: int = Field(32, ge=4)
    hnsw_ef_search: int = Field(64, ge=1)
    pq_m: int = Field(48, ge=1, le=1024)
    """ivf_pq: sub-quantizers per vector (bytes per code at 8 bits); must divide the dimension."""
    pq_nbits: int = Field(8, ge=4, le=12)
    """ivf_pq: bits per sub-quantizer code."""
    semhash_tables: Literal[1, 2, 4, 8] = 4
    """semhash: hash tables the 64-bit fingerprint is cut into (keys of 64/tables bits)."""
    semhash_radius: int = Field(4, ge=0, le=8)
    """semhash: bit flips of each table's key probed around the query's bucket."""
    semhash_seed: int = Field(0, ge=0, le=2**32 - 1)
    """semhash: seed of the random projection (replicas of an arm must agree)."""
    ann_candidates: int = Field(16, ge=1, le=1024)
    """Compressed and hashed kinds: candidates taken from the structure and re-scored exactly."""
    ttl_policy: TtlPolicy = "absolute"
    ttl_s: float = Field(3600.0, gt=0, allow_inf_nan=False)
    """absolute / sliding: the entries' lifetime (renewed by each hit when sliding)."""
    ttl_min_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    ttl_max_s: float = Field(300.0, gt=0, allow_inf_nan=False)
    """adaptive: each entry's predicted lifetime (cache_core.lifetime) is clamped to
    [ttl_min_s, ttl_max_s] and re-predicted at each hit (never past max_age_s)."""
    max_age_s: float = Field(86400.0, gt=0, allow_inf_nan=False)
    guards: list[GuardName] = Field(default_factory=list)
    capacity_entries: int = Field(100_000, ge=1)
    capacity_bytes: int = Field(512 * 1024 * 1024, ge=1)
    """The store's memory budget, in entries and bytes: past it the LRU entry is evicted, or
    demoted to the disk tier if the arm has one."""
    disk_entries: int = Field(0, ge=0)
    """Entries the store keeps on local disk beyond its memory budget (cache_core.store.disk_tier:
    compressed, searched with every lookup, promoted on a hit); 0: none, evicted entries are dropped."""
    ann_check_rate: float = Field(0.1, ge=0.0, le=1.0)
    feedback_sample_rate: float = Field(0.0, ge=0.0, le=1.0)
    """Share of hits on which the service asks the user for a verdict (``feedback_requested`` in the
    lookup response, the chat header x-scache-feedback-requested), logged with the event so the
    false-hit rate can weigh those verdicts by 1 / rate (docs/solicited_feedback.md); 0: never asks."""
    canary: CanaryConfig | None = None
    similarity: SimilarityKind = "cosine"
    """"cosine": serve the nearest candidate at or above the threshold. "multi": re-rank
    the candidates at or above it by ``multi`` (cache_core.decision.rerank)."""
    multi: MultiSimilarityConfig = Field(default_factory=MultiSimilarityConfig)
    judge: JudgeConfig | None = None
    """A learned second stage after the threshold (None: the threshold decides)."""
    threshold_policy: ThresholdPolicy = Field(default_factory=GlobalThreshold)
    """How the cosine threshold is chosen: "global" (``threshold`` / ``cluster_thresholds``) or
    "error_bounded" (learnt from verdicts under ``delta``; canary units keep the canary's)."""
    invalidate_after_wrong: int = Field(1, ge=0)
    """Remove an entry once this many units (users) got a "wrong" verdict on a hit it served
    (cache_core.state.feedback); 0: feedback never removes entries."""

    @field_validator("name")
    @classmethod
    def _not_holdout(cls, name: str) -> str:
        if name == HOLDOUT_ARM:
            raise ValueError(f"arm name {HOLDOUT_ARM!r} is reserved")
        return name

    @model_validator(mode="after")
    def _ttl_range(self) -> "ArmConfig":
        if self.ttl_min_s > self.ttl_max_s:
            raise ValueError(f"arm {self.name!r}: ttl_min_s ({self.ttl_min_s}) is above ttl_max_s ({self.ttl_max_s})")
        return self

    @model_validator(mode="after")
    def _multi_canary_on_multi_arm(self) -> "ArmConfig":
        if self.canary is not None and self.canary.multi_override and self.similarity != "multi":
            raise ValueError(f"arm {self.name!r}: a canary score floor / answer margin needs similarity 'multi'")
        return self


class ExperimentConfig(_Closed):
    experiment_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    salt: str = Field(min_length=1)
    # Share of units that enter the experiment; the rest are holdout and
    # bypass the cache, giving the no-cache baseline.
    traffic_share: float = Field(1.0, ge=0.0, le=1.0)
    partition_mode: PartitionMode = "partitioned"
    arms: list[ArmConfig] = Field(min_length=1)
    # Events carry it as a ClickHouse Int64 (and Flink BIGINT): a larger one would make them unstorable.
    version: int = Field(1, ge=1, le=2**63 - 1)
    updated_by: str = "config-file"
    updated_at_ms: int = 0

    @model_validator(mode="after")
    def _unique_arms(self) -> "ExperimentConfig":
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate arm names in {self.experiment_id}: {names}")
        return self

    def arm(self, name: str) -> ArmConfig:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(f"experiment {self.experiment_id!r} has no arm {name!r}")

    def arm_probabilities(self) -> dict[str, float]:
        """Probability that a random unit lands in each arm (holdout included)."""
        total = sum(a.weight for a in self.arms)
        probs = {a.name: self.traffic_share * a.weight / total for a in self.arms}
        probs[HOLDOUT_ARM] = 1.0 - self.traffic_share
        return probs


def parse_experiment(data: object) -> ExperimentConfig:
    """An experiment config from outside (the YAML file, a decoded JSON object): unknown fields
    at any level and wrong types (a string or bool for a number) are refused, int -> float is fine."""
    return ExperimentConfig.model_validate(data, strict=True)


def parse_experiment_json(raw: str | bytes) -> ExperimentConfig:
    """``parse_experiment`` for a JSON document (JSON object keys, e.g. cluster ids, are strings)."""
    return ExperimentConfig.model_validate_json(raw, strict=True)


class Assignment(BaseModel):
    experiment_id: str
    arm: str
    probability: float
    config_version: int
    variant: Variant = "base"

    @property
    def is_holdout(self) -> bool:
        return self.arm == HOLDOUT_ARM


def _unit_bucket(salt: str, unit_id: str) -> float:
    """Uniform in [0, 1), stable across processes, hosts and restarts."""
    digest = hashlib.sha256(f"{salt}:{unit_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign(experiment: ExperimentConfig, unit_id: str) -> Assignment:
    """Deterministically pick the arm for a unit (user, session, tenant...)."""
    probs = experiment.arm_probabilities()
    point = _unit_bucket(experiment.salt, unit_id)
    if point >= experiment.traffic_share:
        arm = HOLDOUT_ARM
    else:
        # Re-scale within the experiment's share so arm weights split it.
        inner = point / experiment.traffic_share if experiment.traffic_share else 0.0
        total = sum(a.weight for a in experiment.arms)
        cumulative, arm = 0.0, experiment.arms[-1].name
        for candidate in experiment.arms:
            cumulative += candidate.weight / total
            if inner < cumulative:
                arm = candidate.name
                break
    variant: Variant = "base"
    if arm != HOLDOUT_ARM:
        canary = experiment.arm(arm).canary
        # An independent hash, so the canary share is a random sample of the arm.
        if canary is not None and _unit_bucket(f"{experiment.salt}:canary:{arm}", unit_id) < canary.share:
            variant = "canary"
    return Assignment(
        experiment_id=experiment.experiment_id,
        arm=arm,
        probability=probs[arm],
        config_version=experiment.version,
        variant=variant,
    )


def load_experiments(path: Path) -> dict[str, ExperimentConfig]:
    """Read the experiments file (YAML: ``experiments: [ {...}, ... ]``)."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"experiments file {path} is not valid YAML: {' '.join(str(exc).split())}") from exc
    except FileNotFoundError as exc:
        raise ValueError(f"experiments file not found: {path}") from exc
    except OSError as exc:  # a directory, no permission, ...
        raise ValueError(f"cannot read experiments file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"experiments file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    items = raw.get("experiments", []) if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"experiments file {path} must hold a mapping with a list under 'experiments:'")
    try:
        experiments = [parse_experiment(item) for item in items]
    except ValidationError as exc:  # one line per problem is too many for a start-up error
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'experiment'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        raise ValueError(f"experiments file {path}: {problems}") from exc
    by_id = {e.experiment_id: e for e in experiments}
    if len(by_id) != len(experiments):
        raise ValueError(f"duplicate experiment ids in {path}")
    return by_id
