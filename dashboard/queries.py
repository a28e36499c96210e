"""Named, parameterised ClickHouse queries behind the dashboard.

Every value from the UI reaches ClickHouse as a server-side parameter
(``{name:Type}`` in the SQL, ``parameters=`` in clickhouse-connect); the SQL text
itself is fixed at import time. ``window_agg`` is a ReplacingMergeTree, so every
read of it uses FINAL: a window re-emitted after a restart must count once.

Each function takes a clickhouse-connect client and typed arguments and returns a
pandas DataFrame (empty, with the documented columns, when there is no data).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

import pandas as pd

from udfs.buckets import LATENCY_BOUNDS_MS, histogram_quantile

Breakdown = Literal["intent_cluster", "lifetime_bucket", "index_kind"]
BREAKDOWNS: tuple[Breakdown, ...] = ("intent_cluster", "lifetime_bucket", "index_kind")
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


def _epoch_ms(moment: datetime) -> int:
    if moment.tzinfo is None:  # naive datetimes are UTC throughout scache
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


# Shared WHERE clause of the window_agg queries (a constant, not user input).
_WINDOW_FILTER = """
WHERE experiment_id = {experiment_id:String}
  AND window_start >= fromUnixTimestamp64Milli({start_ms:Int64}, 'UTC')
  AND window_start < fromUnixTimestamp64Milli({end_ms:Int64}, 'UTC')
  AND ({namespace:String} = '' OR namespace = {namespace:String})
"""

ARM_SUMMARY_SQL = f"""
SELECT arm,
       sum(requests) AS requests,
       sum(hits) AS hits,
       sum(decayed_hits) AS decayed_hits,
       sum(similarity_sum) AS similarity_sum,
       sum(similarity_count) AS similarity_count,
       sum(ann_checks) AS ann_checks,
       sum(ann_agreements) AS ann_agreements,
       sum(guard_blocks) AS guard_blocks,
       sum(latency_sum_ms) AS latency_sum_ms
FROM window_agg FINAL
{_WINDOW_FILTER}
GROUP BY arm
ORDER BY arm
"""

LATENCY_HIST_SQL = f"""
SELECT arm, sum(requests) AS requests, sumForEach(latency_hist) AS latency_hist
FROM window_agg FINAL
{_WINDOW_FILTER}
GROUP BY arm
ORDER BY arm
"""

TIMESERIES_SQL = f"""
SELECT arm,
       toStartOfInterval(window_start, toIntervalSecond({{bucket_s:UInt32}}), 'UTC') AS bucket,
       sum(requests) AS requests,
       sum(hits) AS hits
FROM window_agg FINAL
{_WINDOW_FILTER}
GROUP BY arm, bucket
ORDER BY bucket, arm
"""

_BREAKDOWN_TEMPLATE = """
SELECT arm,
       {dimension},
       sum(requests) AS requests,
       sum(hits) AS hits,
       sum(decayed_hits) AS decayed_hits,
       sum(similarity_sum) AS similarity_sum,
       sum(similarity_count) AS similarity_count,
       sum(ann_checks) AS ann_checks,
       sum(ann_agreements) AS ann_agreements
FROM window_agg FINAL
{where}
GROUP BY arm, {dimension}
ORDER BY arm, {dimension}
"""
# Built once from the closed BREAKDOWNS vocabulary: column names never come from input.
BREAKDOWN_SQL: dict[str, str] = {
    dim: _BREAKDOWN_TEMPLATE.format(dimension=dim, where=_WINDOW_FILTER) for dim in BREAKDOWNS
}

NAMESPACES_SQL = """
SELECT DISTINCT namespace FROM window_agg
WHERE experiment_id = {experiment_id:String}
ORDER BY namespace
"""

# Similarities of real decisions (holdout bypasses and heartbeats excluded), binned
# at SIMILARITY_BIN. A NULL bin is a lookup against an empty index: a miss at any threshold.
SIMILARITY_HIST_SQL = """
SELECT arm,
       toInt64(floor(similarity * 1000 + 1e-9)) AS similarity_milli,
       count() AS decisions,
       countIf(hit) AS hits,
       countIf(guard IS NOT NULL) AS guard_blocks
FROM events_raw FINAL
WHERE event_type = 'decision'
  AND decision IN ('hit', 'miss')
  AND experiment_id = {experiment_id:String}
  AND ts_ms >= {start_ms:Int64} AND ts_ms < {end_ms:Int64}
  AND ({namespace:String} = '' OR namespace = {namespace:String})
GROUP BY arm, similarity_milli
ORDER BY arm, similarity_milli
"""

THRESHOLD_CHANGES_SQL = """
SELECT ts, experiment_id, arm, old_threshold, new_threshold,
       old_version, new_version, actor, reason
FROM threshold_changes
WHERE experiment_id = {experiment_id:String}
  AND ts >= fromUnixTimestamp64Milli({start_ms:Int64}, 'UTC')
  AND ts < fromUnixTimestamp64Milli({end_ms:Int64}, 'UTC')
