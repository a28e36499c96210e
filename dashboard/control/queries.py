"""Named, parameterised ClickHouse queries behind the dashboard and auto-tune.

The SQL text is in ``sql`` (fixed at import time); every value from the UI reaches
ClickHouse as a server-side parameter (``Filters.parameters``, ``MultiRule``).

Each function takes a clickhouse-connect client and typed arguments and returns a
pandas DataFrame (empty, with the documented columns, when there is no data).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
import pandas as pd

from cache_core.experiments import ExperimentConfig
from dashboard.control import sql, sql_units, sql_verdicts
from udfs.buckets import LATENCY_BOUNDS_MS, histogram_quantile

SIMILARITY_BIN = 0.001
"""Resolution of the logged-similarity histogram used for what-if estimates."""


@dataclass(frozen=True)
class Filters:
    """What every attribution query is narrowed by: experiment, [start, end) and namespace."""

    experiment_id: str
    start: datetime
    end: datetime
    namespace: str | None = None
    """None (or "") means every namespace."""

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"time range is empty: start {self.start} is not before end {self.end}")

    def parameters(self) -> dict:
        return {
            "experiment_id": self.experiment_id,
            "start_ms": _epoch_ms(self.start),
            "end_ms": _epoch_ms(self.end),
            "namespace": self.namespace or "",
        }


@dataclass(frozen=True)
class MultiRule:
    """A multi-similarity arm's mixed-score floor and answer margin, re-applied to its
    logged ``score`` / ``score_margin`` by the what-if queries."""

    arm: str
    score_floor: float
    answer_margin: float


def multi_rules(config: ExperimentConfig | None) -> tuple[MultiRule, ...]:
    """The current rule of every multi arm of ``config`` (() for None or cosine-only)."""
    if config is None:
        return ()
    return tuple(MultiRule(a.name, float(a.multi.threshold), float(a.multi.answer_margin))
                 for a in config.arms if a.similarity == "multi")


def _multi_parameters(rules: Sequence[MultiRule]) -> dict:
    return {"multi_arms": [r.arm for r in rules], "score_floors": [float(r.score_floor) for r in rules],
            "answer_margins": [float(r.answer_margin) for r in rules]}


def _epoch_ms(moment: datetime) -> int:
    if moment.tzinfo is None:  # naive datetimes are UTC throughout scache
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def _frame(client, text: str, parameters: dict) -> pd.DataFrame:
    result = client.query(text, parameters=parameters)
    columns = sql.COLUMNS.get(text) or sql_units.COLUMNS.get(text) or sql_verdicts.COLUMNS[text]
    if result.column_names and list(result.column_names) != columns:
        raise RuntimeError(f"query returned columns {list(result.column_names)}, expected {columns}")
    return pd.DataFrame(result.result_rows, columns=columns)


def _with_hit_rate(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    requests = df["requests"].astype("float64")
    df["hit_rate"] = (df["hits"].astype("float64") / requests).where(requests > 0)
    return df


def arm_summary(client, filters: Filters) -> pd.DataFrame:
    """Per arm: requests, hits, hit_rate, decayed hits, similarity, ANN and guard counts, mean latency."""
    df = _with_hit_rate(_frame(client, sql.ARM_SUMMARY_SQL, filters.parameters()))
    requests = df["requests"].astype("float64")
    df["latency_mean_ms"] = (df["latency_sum_ms"] / requests).where(requests > 0)
    count = df["similarity_count"].astype("float64")
    df["similarity_mean"] = (df["similarity_sum"] / count).where(count > 0)
    return df


def latency_quantiles(client, filters: Filters,
                      quantiles: tuple[float, ...] = (0.5, 0.95, 0.99)) -> pd.DataFrame:
    """Per arm: the merged latency histogram and its quantiles (columns ``p50_ms`` etc.)."""
    df = _frame(client, sql.LATENCY_HIST_SQL, filters.parameters())
    for q in quantiles:
        df[f"p{round(q * 100):d}_ms"] = [
            histogram_quantile(list(hist), q, LATENCY_BOUNDS_MS) if len(hist) else None
            for hist in df["latency_hist"]
        ]
    return df


def _check_bucket(bucket_s: int) -> None:
    if bucket_s < 1:
        raise ValueError(f"bucket_s must be >= 1, got {bucket_s}")


def hit_rate_timeseries(client, filters: Filters, bucket_s: int) -> pd.DataFrame:
    """Per arm and time bucket (``bucket``, UTC): requests, hits, hit_rate, mean and p50/p95 latency."""
    _check_bucket(bucket_s)
    df = _frame(client, sql.TIMESERIES_SQL, {**filters.parameters(), "bucket_s": int(bucket_s)})
    df = _with_hit_rate(df)
    df["latency_mean_ms"] = (df["latency_sum_ms"] / df["requests"].astype("float64")).where(df["requests"] > 0)
    for q in (0.5, 0.95):
        df[f"p{round(q * 100):d}_ms"] = [histogram_quantile(list(h), q, LATENCY_BOUNDS_MS) if len(h) and sum(h) else None
                                         for h in df["latency_hist"]]
    if not df.empty:
        df["bucket"] = pd.to_datetime(df["bucket"], utc=True)
    return df.drop(columns=["latency_hist"])


def _with_false_hit_rate(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    labelled = (df["correct"] + df["wrong"]).astype("float64")
    df["labelled"] = labelled.astype("int64")
    df["false_hit_rate"] = (df["wrong"].astype("float64") / labelled).where(labelled > 0)
    return df


def false_hits(client, filters: Filters) -> pd.DataFrame:
    """Per arm x variant: correct / wrong labelled hits (feedback_agg), labelled, false_hit_rate."""
    return _with_false_hit_rate(_frame(client, sql.FALSE_HITS_SQL, filters.parameters()))


def shadow_verdicts(client, filters: Filters) -> pd.DataFrame:
    """Shadow checks' verdicts per arm x decision ("hit": served answers re-asked upstream; "miss":
    near-misses, the nearest candidate's answer against the miss's upstream answer) x similarity bin
    (``similarity_milli``, 0.01 wide): correct, wrong, labelled, false_hit_rate."""
    return _with_false_hit_rate(_frame(client, sql_verdicts.SHADOW_VERDICTS_SQL, filters.parameters()))


def shadow_labelled(client, filters: Filters) -> pd.DataFrame:
    """Shadow verdicts per arm x intent cluster x decision ("hit" / "miss": a near-miss) x similarity
    bin (0.001, as ``similarity_histogram``): correct, wrong. What ``shadow_estimates`` reads."""
    return _frame(client, sql_verdicts.SHADOW_LABELLED_SQL, filters.parameters())


def canary_shadow_stats(client, experiment_id: str, arm: str, since_ms: int) -> pd.DataFrame:
    """Per variant (base / canary) of one arm since ``since_ms``: its hits' shadow verdicts."""
    return _frame(client, sql_verdicts.CANARY_SHADOW_SQL,
                  {"experiment_id": experiment_id, "arm": arm, "since_ms": int(since_ms)})


