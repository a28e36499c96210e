"""User vs shadow verdicts side by side (frames the overview page shows; no Streamlit here).

A user's verdict is ground truth for the hit it judges, but users label few hits, and not at random.
A shadow verdict (``cache_core.shadow``) is the upstream model asked again, its answer compared with
the cached one by an equivalence check: plentiful and sampled at random, but only as good as that
check (a reworded correct answer can read "wrong" under exact match). The two are never pooled.
"""
from __future__ import annotations

import pandas as pd


def _rate(wrong: pd.Series, labelled: pd.Series) -> pd.Series:
    return (wrong.astype("float64") / labelled.astype("float64")).where(labelled > 0)


def user_vs_shadow(false_hits: pd.DataFrame | None, shadow: pd.DataFrame | None) -> pd.DataFrame:
    """Per arm: users' labelled hits and false-hit rate (``queries.false_hits``), shadow checks' on
    hits, and on near-misses (the share of misses below the threshold whose nearest answer would have
    been wrong). Empty when neither has a verdict."""
    columns = ["arm", "user_labelled", "user_false_hit_rate", "shadow_labelled", "shadow_false_hit_rate",
               "near_miss_labelled", "near_miss_wrong_rate"]
    frames = []
    if false_hits is not None and not false_hits.empty:
        users = false_hits.groupby("arm", as_index=False)[["correct", "wrong"]].sum()
        frames.append(pd.DataFrame({"arm": users["arm"], "user_labelled": users["correct"] + users["wrong"],
                                    "user_wrong": users["wrong"]}))
    if shadow is not None and not shadow.empty:
        for decision, prefix in (("hit", "shadow"), ("miss", "near_miss")):
            part = shadow[shadow["decision"] == decision].groupby("arm", as_index=False)[["correct", "wrong"]].sum()
            frames.append(pd.DataFrame({"arm": part["arm"], f"{prefix}_labelled": part["correct"] + part["wrong"],
                                        f"{prefix}_wrong": part["wrong"]}))
    if not frames:
        return pd.DataFrame(columns=columns)
    table = frames[0]
    for frame in frames[1:]:
        table = table.merge(frame, on="arm", how="outer")
    for prefix in ("user", "shadow", "near_miss"):
        for column in (f"{prefix}_labelled", f"{prefix}_wrong"):
            table[column] = table[column].fillna(0).astype("int64") if column in table else 0
    table["user_false_hit_rate"] = _rate(table["user_wrong"], table["user_labelled"])
    table["shadow_false_hit_rate"] = _rate(table["shadow_wrong"], table["shadow_labelled"])
    table["near_miss_wrong_rate"] = _rate(table["near_miss_wrong"], table["near_miss_labelled"])
    return table[columns].sort_values("arm").reset_index(drop=True)


def near_miss_curve(shadow: pd.DataFrame | None) -> pd.DataFrame:
    """Per arm x similarity (bin start, 0.01 wide) below the threshold: near-miss verdicts and the
    share wrong, i.e. the false-hit rate a threshold at that similarity would add."""
    if shadow is None or shadow.empty:
        return pd.DataFrame(columns=["arm", "similarity", "labelled", "wrong_rate"])
    misses = shadow[shadow["decision"] == "miss"].copy()
    misses["similarity"] = misses["similarity_milli"] / 1000.0
    misses["labelled"] = misses["correct"] + misses["wrong"]
    misses["wrong_rate"] = _rate(misses["wrong"], misses["labelled"])
    return misses[["arm", "similarity", "labelled", "wrong_rate"]].reset_index(drop=True)


def judge_frame(by_version: pd.DataFrame | None) -> pd.DataFrame:
    """``queries.judge_versions`` with hit_rate, user_false_hit_rate and shadow_false_hit_rate (each
    on its own verdicts; NaN without any) and ``judge`` (the version, or "none"). Empty when no arm
    has a judge: a page says so instead of drawing a comparison of nothing."""
    if by_version is None or by_version.empty or not (by_version["judge_version"] != "").any():
        return pd.DataFrame()
    df = by_version.copy()
    df["judge"] = df["judge_version"].where(df["judge_version"] != "", "none")
    df["hit_rate"] = _rate(df["hits"], df["requests"])
    df["user_labelled"] = df["user_correct"] + df["user_wrong"]
    df["shadow_labelled"] = df["shadow_correct"] + df["shadow_wrong"]
    df["user_false_hit_rate"] = _rate(df["user_wrong"], df["user_labelled"])
    df["shadow_false_hit_rate"] = _rate(df["shadow_wrong"], df["shadow_labelled"])
    return df


THRESHOLD_LEVELS = ("entry", "cluster", "arm", "static")
"""cache_core.decision.error_bound.ThresholdSource, most specific first ("static": the arm's configured
start threshold, used until the arm holds enough verdicts to certify its bound)."""


def threshold_source_frame(by_source: pd.DataFrame | None) -> pd.DataFrame:
    """``queries.threshold_sources`` with, per arm x level, ``share`` (of the arm's error-bounded
    lookups decided at that level), ``hit_rate`` and ``user_false_hit_rate`` / ``shadow_false_hit_rate``
    (each on its own verdicts; NaN without any), levels in ``THRESHOLD_LEVELS`` order (an unknown one
    last). Empty when no arm logged a threshold source (no error-bounded arm in range)."""
    if by_source is None or by_source.empty:
        return pd.DataFrame()
    df = by_source.copy()
    df["share"] = df["requests"] / df.groupby("arm")["requests"].transform("sum")
    df["hit_rate"] = _rate(df["hits"], df["requests"])
    df["user_labelled"] = df["user_correct"] + df["user_wrong"]
    df["shadow_labelled"] = df["shadow_correct"] + df["shadow_wrong"]
    df["user_false_hit_rate"] = _rate(df["user_wrong"], df["user_labelled"])
    df["shadow_false_hit_rate"] = _rate(df["shadow_wrong"], df["shadow_labelled"])
    order = {level: i for i, level in enumerate(THRESHOLD_LEVELS)}
    df["_order"] = df["threshold_source"].map(order).fillna(len(order))
    return df.sort_values(["arm", "_order", "threshold_source"]).drop(columns="_order").reset_index(drop=True)
