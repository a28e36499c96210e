"""pandas transforms between query results and what the pages show (no Streamlit).

Two units of analysis, said apart on the page: counts, rates, latency and cost are
per-request descriptions (from the attribution job's windows); every test, interval and
sample-ratio check is per user, the unit ``assign()`` randomises (``ratio``, from the
per-user sums of ``queries.unit_stats``). Given no per-user statistics (an older warehouse),
the frames fall back to per-request Wilson / z-test / mSPRT and say so in ``basis``.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pandas as pd

from cache_core.experiments import HOLDOUT_ARM, ExperimentConfig
from dashboard.control.ratio import (RatioStat, bayes_compare_ratios, diff_of_ratios, ratio_interval,
                                     sequential_path_ratios)
from dashboard.control.stats import (
    ProportionStat,
    SrmResult,
    bayes_compare,
    diff_of_proportions,
    holm_adjust,
    sequential_path,
    srm_check,
    wilson_interval,
)

TIME_RANGES: dict[str, timedelta] = {
    "Last 15 minutes": timedelta(minutes=15),
    "Last hour": timedelta(hours=1),
    "Last 6 hours": timedelta(hours=6),
    "Last 24 hours": timedelta(days=1),
    "Last 7 days": timedelta(days=7),
    "Last 30 days": timedelta(days=30),
}
TIMESERIES_POINTS = 60
PER_USER, PER_REQUEST = "per user", "per request"
"""``basis`` of a frame's intervals and tests: users as the unit (delta method) or requests."""
_UNIT_SUMS = ["sum_x", "sum_y", "sum_x2", "sum_y2", "sum_xy"]


def ratio_stats(units: pd.DataFrame | None) -> dict[str, RatioStat]:
    """Arm -> RatioStat from a ``queries.unit_stats`` / ``unit_false_hits`` frame ({} for None)."""
    if units is None or units.empty:
        return {}
    return {row["arm"]: RatioStat.from_sums(row) for row in units.to_dict("records")}


def cumulative_unit_paths(path: pd.DataFrame | None, arms: list[str]) -> dict[str, list[RatioStat]]:
    """Cumulative per-user statistics per arm at each time bucket (``queries.unit_path``): the
    looks of the sequential test. A bucket where an arm had no traffic repeats its totals."""
    if path is None or path.empty:
        return {arm: [] for arm in arms}
    cols = ["units", *_UNIT_SUMS]
    wide = path.pivot_table(index="bucket", columns="arm", values=cols, aggfunc="sum",
                            fill_value=0).sort_index().cumsum()
    out = {}
    for arm in arms:
        if ("units", arm) not in wide:
            out[arm] = []
            continue
        out[arm] = [RatioStat(int(row[0]), *map(float, row[1:]))
                    for row in zip(*(wide[(c, arm)] for c in cols))]
    return out


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