def judge_probabilities(client, filters: Filters) -> pd.DataFrame:
    """Judged decisions (hits and judge vetoes) per arm x judge version x probability bin (0.001):
    decisions, hits, users' verdicts on the hits, shadow checks' on the hits and on the vetoes."""
    return _frame(client, sql_verdicts.JUDGE_PROBABILITY_SQL, filters.parameters())


def shadow_strata(client, filters: Filters) -> pd.DataFrame:
    """Per arm x ``epoch_hour``: hits, shadow-checked hits and the wrong ones: the strata of
    ``shadow_estimate.weighted_rate``."""
    return _frame(client, sql_verdicts.SHADOW_STRATA_SQL, filters.parameters())


def judge_versions(client, filters: Filters) -> pd.DataFrame:
    """Per arm x judge version ('' = no judge): requests, hits, judged, judge_ms_mean / _p95 (the judge
    stage's added latency), and users' and shadow checks' verdicts on the hits, apart
    (``verdicts.judge_frame`` adds the rates)."""
    return _frame(client, sql_verdicts.JUDGE_VERSIONS_SQL, filters.parameters())


def threshold_sources(client, filters: Filters) -> pd.DataFrame:
    """Error-bounded arms' lookups per arm x threshold_source (entry / cluster / arm / static) with the
    hits' users' and shadow verdicts (``sql_verdicts.THRESHOLD_SOURCES_SQL``); empty for other arms."""
    return _frame(client, sql_verdicts.THRESHOLD_SOURCES_SQL, filters.parameters())


TIERS = ("memory", "disk")
"""The store tiers a hit can come from (cache_core.events.CacheEvent.tier)."""


def tier_hit_rates(client, filters: Filters) -> pd.DataFrame:
    """Per arm x store tier (``TIERS``), from the aggregates: requests (the arm's), hits the
    tier served and hit_rate = those hits / the arm's requests (an arm's tiers add up to its
    hit rate)."""
    wide = _frame(client, sql.TIER_HITS_SQL, filters.parameters())
    return tier_frame(wide)


def tier_frame(wide: pd.DataFrame) -> pd.DataFrame:
    """``TIER_HITS_SQL``'s rows (arm, requests, hits_memory, hits_disk) one row per arm x tier."""
    rows = [{"arm": row.arm, "tier": tier, "requests": int(row.requests), "hits": int(getattr(row, f"hits_{tier}"))}
            for row in wide.itertuples(index=False) for tier in TIERS]
    return _with_hit_rate(pd.DataFrame(rows, columns=["arm", "tier", "requests", "hits"]))


