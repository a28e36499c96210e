"""What-if replays of logged decisions, free of any UI or I/O.

The similarity histograms of ``queries`` (decisions, hits, guard blocks per arm x intent
cluster x similarity bin, and for multi arms what the current score floor / answer margin
refuse) are replayed at other thresholds, answer margins or (floor, margin) pairs:
estimated hits, and the false-hit rate of the feedback-labelled hits each would still
serve, with its time-uniform upper bound split over the candidates. First-order estimates: they hold
the cache's contents fixed, while a different threshold would also change what got
stored and evicted. ``tuning`` and ``tuning_multi`` pick among these candidates; the
control panel's what-if preview shows them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from dashboard.control.changes import validate_threshold
from dashboard.control.stats import DEFAULT_ALPHA, ProportionStat
from dashboard.control.target_test import upper_confidence_bound, upper_confidence_bounds


def _min_bin(threshold: float, bin_width: float) -> int:
    """First similarity bin whose every value is >= threshold (bins are [k*w, (k+1)*w))."""
    return math.ceil(threshold / bin_width - 1e-9)


def whatif_hit_rate(similarity_hist: pd.DataFrame, threshold: float,
                    bin_width: float = 0.001) -> pd.DataFrame:
    """Estimated hit rate per arm had ``threshold`` applied to the logged decisions.

    ``similarity_hist`` is ``queries.similarity_histogram``: per arm and
    ``similarity_milli`` bin, decisions / hits / guard_blocks. A decision counts as
    an estimated hit when its top-1 similarity reaches the threshold and no guard
    blocked it (nor, for a multi arm, its current score floor / answer margin:
    ``multi_blocks``; see ``tuning`` for where that replay holds). First-order
    estimate: it holds the cache's contents fixed, while a different threshold would
    also change what got stored and evicted.
    """
    threshold = validate_threshold(threshold)
    columns = ["arm", "decisions", "observed_hits", "observed_hit_rate", "est_hits", "est_hit_rate"]
    if similarity_hist.empty:
        return pd.DataFrame(columns=columns)
    df = similarity_hist
    passes = df["similarity_milli"].notna() & (df["similarity_milli"].fillna(-10**9) >= _min_bin(threshold, bin_width))
    est = servable(df).where(passes, 0)
    out = pd.DataFrame({"arm": df["arm"], "decisions": df["decisions"], "observed_hits": df["hits"],
                        "est_hits": est}).groupby("arm", as_index=False).sum()
    out["observed_hit_rate"] = out["observed_hits"] / out["decisions"]
    out["est_hit_rate"] = out["est_hits"] / out["decisions"]
    return out[columns]


def whatif_curve(similarity_hist: pd.DataFrame,
                 thresholds: Sequence[float] | None = None) -> pd.DataFrame:
    """``whatif_hit_rate`` over a grid of thresholds: columns arm, threshold, est_hit_rate."""
    grid = thresholds if thresholds is not None else np.round(np.arange(0.50, 1.0001, 0.01), 2)
    frames = [whatif_hit_rate(similarity_hist, float(t)).assign(threshold=float(t)) for t in grid]
    if not frames or all(f.empty for f in frames):
        return pd.DataFrame(columns=["arm", "threshold", "est_hit_rate"])
    return pd.concat(frames, ignore_index=True)[["arm", "threshold", "est_hit_rate"]]


BIN_WIDTH = 0.001
"""Similarity bin of queries.similarity_histogram / labelled_similarity (similarity_milli)."""


def _bins(df: pd.DataFrame, value_cols: list[str], key: str = "similarity_milli") -> pd.DataFrame:
    """Sum ``value_cols`` per ``key`` bin (NA bins dropped), sorted by bin."""
    if df.empty:
        return pd.DataFrame({key: pd.Series([], dtype="int64"),
                             **{c: pd.Series([], dtype="int64") for c in value_cols}})
    known = df[df[key].notna()]
    out = known.groupby(key, as_index=False)[value_cols].sum()
    out[key] = out[key].astype("int64")
    return out.sort_values(key)


def _at_or_above(bins: pd.DataFrame, col: str, thresholds: np.ndarray, key: str = "similarity_milli") -> np.ndarray:
    """For each threshold: sum of ``col`` over bins whose every value is >= the threshold."""
    edges = bins[key].to_numpy()
    suffix = np.concatenate([np.cumsum(bins[col].to_numpy()[::-1])[::-1], [0]])
    first_bin = np.ceil(thresholds / BIN_WIDTH - 1e-9).astype("int64")
    return suffix[np.searchsorted(edges, first_bin, side="left")]


def replay_floor(similarity_hist: pd.DataFrame) -> float | None:
    """The lowest cosine threshold the multi-rule rows of ``similarity_hist`` (one arm,
    or one cluster of it) were logged at; None when there are none (cosine arm)."""
    if similarity_hist.empty or "multi_min_threshold" not in similarity_hist:
        return None
    low = pd.to_numeric(similarity_hist["multi_min_threshold"], errors="coerce").min()
    return None if pd.isna(low) else float(low)


def drop_unreplayable(curve: pd.DataFrame, similarity_hist: pd.DataFrame) -> pd.DataFrame:
    """``curve`` rows (arm, threshold, ...) except multi arms' thresholds under their
    ``replay_floor`` in ``similarity_hist`` (what the logs cannot tell)."""
    if curve.empty or similarity_hist.empty:
        return curve
    floors = {arm: replay_floor(rows) for arm, rows in similarity_hist.groupby("arm")}
    low = curve["arm"].map(lambda arm: floors.get(arm)).astype("float64")
    return curve[~(curve["threshold"] < low - 1e-9)]


def servable(hist: pd.DataFrame) -> pd.Series:
    """Per row of queries.similarity_histogram: decisions a threshold at or under the bin
    could serve (not guard-blocked, and for multi arms not refused by the current floor /
    margin). The threshold what-if of the control panel counts the same."""
    blocked = hist["guard_blocks"] if "guard_blocks" in hist else 0
    if "multi_blocks" in hist:
        blocked = blocked + hist["multi_blocks"]
    return hist["decisions"] - blocked


def threshold_table(similarity_hist: pd.DataFrame, labelled: pd.DataFrame, thresholds,
                    alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """Per candidate threshold: estimated hit rate and the false-hit rate with its upper bound.

    ``similarity_hist`` rows (decisions, hits, guard_blocks and, for multi arms,
    multi_blocks / multi_min_threshold per bin) and ``labelled`` rows (correct, wrong per
    bin) should already be narrowed to one arm (and cluster). ``supported``: labels reach
    down to the threshold and (multi arms, ``replayable``) it is not under the lowest
    logged cosine threshold.

    The labels of a candidate t are those of decisions logged at a threshold at or below t
    (``threshold_milli``, when the rows have it): a window that ran a higher threshold served
    only the safer hits above it, and pooling its labels would flatter t. The upper bound is
    the time-uniform one of ``target_test.upper_confidence_bound`` with alpha split evenly
    over the candidates: it holds for every candidate of the table at once and over every
    re-run on a rolling window, so repeated auto-tune passes do not spend alpha again.
    """
    thresholds = np.asarray(list(thresholds), dtype="float64")
    hist = similarity_hist
    decisions = int(hist["decisions"].sum()) if not hist.empty else 0
    sims = _bins(hist.assign(servable=servable(hist)) if not hist.empty else hist, ["servable"])
    est_hits = _at_or_above(sims, "servable", thresholds)
    floor = replay_floor(hist)
    split = alpha / max(len(thresholds), 1)
    rows = []
    for t, hits in zip(thresholds, est_hits):
        mine = labelled
        if "threshold_milli" in labelled.columns and not labelled.empty:
            mine = labelled[labelled["threshold_milli"] <= round(t / BIN_WIDTH) + 1e-9]
        labels = _bins(mine, ["correct", "wrong"])
        w = int(_at_or_above(labels, "wrong", np.array([t]))[0])
        n = w + int(_at_or_above(labels, "correct", np.array([t]))[0])
        lowest_label = labels["similarity_milli"].min() * BIN_WIDTH if not labels.empty else math.inf
        stat = ProportionStat(n, w)
        replayable = floor is None or t >= floor - 1e-9
        rows.append({"threshold": round(float(t), 6), "decisions": decisions, "est_hits": int(hits),
                     "est_hit_rate": hits / decisions if decisions else None,
                     "labelled": n, "wrong": w, "false_hit_rate": stat.rate,
                     "false_hit_upper": upper_confidence_bound(stat, split), "replayable": replayable,
                     "supported": bool(t >= lowest_label - 1e-9) and replayable})
    return pd.DataFrame(rows)


def split_upper_bounds(wrong, labelled, alpha: float = DEFAULT_ALPHA) -> list[float | None]:
    """Per candidate: the time-uniform (1 - alpha) upper bound of its false-hit rate
    (``target_test.upper_confidence_bounds``) with alpha split evenly over the candidates,
    as ``threshold_table`` does (None without labels). A one-pass Clopper-Pearson bound,
    re-checked by every auto-tune run and maximised over the candidates, would not hold."""
    wrong, labelled = np.asarray(wrong, dtype="float64"), np.asarray(labelled, dtype="float64")
    bounds = upper_confidence_bounds(wrong, labelled, alpha / max(len(wrong), 1))
    return [None if np.isnan(b) else float(b) for b in bounds]


def margin_grid(current: float) -> list[float]:
    """A few answer margins around ``current`` for the multi what-if, current included."""
    grid = [0.0, current / 2, current, current * 2, current + 0.01, current + 0.02, current + 0.05]
    return sorted({round(min(max(m, 0.0), 1.0), 4) for m in grid})


def margin_table(margin_hist: pd.DataFrame, decisions: int, margins, alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """Per candidate answer margin of one multi arm: estimated hits and the false-hit rate.

    ``margin_hist`` is queries.multi_margin_histogram narrowed to the arm (decisions whose
    score reaches the floor, no guard blocking, per margin bin; NA = no rival answer, served
    at any margin); ``decisions`` is all of the arm's logged decisions (the denominator).
    The cosine gate stays as logged, where the replay is exact (guards aside). Only served
    hits carry labels: a margin that would serve decisions (with a rival) in bins under the
    lowest labelled one is ``supported=False``, its false-hit rate ignores them. The upper
    bound is the time-uniform one auto-tune decides with (``split_upper_bounds``).
    """
    margins = np.asarray(list(margins), dtype="float64")
    hist = margin_hist
    no_rival = hist[hist["margin_milli"].isna()] if not hist.empty else hist
    base = {c: int(no_rival[c].sum()) if not no_rival.empty else 0 for c in ("decisions", "correct", "wrong")}
    bins = _bins(hist, ["decisions", "correct", "wrong"], key="margin_milli")
    with_rival = _at_or_above(bins, "decisions", margins, key="margin_milli")
    est = base["decisions"] + with_rival
    wrong = base["wrong"] + _at_or_above(bins, "wrong", margins, key="margin_milli")
    n = wrong + base["correct"] + _at_or_above(bins, "correct", margins, key="margin_milli")
    labelled_bins = bins[(bins["correct"] + bins["wrong"]) > 0]
    # Served decisions with a rival in bins under the lowest labelled one: unlabelled.
    if labelled_bins.empty:
        unlabelled = with_rival
    else:
        lowest = np.array([labelled_bins["margin_milli"].min() * BIN_WIDTH])
        unlabelled = with_rival - _at_or_above(bins, "decisions", lowest, key="margin_milli")[0]
    rows = []
    uppers = split_upper_bounds(wrong, n, alpha)
    for m, hits, k, w, u, upper in zip(margins, est, n, wrong, unlabelled, uppers):
        stat = ProportionStat(int(k), int(w))
        rows.append({"answer_margin": round(float(m), 6), "decisions": int(decisions), "est_hits": int(hits),
                     "est_hit_rate": hits / decisions if decisions else None, "labelled": int(k), "wrong": int(w),
                     "false_hit_rate": stat.rate, "false_hit_upper": upper,
                     "supported": bool(u <= 0)})
    return pd.DataFrame(rows)


def multi_table(score_hist: pd.DataFrame, floors, margins, *, lowest_floor: float | None,
                lowest_margin: float | None, alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """Per candidate (score_floor, answer_margin) of one multi arm: estimated hits and the
    false-hit rate with its upper bound, from ``score_hist`` (queries.multi_score_histogram:
    per config version x score bin x margin bin, decisions / servable / correct / wrong).

    A decision is served at (f, m) iff it is ``servable`` (logged in multi mode, something
    past the cosine gate, no guard veto), its score bin reaches f and its margin bin is NA
    (no rival answer) or reaches m; the cosine gate stays as logged. The denominator is all
    of the arm's logged decisions. ``replayable``: f and m are not under the lowest floor /
    margin in force when the events were logged. Up there every decision the pair serves
    was served then (so its label, if any, is in the data) and the replay is exact.
    ``false_hit_upper`` is time-uniform and split over every pair (``split_upper_bounds``):
    ``tuning_multi`` picks among them on every auto-tune run.
    """
    floors = np.asarray(list(floors), dtype="float64")
    margins = np.asarray(list(margins), dtype="float64")
    pairs = np.array([(f, m) for f in floors for m in margins], dtype="float64").reshape(-1, 2)
    hist = score_hist
    decisions = int(hist["decisions"].sum()) if not hist.empty else 0
    if hist.empty:
        served = wrong = labelled = np.zeros(len(pairs), dtype="int64")
    else:
        # NA score: never served; NA margin: no rival, passes any margin.
        score = pd.to_numeric(hist["score_milli"], errors="coerce").astype("float64").fillna(-np.inf).to_numpy()
        margin = pd.to_numeric(hist["margin_milli"], errors="coerce").astype("float64").fillna(np.inf).to_numpy()
        first_score = np.ceil(pairs[:, 0] / BIN_WIDTH - 1e-9)
        first_margin = np.ceil(pairs[:, 1] / BIN_WIDTH - 1e-9)
        values = hist[["servable", "correct", "wrong"]].to_numpy("int64")
        # One pass per pair (a few hundred at most) keeps memory at one mask of the rows.
        sums = np.array([values[(score >= fs) & (margin >= fm)].sum(axis=0)
                         for fs, fm in zip(first_score, first_margin)], dtype="int64").reshape(-1, 3)
        served, wrong = sums[:, 0], sums[:, 2]
        labelled = sums[:, 1] + wrong
    rows = []
    uppers = split_upper_bounds(wrong, labelled, alpha)
    for (f, m), hits, n, w, upper in zip(pairs, served, labelled, wrong, uppers):
        stat = ProportionStat(int(n), int(w))
        replayable = (lowest_floor is not None and lowest_margin is not None
                      and f >= lowest_floor - 1e-9 and m >= lowest_margin - 1e-9)
        rows.append({"score_floor": round(float(f), 6), "answer_margin": round(float(m), 6),
                     "decisions": decisions, "est_hits": int(hits),
                     "est_hit_rate": hits / decisions if decisions else None, "labelled": int(n), "wrong": int(w),
                     "false_hit_rate": stat.rate, "false_hit_upper": upper,
                     "replayable": bool(replayable)})
    columns = ["score_floor", "answer_margin", "decisions", "est_hits", "est_hit_rate", "labelled", "wrong",
               "false_hit_rate", "false_hit_upper", "replayable"]
    return pd.DataFrame(rows, columns=columns)
