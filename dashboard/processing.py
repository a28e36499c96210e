"""pandas transforms between query results and what the pages show (no Streamlit)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pandas as pd

from cache_core.experiments import HOLDOUT_ARM, ExperimentConfig
from dashboard.stats import ProportionStat, SrmResult, diff_of_proportions, srm_check, wilson_interval

TIME_RANGES: dict[str, timedelta] = {
    "Last 15 minutes": timedelta(minutes=15),
    "Last hour": timedelta(hours=1),
    "Last 6 hours": timedelta(hours=6),
    "Last 24 hours": timedelta(days=1),
    "Last 7 days": timedelta(days=7),
    "Last 30 days": timedelta(days=30),
}
TIMESERIES_POINTS = 60


def time_window(label: str, now: datetime | None = None) -> tuple[datetime, datetime]:
    """[start, end) for a preset label, ending a minute ahead so the open window shows."""
    if label not in TIME_RANGES:
        raise ValueError(f"unknown time range {label!r}; choose one of {list(TIME_RANGES)}")
    now = now or datetime.now(timezone.utc)
    return now - TIME_RANGES[label], now + timedelta(minutes=1)


def bucket_seconds(start: datetime, end: datetime, window_s: int) -> int:
    """Time-series bucket: about TIMESERIES_POINTS points, never finer than the job's window."""
    span = (end - start).total_seconds()
    raw = max(window_s, int(span // TIMESERIES_POINTS))
    return max(window_s, (raw // window_s) * window_s)


def baseline_arm(arms: list[str], config: ExperimentConfig | None) -> str | None:
    """The arm others are compared with: 'control' if present, else the first configured arm."""
    if "control" in arms:
        return "control"
    if config is not None:
        for arm in config.arms:
            if arm.name in arms:
                return arm.name
    candidates = [a for a in arms if a != HOLDOUT_ARM]
    return candidates[0] if candidates else None


def overview_frame(summary: pd.DataFrame, latency: pd.DataFrame,
                   cost_per_call_usd: float = 0.0) -> pd.DataFrame:
    """Per arm: requests, hits, hit rate with its 95% Wilson interval, latency quantiles."""
    rows = []
    lat = latency.set_index("arm") if not latency.empty else pd.DataFrame()
    for r in summary.itertuples(index=False):
        ci = wilson_interval(ProportionStat(int(r.requests), int(r.hits)))
        rows.append({
            "arm": r.arm, "requests": int(r.requests), "hits": int(r.hits),
            "hit_rate": ci.rate, "ci_low": ci.low, "ci_high": ci.high,
            "p50_ms": lat.at[r.arm, "p50_ms"] if r.arm in lat.index else None,
            "p95_ms": lat.at[r.arm, "p95_ms"] if r.arm in lat.index else None,
            "latency_mean_ms": r.latency_mean_ms, "similarity_mean": r.similarity_mean,
            "guard_blocks": int(r.guard_blocks),
            "savings_usd": int(r.hits) * cost_per_call_usd,
        })
    return pd.DataFrame(rows)


def format_p_value(p: float | None) -> str:
    """A p-value for display: '<0.0001' rather than a misleading 0.0000, '—' when not computed."""
    if p is None or p != p:
        return "—"
    return "<0.0001" if p < 0.0001 else f"{p:.4f}"


def comparison_frame(summary: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Every non-holdout arm vs ``baseline``: difference in hit rate, 95% CI, p-value, status."""
    stats = {r.arm: ProportionStat(int(r.requests), int(r.hits)) for r in summary.itertuples(index=False)}
    if baseline not in stats:
        return pd.DataFrame()
    rows = []
    for arm, stat in stats.items():
        if arm in (baseline, HOLDOUT_ARM):
            continue
        result = diff_of_proportions(stats[baseline], stat)
        rows.append({"arm": arm, "vs": baseline, "diff": result.diff,
                     "ci_low": result.ci_low, "ci_high": result.ci_high,
                     "relative_lift": result.relative_lift, "p_value": result.p_value,
                     "p": format_p_value(result.p_value), "status": result.status, "detail": result.detail})
    return pd.DataFrame(rows)


def srm_for(summary: pd.DataFrame, config: ExperimentConfig) -> SrmResult:
    """SRM check of observed requests per arm against the config's assignment probabilities."""
    weights = {arm: p for arm, p in config.arm_probabilities().items() if p > 0}
    observed = {r.arm: int(r.requests) for r in summary.itertuples(index=False) if r.requests}
    return srm_check(observed, weights)


def precision_frame(by_index: pd.DataFrame) -> pd.DataFrame:
    """ANN precision per arm x index kind, with its 95% Wilson interval."""
    rows = []
    for r in by_index.itertuples(index=False):
        ci = wilson_interval(ProportionStat(int(r.ann_checks), int(r.ann_agreements)))
        rows.append({"arm": r.arm, "index_kind": r.index_kind or "(unknown)",
                     "requests": int(r.requests), "ann_checks": int(r.ann_checks),
                     "ann_precision": ci.rate, "ci_low": ci.low, "ci_high": ci.high})
    return pd.DataFrame(rows)


def top_clusters(by_cluster: pd.DataFrame, limit: int) -> pd.DataFrame:
    """Rows of the ``limit`` intent clusters with the most requests (all arms together)."""
    if by_cluster.empty:
        return by_cluster
    volume = by_cluster.groupby("intent_cluster")["requests"].sum().nlargest(limit)
    return by_cluster[by_cluster["intent_cluster"].isin(volume.index)]