def hit_tiers(client, filters: Filters) -> pd.DataFrame:
    """Per arm x store tier ("memory" / "disk"): hits, search and lookup time, users' verdicts."""
    return _frame(client, sql_verdicts.HIT_TIERS_SQL, filters.parameters())


def false_hit_timeseries(client, filters: Filters, bucket_s: int) -> pd.DataFrame:
    """Per arm and time bucket: correct, wrong, labelled, false_hit_rate."""
    _check_bucket(bucket_s)
    df = _with_false_hit_rate(_frame(client, sql.FALSE_HITS_TIMESERIES_SQL,
                                     {**filters.parameters(), "bucket_s": int(bucket_s)}))
    if not df.empty:
        df["bucket"] = pd.to_datetime(df["bucket"], utc=True)
    return df


def variant_summary(client, filters: Filters) -> pd.DataFrame:
    """Per arm x variant (base / canary): requests, hits, hit_rate."""
    return _with_hit_rate(_frame(client, sql.VARIANT_SUMMARY_SQL, filters.parameters()))


def labelled_similarity(client, filters: Filters, multi: Sequence[MultiRule] = ()) -> pd.DataFrame:
    """Per arm x intent cluster x similarity bin: feedback-labelled hits, correct and wrong
    (of ``multi`` arms only the hits their floor and margin would still serve)."""
    return _frame(client, sql.LABELLED_SIMILARITY_SQL, {**filters.parameters(), **_multi_parameters(multi)})


def canary_stats(client, experiment_id: str, arm: str, since_ms: int) -> pd.DataFrame:
    """Per variant of ``arm`` since ``since_ms`` (decision time): decisions, hits, correct, wrong."""
    return _frame(client, sql.CANARY_SQL, {"experiment_id": experiment_id, "arm": arm, "since_ms": int(since_ms)})


def canary_unit_stats(client, experiment_id: str, arm: str, since_ms: int) -> pd.DataFrame:
    """Per variant of ``arm`` since ``since_ms``, over users: the delta method's sums of
    decisions (x) and hits (y) per user (``ratio.RatioStat``): the canary's measured hit rate."""
    return _frame(client, sql_units.CANARY_UNITS_SQL, {"experiment_id": experiment_id, "arm": arm,
                                                       "since_ms": int(since_ms)})


def last_changes(client, experiment_id: str) -> pd.DataFrame:
    """Per arm: when its threshold last changed (any time) and the version it changed to."""
    df = _frame(client, sql.LAST_CHANGES_SQL, {"experiment_id": experiment_id})
    if not df.empty:
        df["last_change"] = pd.to_datetime(df["last_change"], utc=True)
    return df


def last_change_ms(last: pd.DataFrame) -> dict[str, int]:
    """Arm -> epoch ms of its last change, from a ``last_changes`` frame (the tuning cool-down)."""
    return {r.arm: int(r.last_change.timestamp() * 1000) for r in last.itertuples(index=False)}


def change_history(client, experiment_id: str, limit: int = 200) -> pd.DataFrame:
    """The experiment's audit rows, newest version first, each with the config it produced."""
    df = _frame(client, sql.CHANGE_HISTORY_SQL, {"experiment_id": experiment_id, "limit": int(limit)})
    if not df.empty:
        df["ts"] = pd.to_datetime(df["ts"], utc=True)
    return df


def audited_versions(client, experiment_id: str) -> set[int]:
    """Config versions of the experiment that have audit rows."""
    result = client.query(sql.AUDITED_VERSIONS_SQL, parameters={"experiment_id": experiment_id})
    return {int(row[0]) for row in result.result_rows}


def late_events(client, filters: Filters) -> pd.DataFrame:
    """Per arm: events the job dropped as later than its allowed lateness."""
    return _frame(client, sql.LATE_EVENTS_SQL, filters.parameters())


def breakdown(client, filters: Filters, dimension: sql.Breakdown) -> pd.DataFrame:
    """Per arm x ``dimension``: counts, hit_rate and ANN precision (agreements / checks)."""
    if dimension not in sql.BREAKDOWN_SQL:
        raise ValueError(f"unknown breakdown {dimension!r}; choose one of {sql.BREAKDOWNS}")
    df = _with_hit_rate(_frame(client, sql.BREAKDOWN_SQL[dimension], filters.parameters()))
    checks = df["ann_checks"].astype("float64")
    df["ann_precision"] = (df["ann_agreements"] / checks).where(checks > 0)
    return df


def cluster_examples(client, filters: Filters) -> pd.DataFrame:
    """Per intent cluster: up to EXAMPLES_PER_CLUSTER of its most frequent query texts in
    the range (``examples``, most frequent first) and how many decisions had a text."""
    return _frame(client, sql.CLUSTER_EXAMPLES_SQL, filters.parameters())


