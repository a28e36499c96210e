"""Where a judge cuts: the operating point (a probability) for each false-hit target.

* ``operating_points``: on scored rows with labels, the lowest cut whose wrong share of hits is
  under the target with ``CUT_CONFIDENCE`` (a one-sided Jeffreys bound).
* ``strictest_over_sources``: trained on several public sets, the strictest of the sets' own
  cuts on their held-out rows (a cut pooled over the mix served 10-24% wrong on a set left out).
* ``unseen_kind_cuts``: the shift to a kind of pair no set shows. Each set k in turn plays the
  unseen kind: a judge fitted without k cuts where the target holds on k, and that cut is read as
  the share of the *known* kinds' held-out duplicates it still serves (``known_share``). The
  shipped cut serves the smallest such share of the final judge's held-out duplicates: "holding
  the target on a kind it never saw cost this much of what it knew". The share lives in rank
  space, so it transfers from the judges fitted without k to the final one whatever their
  calibrations (each judge's probabilities are calibrated on its own mix; a probability cut
  carried over did not transfer, bench/judge_unseen_kind.py).
"""
from __future__ import annotations

import numpy as np

TARGETS = (0.02, 0.05, 0.10)
CUT_CONFIDENCE = 0.75
"""Operating points hold their target with this confidence on the held-out rows. Simulated
(tests/unit/cache_core/decision/test_judge.py), 1,000 held-out rows at a 5% target: the point
estimate's cut served over 5% wrong on fresh pairs in 26 of 40 draws (the lowest passing cut
is picked where the noise dipped), 0.75 in about 15, 0.8 in 12 at a fifth fewer duplicates."""
MIN_SOURCE_POSITIVES = 30
"""A public set's own operating point counts only with this many held-out duplicates."""
NOTHING = 1.0
"""The cut that serves nothing (no calibrated probability exceeds it)."""


