"""Why two arms' hit rates differ: traffic mix vs hit rates within buckets.

The overall hit rate of an arm is r = sum_k w_k r_k (w_k: its share of requests in
bucket k, r_k: its hit rate there). The difference between arms B and A splits
exactly into

    mix  = sum_k (wB_k - wA_k) * (rA_k + rB_k) / 2     (different traffic mix)
    rate = sum_k (rB_k - rA_k) * (wA_k + wB_k) / 2     (different hit rates per bucket)

Kitagawa's symmetric decomposition, which is also the Shapley value of the two
factors (each factor's effect averaged over both orders of switching A to B).
A bucket one arm never saw has no rate there; it borrows the other arm's rate,
so its whole contribution counts as mix.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

METHOD = ("Kitagawa symmetric decomposition (= Shapley values of mix and rate): "
          "mix = Σ (w_B − w_A)·(r_A + r_B)/2, rate = Σ (r_B − r_A)·(w_A + w_B)/2; "
          "the two add up exactly to r_B − r_A.")


@dataclass(frozen=True)
class Decomposition:
    baseline: str
    other: str
    dimension: str
    baseline_rate: float
    other_rate: float
    mix_effect: float
    rate_effect: float
    buckets: pd.DataFrame
    """Per bucket: w_a, w_b, r_a, r_b, mix, rate (contributions)."""

    @property
    def difference(self) -> float:
        return self.other_rate - self.baseline_rate


def decompose(breakdown: pd.DataFrame, dimension: str, baseline: str, other: str) -> Decomposition:
    """Split ``other``'s hit rate minus ``baseline``'s over the buckets of ``dimension``.

    ``breakdown`` has columns arm, ``dimension``, requests, hits (queries.breakdown).
    """
    cells = {}
    for arm in (baseline, other):
        rows = breakdown[breakdown["arm"] == arm].groupby(dimension)[["requests", "hits"]].sum()
        total = rows["requests"].sum()
        if total == 0:
            raise ValueError(f"arm {arm!r} has no requests to decompose")
        cells[arm] = pd.DataFrame({"w": rows["requests"] / total,
                                   "r": (rows["hits"] / rows["requests"]).where(rows["requests"] > 0)})
    a, b = cells[baseline], cells[other]
    df = a.join(b, how="outer", lsuffix="_a", rsuffix="_b")
    df[["w_a", "w_b"]] = df[["w_a", "w_b"]].fillna(0.0)
    df["r_a"] = df["r_a"].fillna(df["r_b"]).fillna(0.0)
    df["r_b"] = df["r_b"].fillna(df["r_a"])
    df["mix"] = (df["w_b"] - df["w_a"]) * (df["r_a"] + df["r_b"]) / 2
    df["rate"] = (df["r_b"] - df["r_a"]) * (df["w_a"] + df["w_b"]) / 2
    df = df.reset_index().rename(columns={"index": dimension})
    return Decomposition(baseline, other, dimension,
                         float((df["w_a"] * df["r_a"]).sum()), float((df["w_b"] * df["r_b"]).sum()),
                         float(df["mix"].sum()), float(df["rate"].sum()), df)


def waterfall_frame(decomposition: Decomposition, top: int = 6) -> pd.DataFrame:
    """Steps for a waterfall: baseline rate, mix effect, the ``top`` largest per-bucket
    rate effects (the rest as 'other buckets'), ending at the other arm's rate."""
    d = decomposition
    buckets = d.buckets.assign(size=d.buckets["rate"].abs()).sort_values("size", ascending=False)
    shown, rest = buckets.head(top), buckets.iloc[top:]
    steps = [(f"{d.baseline} hit rate", d.baseline_rate, "total"),
             ("traffic mix", d.mix_effect, "mix")]
    steps += [(f"rate: {d.dimension} {bucket}", float(v), "rate")
              for bucket, v in zip(shown[d.dimension], shown["rate"])]
    if not rest.empty:
        steps.append(("rate: other buckets", float(rest["rate"].sum()), "rate"))
    rows, level = [], 0.0
    for i, (label, value, kind) in enumerate(steps):
        start = 0.0 if kind == "total" else level
        level = value if kind == "total" else level + value
        rows.append({"order": i, "step": label, "kind": kind, "value": value, "start": start, "end": level})
    rows.append({"order": len(rows), "step": f"{d.other} hit rate", "kind": "total",
                 "value": d.other_rate, "start": 0.0, "end": d.other_rate})
    return pd.DataFrame(rows)