def namespaces(client, experiment_id: str) -> list[str]:
    """Namespaces that have aggregates for the experiment."""
    result = client.query(sql.NAMESPACES_SQL, parameters={"experiment_id": experiment_id})
    return [row[0] for row in result.result_rows]


def similarity_histogram(client, filters: Filters, multi: Sequence[MultiRule] = ()) -> pd.DataFrame:
    """Per arm x intent cluster x similarity bin (``similarity_milli``; NA = empty index):
    decisions, hits, guard blocks, and for ``multi`` arms the decisions their current
    floor / margin refuse (``multi_blocks``) and the lowest logged cosine threshold of
    those rows (``multi_min_threshold``, NaN without multi rows)."""
    df = _frame(client, sql.SIMILARITY_HIST_SQL, {**filters.parameters(), **_multi_parameters(multi)})
    df["similarity_milli"] = df["similarity_milli"].astype("Int64")
    df["multi_min_threshold"] = pd.to_numeric(df["multi_min_threshold"], errors="coerce").astype("float64")
    return df


def multi_margin_histogram(client, filters: Filters, multi: Sequence[MultiRule]) -> pd.DataFrame:
    """Per ``multi`` arm x answer-margin bin (``margin_milli``, NA = no rival answer): the
    decisions whose score reaches the arm's floor and no guard blocked, and their labelled
    hits (correct, wrong). Served at margin m iff the bin is NA or >= m."""
    df = _frame(client, sql.MULTI_MARGIN_SQL, {**filters.parameters(), **_multi_parameters(multi)})
    df["margin_milli"] = df["margin_milli"].astype("Int64")
    return df


def multi_score_histogram(client, filters: Filters, multi: Sequence[MultiRule]) -> pd.DataFrame:
    """Per ``multi`` arm x config version x mixed-score bin (``score_milli``) x answer-margin
    bin (``margin_milli``, NA = no rival answer): all decisions, the servable ones (multi
    mode, a score, no guard veto) and their labelled hits (correct, wrong)."""
    df = _frame(client, sql.MULTI_SCORE_SQL, {**filters.parameters(), "multi_arms": [r.arm for r in multi]})
    for col in ("score_milli", "margin_milli"):
        df[col] = df[col].astype("Int64")
    return df


def threshold_changes(client, filters: Filters) -> pd.DataFrame:
    """Audit rows of threshold changes of the experiment inside the time range."""
    df = _frame(client, sql.THRESHOLD_CHANGES_SQL, filters.parameters())
    if not df.empty:
        df["ts"] = pd.to_datetime(df["ts"], utc=True)
    return df


def experiments(client) -> pd.DataFrame:
    """Experiment ids with their latest stored version and ``config_json`` ('' if only seen in data)."""
    return _frame(client, sql.EXPERIMENTS_SQL, {})


def unit_stats(client, filters: Filters) -> pd.DataFrame:
    """Per arm, over users (``unit_id``): units and the delta method's sums of requests (x) and
    hits (y) per user (see ``ratio.RatioStat``). Every decision counts, the holdout's too."""
    return _frame(client, sql_units.UNIT_STATS_SQL, filters.parameters())


def unit_false_hits(client, filters: Filters) -> pd.DataFrame:
    """Per arm, over users: units and the sums of labelled hits (x) and wrong ones (y) per user."""
    return _frame(client, sql_units.UNIT_FALSE_HITS_SQL, filters.parameters())


def unit_solicited_false_hits(client, filters: Filters) -> pd.DataFrame:
    """Per arm, over users: the weighted (1 / feedback_prob) requested hits with a verdict (x) and
    the weighted wrong ones (y) per user: solicited verdicts only (docs/solicited_feedback.md)."""
    return _frame(client, sql_units.UNIT_SOLICITED_FALSE_HITS_SQL, filters.parameters())


def solicited_response(client, filters: Filters) -> pd.DataFrame:
    """Per arm: hits the service asked about, those answered, and their weighted sums."""
    return _frame(client, sql_units.SOLICITED_RESPONSE_SQL, filters.parameters())


def unit_path(client, filters: Filters, bucket_s: int) -> pd.DataFrame:
    """Per arm and time bucket: what the bucket adds to the cumulative per-user sums (new users,
    and the growth of sum x, y, x², y², xy); ``processing.cumulative_unit_paths`` adds them up."""
    _check_bucket(bucket_s)
    df = _frame(client, sql_units.UNIT_PATH_SQL, {**filters.parameters(), "bucket_s": int(bucket_s)})
    if not df.empty:
        df["bucket"] = pd.to_datetime(df["bucket"], utc=True)
    return df
