"""A trained judge's report: its AUC and calibration on the rows its cut rests on, and a PNG of
its operating points beside cosine's (``judge_train`` writes it beside the artifact), and the lines
``judge-train`` prints about it."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cache_core.decision.judge_model import JudgeArtifact


def auc(score: np.ndarray, y: np.ndarray) -> float:
    ranks = np.argsort(np.argsort(score, kind="stable"), kind="stable") + 1
    pos = y == 1
    n1, n0 = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / max(n1 * n0, 1))


def reliability(prob: np.ndarray, y: np.ndarray, bins: int = 10) -> list[dict]:
    edges = np.linspace(0, 1, bins + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (prob >= lo) & ((prob < hi) | (hi == 1.0))
        if inside.any():
            out.append({"bin": [round(lo, 2), round(hi, 2)], "n": int(inside.sum()),
                        "predicted": float(prob[inside].mean()), "observed": float(y[inside].mean())})
    return out


def plot_report(artifact: JudgeArtifact, prob: np.ndarray | None, path: Path) -> bool:
    """Operating points and calibration as a PNG; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    report = artifact.report
    rows = "out-of-fold" if report.get("operating_points_rule", "").startswith("out of fold") else "held-out"
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, key in (("judge", "operating_points"), ("cosine", "cosine_operating_points")):
        pts = report[key]
        left.plot([float(k) * 100 for k in pts], [pts[k]["recall"] * 100 for k in pts], marker="o", label=name)
    left.set(xlabel="wrong share of hits, target (%)", ylabel="true duplicates served (%)",
             title=f"judge {artifact.version}: {rows} operating points")
    left.legend()
    cal = report["calibration"]
    right.plot([0, 1], [0, 1], color="grey", lw=0.8)
    right.plot([b["predicted"] for b in cal], [b["observed"] for b in cal], marker="o")
    right.set(xlabel="predicted probability", ylabel="observed share correct", title=f"calibration ({rows})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def summary_lines(artifact: JudgeArtifact) -> list[str]:
    """Per target, the shipped cut and what it serves on the held-out rows, beside the cut those rows
    alone would give and cosine's best there (they differ when the cut allows for other kinds)."""
    pts, cos = artifact.report["operating_points"], artifact.report["cosine_operating_points"]
    shipped = artifact.report.get("shipped_operating_points", {})
    lines = []
    for key in pts:
        line = f"  at <= {float(key):.0%} wrong: accept_at {artifact.operating_points[key]:.3f}"
        if key in shipped:
            wrong = shipped[key]["false_hit"]
            line += (f", serving {shipped[key]['recall']:.1%} of the held-out duplicates"
                     f" ({'no hit' if wrong is None else f'{wrong:.1%} of hits wrong'})")
        if key not in shipped or abs(pts[key]["accept_at"] - artifact.operating_points[key]) > 1e-9:
            line += f"; at the held-out rows' own cut {pts[key]['accept_at']:.3f}: {pts[key]['recall']:.1%}"
        lines.append(f"{line}; cosine's best there {cos[key]['recall']:.1%}")
    if "kind_left_out_points" in artifact.report:
        lines.append("  trained on public sets only: the cuts allow for a kind of pair none of them shows, so they "
                     "serve little; train with your own labels (--pairs FILE or --warehouse) to serve more")
    return lines