def curve(prob: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Served share of true duplicates and wrong share of hits, serving every pair at or above each cut."""
    order = np.argsort(-prob, kind="stable")
    ys, ps = y[order], prob[order]
    tp, fp = np.cumsum(ys), np.cumsum(1 - ys)
    last = np.r_[ps[1:] != ps[:-1], True]  # ties are served together
    return {"cut": ps[last], "recall": tp[last] / max(y.sum(), 1), "false_hit": fp[last] / (tp[last] + fp[last]),
            "right": tp[last], "wrong": fp[last]}


def operating_points(prob: np.ndarray, y: np.ndarray, confidence: float = CUT_CONFIDENCE) -> dict[str, dict]:
    """Per target: the lowest cut whose wrong share of hits is below the target with
    ``confidence`` (a one-sided Jeffreys bound over the held-out hits at that cut).

    The point estimate alone picked cuts that served 7-13% wrong on fresh pairs of the same
    kind for a 5% target (bench/judge_quality.py: a few hundred held-out rows put a 2-point
    standard error on the tail, and the lowest passing cut is where that noise dipped); the
    bound gives up some duplicates to keep the promise the operator asked for."""
    from scipy.stats import beta

    c = curve(prob, y)
    upper = beta.ppf(confidence, c["wrong"] + 0.5, c["right"] + 0.5)
    points = {}
    for target in TARGETS:
        ok = np.where(upper <= target)[0]
        if len(ok):
            i = ok.max()
            points[f"{target:.2f}"] = {"accept_at": float(c["cut"][i]), "recall": float(c["recall"][i]),
                                       "false_hit": float(c["false_hit"][i]), "false_hit_upper": float(upper[i])}
        else:
            points[f"{target:.2f}"] = {"accept_at": NOTHING, "recall": 0.0, "false_hit": None, "false_hit_upper": None}
    return points


def by_source(prob: np.ndarray, y: np.ndarray, sources: np.ndarray) -> dict[str, dict]:
    """Each source's own operating points (sources with ``MIN_SOURCE_POSITIVES`` duplicates)."""
    return {str(src): operating_points(prob[sources == src], y[sources == src])
            for src in np.unique(sources) if (y[sources == src] == 1).sum() >= MIN_SOURCE_POSITIVES}


def strictest_over_sources(cuts: dict[str, float], per_source: dict[str, dict]) -> dict[str, float]:
    """Each target's cut raised to the strictest of the sources' own.

    A set on which no cut reaches the target (its labels too noisy at the top) says nothing
    about where to cut; counting it would make the judge serve nothing at all."""
    return {k: max([cuts[k]] + [pts[k]["accept_at"] for pts in per_source.values() if pts[k]["false_hit"] is not None])
            for k in cuts}


def best_cut_served(score: np.ndarray, y: np.ndarray, target: float, served: np.ndarray | None = None) -> float:
    """The share of all duplicates served at the best cut of ``score`` for ``target`` on these very
    rows (an oracle cut: what a cut picked with their labels would serve); with ``served``, only
    those rows can be served (a floor or a guard's veto), the rest still count as missed."""
    if served is None:
        served = np.ones(len(y), dtype=bool)
    if not served.any():
        return 0.0
    c = curve(score[served], y[served])
    ok = np.flatnonzero(c["false_hit"] <= target)
    share = y[served].sum() / max(y.sum(), 1)
    return float(c["recall"][ok.max()] * share) if len(ok) else 0.0


def served_share(prob: np.ndarray, y: np.ndarray, cut: float) -> float:
    """The share of the duplicates (y == 1) scored at or above ``cut``."""
    return float((prob[y == 1] >= cut).mean()) if (y == 1).any() else 0.0


def at_cuts(prob: np.ndarray, y: np.ndarray, cuts: dict[str, float]) -> dict[str, dict]:
    """Per target, what its shipped cut serves on scored rows: the share of duplicates, the
    wrong share of hits (None with no hit), and the hits and wrong hits counted."""
    out = {}
    for key, cut in cuts.items():
        hit = prob >= cut
        wrong = int((hit & (y == 0)).sum())
        out[key] = {"accept_at": float(cut), "recall": served_share(prob, y, cut),
                    "false_hit": float(wrong / hit.sum()) if hit.any() else None, "hits": int(hit.sum()),
                    "wrong": wrong}
    return out


def cut_serving(prob: np.ndarray, y: np.ndarray, share: float) -> float:
    """The highest cut that still serves ``share`` of the duplicates (ties served together)."""
    positives = np.sort(prob[y == 1])[::-1]
    n = int(np.floor(share * len(positives) + 1e-9))
    return NOTHING if n == 0 else float(positives[n - 1])


def left_out_kind_point(prob_kind: np.ndarray, y_kind: np.ndarray, prob_known: np.ndarray,
                        y_known: np.ndarray) -> dict[str, dict]:
    """A judge fitted without one kind: per target, its cut that holds on that kind's rows
    (``operating_points``) and the share of the known kinds' held-out duplicates it serves."""
    points = operating_points(prob_kind, y_kind)
    for point in points.values():
        point["known_share"] = (None if point["false_hit"] is None
                                else served_share(prob_known, y_known, point["accept_at"]))
    return points


def unseen_kind_cuts(cuts: dict[str, float], prob_known: np.ndarray, y_known: np.ndarray,
                     left_out: dict[str, dict]) -> dict[str, float]:
    """``cuts`` raised, per target, to the cut at which the final judge serves the smallest
    ``known_share`` of its held-out duplicates (``prob_known``, ``y_known``) that holding the
    target cost on any left-out kind. A kind where no cut held the target is left out of that
    target's choice, as ``strictest_over_sources`` leaves out a set."""
    out = {}
    for key, cut in cuts.items():
        shares = [points[key]["known_share"] for points in left_out.values()
                  if points[key]["known_share"] is not None]
        if not shares or served_share(prob_known, y_known, cut) <= min(shares):
            out[key] = cut  # already serves no more than that
        else:
            out[key] = max(cut, cut_serving(prob_known, y_known, min(shares)))
    # A tighter target never cuts below a looser one's: at 2% no left-out kind may have held at
    # any cut (nothing to carry over), while the 5% cut did move.
    for key in sorted(out, key=float):
        out[key] = max([out[key]] + [out[k] for k in out if float(k) > float(key)])
    return out