def overview_frame(summary: pd.DataFrame, latency: pd.DataFrame, cost_per_call_usd: float = 0.0, *,
                   tokens_per_call: int = 0, embedding_cost_usd: float = 0.0,
                   false_hits: pd.DataFrame | None = None, units: pd.DataFrame | None = None,
                   unit_false_hits: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per arm: traffic share, hit rate with its 95% interval, false-hit rate with its
    interval (labelled hits), latency quantiles, model calls, tokens and cost saved.

    Rates and counts are per request. The intervals are per user (delta method over the
    arm's users, ``units`` / ``unit_false_hits`` from queries.unit_stats / unit_false_hits,
    centred on the per-user data's own rate) when given, else per-request Wilson intervals;
    ``users`` and ``basis`` say which.

    A hit saves one upstream call (``cost_per_call_usd``, ``tokens_per_call`` tokens);
    every request of a cached arm pays the cache's own lookup (``embedding_cost_usd``),
    so ``net_savings_usd`` can be negative for an arm that rarely hits. The holdout
    bypasses the cache: no hits, no lookups.
    """
    rows = []
    lat = latency.set_index("arm") if not latency.empty else pd.DataFrame()
    labels = (false_hits.groupby("arm")[["correct", "wrong"]].sum()
              if false_hits is not None and not false_hits.empty else pd.DataFrame())
    total = int(summary["requests"].sum()) if not summary.empty else 0
    users, labelled_users = ratio_stats(units), ratio_stats(unit_false_hits)
    basis = PER_USER if units is not None else PER_REQUEST
    for r in summary.itertuples(index=False):
        correct, wrong = (int(labels.at[r.arm, "correct"]), int(labels.at[r.arm, "wrong"])) \
            if r.arm in labels.index else (0, 0)
        request_ci = wilson_interval(ProportionStat(int(r.requests), int(r.hits)))
        request_fh = wilson_interval(ProportionStat(correct + wrong, wrong))
        if units is not None:
            ci = ratio_interval(users[r.arm]) if r.arm in users else None
            fh = ratio_interval(labelled_users[r.arm]) if r.arm in labelled_users else None
        else:
            ci, fh = request_ci, request_fh
        lookups = 0 if r.arm == HOLDOUT_ARM else int(r.requests)
        savings = int(r.hits) * cost_per_call_usd
        rows.append({
            "arm": r.arm, "traffic_share": int(r.requests) / total if total else None,
            "requests": int(r.requests), "hits": int(r.hits),
            "users": users[r.arm].n if r.arm in users else None,
            "hit_rate": request_ci.rate, "ci_low": ci and ci.low, "ci_high": ci and ci.high,
            "labelled": correct + wrong, "false_hit_rate": request_fh.rate,
            "fh_low": fh and fh.low, "fh_high": fh and fh.high, "basis": basis,
            "p50_ms": lat.at[r.arm, "p50_ms"] if r.arm in lat.index else None,
            "p95_ms": lat.at[r.arm, "p95_ms"] if r.arm in lat.index else None,
            "latency_mean_ms": r.latency_mean_ms, "similarity_mean": r.similarity_mean,
            "guard_blocks": int(r.guard_blocks),
            "model_calls": int(r.requests) - int(r.hits),
            "tokens_saved": int(r.hits) * tokens_per_call,
            "savings_usd": savings,
            "embedding_cost_usd": lookups * embedding_cost_usd,
            "net_savings_usd": savings - lookups * embedding_cost_usd,
        })
    return pd.DataFrame(rows)


def cumulative_paths(series: pd.DataFrame, arms: list[str]) -> dict[str, list[ProportionStat]]:
    """Cumulative (requests, hits) per arm at each time bucket: the looks of a sequential test.

    A bucket where an arm had no traffic repeats its previous totals.
    """
    if series.empty:
        return {arm: [] for arm in arms}
    wide = series.pivot_table(index="bucket", columns="arm", values=["requests", "hits"],
                              aggfunc="sum", fill_value=0).sort_index().cumsum()
    paths = {}
    for arm in arms:
        if ("requests", arm) not in wide:
            paths[arm] = []
            continue
        paths[arm] = [ProportionStat(int(n), int(k)) for n, k in zip(wide[("requests", arm)], wide[("hits", arm)])]
    return paths


def format_p_value(p: float | None) -> str:
    """A p-value for display: '<0.0001' rather than a misleading 0.0000, '—' when not computed."""
    if p is None or p != p:
        return "—"
    return "<0.0001" if p < 0.0001 else f"{p:.4f}"


def comparison_frame(summary: pd.DataFrame, baseline: str, series: pd.DataFrame | None = None, *,
                     units: pd.DataFrame | None = None, unit_path: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every non-holdout arm vs ``baseline``: difference in hit rate with its 95% CI and
    p-value (fixed horizon), the chance to beat the baseline and expected loss, and the
    always-valid (mSPRT) p-value over the time buckets.

    Per user (``units``: queries.unit_stats, ``unit_path``: queries.unit_path): z-test,
    normal posterior and mSPRT on the delta-method variances. Without them, per request
    (``summary`` and ``series``: Bernoulli trials, Beta-Binomial posteriors)."""
    per_user = units is not None
    if per_user:
        stats = ratio_stats(units)
        paths = cumulative_unit_paths(unit_path, list(stats)) if unit_path is not None else {}
        diff_test, bayes_test, path_test = diff_of_ratios, bayes_compare_ratios, sequential_path_ratios
    else:
        stats = {r.arm: ProportionStat(int(r.requests), int(r.hits)) for r in summary.itertuples(index=False)}
        paths = cumulative_paths(series, list(stats)) if series is not None else {}
        diff_test, bayes_test, path_test = diff_of_proportions, bayes_compare, sequential_path
    if baseline not in stats:
        return pd.DataFrame()
    rows = []
    for arm, stat in stats.items():
        if arm in (baseline, HOLDOUT_ARM):
            continue
        result = diff_test(stats[baseline], stat)
        bayes = bayes_test(stats[baseline], stat)
        row = {"arm": arm, "vs": baseline, "diff": result.diff,
               "ci_low": result.ci_low, "ci_high": result.ci_high,
               "relative_lift": result.relative_lift, "p_value": result.p_value,
               "p": format_p_value(result.p_value), "status": result.status, "detail": result.detail,
               "prob_beat": bayes.prob_treatment_better, "expected_loss": bayes.expected_loss_treatment,
               "basis": PER_USER if per_user else PER_REQUEST}
        if paths.get(arm) and paths.get(baseline):
            seq = path_test(paths[baseline], paths[arm])
            row.update(seq_p_value=seq.p_value, seq_p=format_p_value(seq.p_value),
                       seq_low=seq.ci_low, seq_high=seq.ci_high,
                       seq_verdict="significant" if seq.reject else "keep watching")
        rows.append(row)
    return pd.DataFrame(rows)


def cluster_comparison(by_cluster: pd.DataFrame, baseline: str, arm: str,
                       min_requests: int = 1) -> pd.DataFrame:
    """Per intent cluster: ``arm`` vs ``baseline`` hit-rate difference, raw and Holm-adjusted p-values.

    Holm controls the family-wise error over all clusters compared, so scanning dozens
    of clusters does not turn noise into "significant" clusters.
    """
    columns = ["intent_cluster", "requests_base", "requests_arm", "diff", "p_value", "p_holm", "significant"]
    rows = []
    for cluster, cells in by_cluster.groupby("intent_cluster"):
        base, other = cells[cells["arm"] == baseline], cells[cells["arm"] == arm]
        if base.empty or other.empty:
            continue
        b = ProportionStat(int(base["requests"].sum()), int(base["hits"].sum()))
        o = ProportionStat(int(other["requests"].sum()), int(other["hits"].sum()))
        if min(b.n, o.n) < min_requests:
            continue
        result = diff_of_proportions(b, o)
        rows.append({"intent_cluster": cluster, "requests_base": b.n, "requests_arm": o.n,
                     "diff": result.diff, "p_value": result.p_value})
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows)
    df["p_holm"] = holm_adjust(df["p_value"].tolist())
    df["significant"] = df["p_holm"].map(lambda p: p is not None and p < 0.05)
    return df[columns]


def srm_for(units: pd.DataFrame, config: ExperimentConfig) -> SrmResult:
    """SRM check of the distinct users per arm (``queries.unit_stats``; the unit ``assign()``
    randomises) against the config's assignment probabilities. Requests per arm are not
    checked: a heavy user moves them without any assignment fault."""
    weights = {arm: p for arm, p in config.arm_probabilities().items() if p > 0}
    observed = {r.arm: int(r.units) for r in units.itertuples(index=False) if r.units}
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


def shorten(text: str, width: int = 60) -> str:
    """One line of at most ``width`` characters, an ellipsis where it was cut (at a word
    boundary when one is in the second half)."""
    text = " ".join(str(text).split())
    if len(text) <= width:
        return text
    cut = text[:width - 1]
    if " " in cut[width // 2:]:
        cut = cut[:cut.rindex(" ")]
    return cut.rstrip() + "…"


def cluster_labels(examples: pd.DataFrame, width: int = 60) -> dict[int, str]:
    """Cluster id -> its most frequent query in the range, quoted and shortened (clusters
    without an emitted query text have none)."""
    if examples is None or examples.empty:
        return {}
    return {int(r.intent_cluster): f"“{shorten(r.examples[0], width)}”"
            for r in examples.itertuples(index=False) if len(r.examples)}


def with_cluster_examples(frame: pd.DataFrame, examples: pd.DataFrame | None,
                          column: str = "examples") -> pd.DataFrame:
    """``frame`` (with an intent_cluster column) plus its clusters' example queries joined
    into one string ("" where there are none)."""
    joined = {} if examples is None or examples.empty else {
        int(r.intent_cluster): " · ".join(shorten(t, 80) for t in r.examples)
        for r in examples.itertuples(index=False)}
    if frame.empty:
        return frame.assign(**{column: pd.Series(dtype="object")})
    return frame.assign(**{column: [joined.get(int(c), "") for c in frame["intent_cluster"]]})


def cluster_choices(by_cluster: pd.DataFrame, arm: str, overridden=(), limit: int = 50,
                    labels: dict[int, str] | None = None) -> dict[int, str]:
    """The intent clusters an operator may override on ``arm``, labelled: its busiest in the
    window first (with their request count), then those already overridden; with ``labels``
    (``cluster_labels``) each also shows what it is about. Cluster ids drawn across replicas
    are long numbers, so the panel offers these rather than a blank input."""
    labels = labels or {}
    rows = by_cluster[by_cluster["arm"] == arm] if not by_cluster.empty else by_cluster
    volume = rows.groupby("intent_cluster")["requests"].sum().nlargest(limit) if not rows.empty else {}

    def named(cluster: int) -> str:
        return f"{cluster} {labels[cluster]}" if cluster in labels else str(cluster)

    choices = {int(c): f"{named(int(c))} ({int(n):,} requests)" for c, n in dict(volume).items()}
    for cluster in overridden:
        choices.setdefault(int(cluster), f"{named(int(cluster))} (overridden, no requests in the window)")
    return choices


def lifetime_shares(by_life: pd.DataFrame) -> pd.DataFrame:
    """Per arm x lifetime bucket: that bucket's share of the arm's requests (hits by entry age; misses 'none')."""
    if by_life.empty:
        return by_life.assign(share=pd.Series(dtype="float64"))
    totals = by_life.groupby("arm")["requests"].transform("sum").astype("float64")
    counts = by_life["hits"].where(by_life["lifetime_bucket"] != "none", by_life["requests"] - by_life["hits"])
    return by_life.assign(share=(counts / totals).where(totals > 0))