ORDER BY ts
"""

# Experiments known to the warehouse: defined ones (latest version) and any that
# only appear in the aggregates (e.g. defined before the table existed).
EXPERIMENTS_SQL = """
SELECT experiment_id, max(v) AS version, argMax(cfg, v) AS config_json
FROM (
    SELECT experiment_id, version AS v, config_json AS cfg FROM experiments FINAL
    UNION ALL
    SELECT DISTINCT toString(experiment_id), toInt64(0) AS v, '' AS cfg FROM window_agg
)
WHERE experiment_id != ''
GROUP BY experiment_id
ORDER BY experiment_id
"""


_SUMS = ["requests", "hits", "decayed_hits", "similarity_sum", "similarity_count",
         "ann_checks", "ann_agreements"]
COLUMNS: dict[str, list[str]] = {
    ARM_SUMMARY_SQL: ["arm", *_SUMS, "guard_blocks", "latency_sum_ms"],
    LATENCY_HIST_SQL: ["arm", "requests", "latency_hist"],
    TIMESERIES_SQL: ["arm", "bucket", "requests", "hits"],
    **{sql: ["arm", dim, *_SUMS] for dim, sql in BREAKDOWN_SQL.items()},
    SIMILARITY_HIST_SQL: ["arm", "similarity_milli", "decisions", "hits", "guard_blocks"],
    THRESHOLD_CHANGES_SQL: ["ts", "experiment_id", "arm", "old_threshold", "new_threshold",
                            "old_version", "new_version", "actor", "reason"],
    EXPERIMENTS_SQL: ["experiment_id", "version", "config_json"],
}
"""Output columns of each query: an empty result carries no column names."""


def _frame(client, sql: str, parameters: dict) -> pd.DataFrame:
    result = client.query(sql, parameters=parameters)
    columns = COLUMNS[sql]
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
    df = _with_hit_rate(_frame(client, ARM_SUMMARY_SQL, filters.parameters()))
    requests = df["requests"].astype("float64")
    df["latency_mean_ms"] = (df["latency_sum_ms"] / requests).where(requests > 0)
    count = df["similarity_count"].astype("float64")
    df["similarity_mean"] = (df["similarity_sum"] / count).where(count > 0)
    return df


def latency_quantiles(client, filters: Filters,
                      quantiles: tuple[float, ...] = (0.5, 0.95, 0.99)) -> pd.DataFrame:
    """Per arm: the merged latency histogram and its quantiles (columns ``p50_ms`` etc.)."""
    df = _frame(client, LATENCY_HIST_SQL, filters.parameters())
    for q in quantiles:
        df[f"p{round(q * 100):d}_ms"] = [
            histogram_quantile(list(hist), q, LATENCY_BOUNDS_MS) if len(hist) else None
            for hist in df["latency_hist"]
        ]
    return df


def hit_rate_timeseries(client, filters: Filters, bucket_s: int) -> pd.DataFrame:
    """Per arm and time bucket (``bucket``, UTC): requests, hits, hit_rate."""
    if bucket_s < 1:
        raise ValueError(f"bucket_s must be >= 1, got {bucket_s}")
    df = _frame(client, TIMESERIES_SQL, {**filters.parameters(), "bucket_s": int(bucket_s)})
    df = _with_hit_rate(df)
    if not df.empty:
        df["bucket"] = pd.to_datetime(df["bucket"], utc=True)
    return df


def breakdown(client, filters: Filters, dimension: Breakdown) -> pd.DataFrame:
    """Per arm x ``dimension``: counts, hit_rate and ANN precision (agreements / checks)."""
    if dimension not in BREAKDOWN_SQL:
        raise ValueError(f"unknown breakdown {dimension!r}; choose one of {BREAKDOWNS}")
    df = _with_hit_rate(_frame(client, BREAKDOWN_SQL[dimension], filters.parameters()))
    checks = df["ann_checks"].astype("float64")
    df["ann_precision"] = (df["ann_agreements"] / checks).where(checks > 0)
    return df


def namespaces(client, experiment_id: str) -> list[str]:
    """Namespaces that have aggregates for the experiment."""
    result = client.query(NAMESPACES_SQL, parameters={"experiment_id": experiment_id})
    return [row[0] for row in result.result_rows]


def similarity_histogram(client, filters: Filters) -> pd.DataFrame:
    """Per arm x similarity bin (``similarity_milli``; NA = empty index): decisions, hits, guard blocks."""
    df = _frame(client, SIMILARITY_HIST_SQL, filters.parameters())
    df["similarity_milli"] = df["similarity_milli"].astype("Int64")
    return df


def threshold_changes(client, filters: Filters) -> pd.DataFrame:
    """Audit rows of threshold changes of the experiment inside the time range."""
    df = _frame(client, THRESHOLD_CHANGES_SQL, filters.parameters())
    if not df.empty:
        df["ts"] = pd.to_datetime(df["ts"], utc=True)
    return df


def experiments(client) -> pd.DataFrame:
    """Experiment ids with their latest stored version and ``config_json`` ('' if only seen in data)."""
    return _frame(client, EXPERIMENTS_SQL, {})
