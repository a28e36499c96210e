"""The experiment statistics under the way experiments really run: clustered users, repeated looks.

    python -m bench.stats_simulation [--sims 300] [--out bench/results/stats_simulation.json]

Against the project's own functions (dashboard.control.stats / ratio / target_test), seeded:

1. SRM false alarms and A/A type-I. Users (the unit ``assign()`` randomises) each fall into
   one of two identical arms by a fair coin; each sends a heavy-tailed number of requests
   (lognormal, mean ~10, a few send hundreds) with a per-user hit propensity drawn from a
   Beta whose intra-user correlation is the ICC (0.05, 0.2), at base rates 1%, 30% and 70%.
   Users arrive over LOOKS refreshes. Measured: SRM at alpha 0.001 on requests per arm (the
   old check) and on users per arm (the new one); the fixed-horizon z-test at alpha 0.05 per
   request and per user (delta method), and the same test's 95% interval missing the true
   difference (0); the mSPRT looked at on every refresh per request and per user.
2. The canary against a 1%, 2% or 5% false-hit target, judged after every 25 labels up to
   2,000: the share of canaries wrongly rolled back (true rate at or under target) and wrongly
   promoted (at or over), and the power, for the exact always-valid test (target_test) and the
   two it replaces (a normal-approximation mSPRT with a 5-point mixture, and a one-sided
   Clopper-Pearson bound re-checked at every look).

Prints a table, draws bench/results/stats_simulation.png and writes the figures as JSON.
About a minute of CPU at the default size (7 minutes of wall time on the shared 2-core machine).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy import stats as sps

from dashboard.control.ratio import RatioStat, diff_of_ratios, sequential_test_ratios, welch_df
from dashboard.control.stats import (DEFAULT_MIXTURE_SD, ProportionStat, diff_of_proportions, msprt_statistic,
                                     sequential_test, srm_check, wilson_interval)
from dashboard.control.target_test import log_e_value

RESULTS = Path(__file__).resolve().parent / "results"
USERS = 20_000
LOOKS = 20
ICCS = (0.05, 0.2)
RATES = (0.01, 0.3, 0.7)
CANARY_TARGETS = (0.01, 0.02, 0.05)
CANARY_MULTIPLIERS = (0.5, 0.8, 1.0, 1.2, 1.5)
LABELS_PER_LOOK, CANARY_LOOKS = 25, 80


def users(rng: np.random.Generator, n: int, icc: float, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Requests and hits of ``n`` users: lognormal requests (mean ~10), Beta propensities (ICC)."""
    requests = np.maximum(1, np.round(rng.lognormal(1.6, 1.1, n))).astype(np.int64)
    strength = (1 - icc) / icc
    propensity = rng.beta(rate * strength, (1 - rate) * strength, n)
    return requests, rng.binomial(requests, propensity)


def _cumulative(x: np.ndarray, y: np.ndarray, look: np.ndarray) -> list[RatioStat]:
    """Per-user statistics of the users arrived by each look (a user's requests arrive with it)."""
    x, y = x.astype("float64"), y.astype("float64")
    sums = [np.cumsum(np.bincount(look, weights=w, minlength=LOOKS))
            for w in (np.ones_like(x), x, y, x * x, y * y, x * y)]
    return [RatioStat(int(n), *map(float, rest)) for n, *rest in zip(*sums)]


def aa_run(rng: np.random.Generator, icc: float, rate: float) -> dict[str, bool]:
    """One A/A experiment: which checks fired (each True is a false alarm)."""
    arm = rng.random(USERS) < 0.5
    x, y = users(rng, USERS, icc, rate)
    look = rng.integers(0, LOOKS, USERS)
    a, b = ~arm, arm
    fired = {
        "srm_requests": srm_check({"a": int(x[a].sum()), "b": int(x[b].sum())}, {"a": 1, "b": 1}).mismatch,
        "srm_users": srm_check({"a": int(a.sum()), "b": int(b.sum())}, {"a": 1, "b": 1}).mismatch,
    }
    pa, pb = ProportionStat(int(x[a].sum()), int(y[a].sum())), ProportionStat(int(x[b].sum()), int(y[b].sum()))
    ra, rb = RatioStat.from_units(x[a], y[a]), RatioStat.from_units(x[b], y[b])
    z_req, z_user = diff_of_proportions(pa, pb), diff_of_ratios(ra, rb)
    fired["z_requests"] = z_req.p_value is not None and z_req.p_value < 0.05
    fired["z_users"] = z_user.p_value is not None and z_user.p_value < 0.05
    fired["ci_users_misses_0"] = z_user.ci_low is not None and not z_user.ci_low <= 0 <= z_user.ci_high
    # the mSPRT, looked at on every refresh, per request and per user
    p_req = p_user = 1.0
    seq_req = seq_user = False
    for ca, cb in zip(_cumulative(x[a], y[a], look[a]), _cumulative(x[b], y[b], look[b])):
        if ca.n < 2 or cb.n < 2:
            continue
        r = sequential_test(ProportionStat(int(ca.sum_x), int(ca.sum_y)), ProportionStat(int(cb.sum_x), int(cb.sum_y)),
                            previous_p=p_req)
        p_req, seq_req = r.p_value, seq_req or r.reject
        u = sequential_test_ratios(ca, cb, previous_p=p_user)
        p_user, seq_user = u.p_value, seq_user or u.reject
    fired["msprt_requests"], fired["msprt_users"] = seq_req, seq_user
    return fired


def srm_users_exact(draws: int, seed: int, alpha: float = 0.001) -> float:
    """SRM false alarms on users per arm over many more draws: users fall by a fair coin, so the
    users check depends on Binomial(USERS, 1/2) alone (the chi-square of stats.srm_check)."""
    a = np.random.default_rng(seed).binomial(USERS, 0.5, draws)
    chi2 = (a - USERS / 2) ** 2 / (USERS / 2) * 2
    return float((sps.chi2.sf(chi2, 1) < alpha).mean())


def aa_table(sims: int, seed: int) -> list[dict]:
    rows = []
    for icc in ICCS:
        for rate in RATES:
            rng = np.random.default_rng([seed, int(icc * 1000), int(rate * 1000)])
            runs = [aa_run(rng, icc, rate) for _ in range(sims)]
            rows.append({"icc": icc, "rate": rate, "sims": sims,
                         **{k: float(np.mean([r[k] for r in runs])) for k in runs[0]}})
    return rows


Z_CELLS = [(USERS, icc, rate) for icc in ICCS for rate in RATES] + [(2_000, 0.2, 0.01), (500, 0.2, 0.01)]


def ztest_table(runs: int, seed: int) -> list[dict]:
    """The per-user z-test's A/A type-I at many more runs than ``aa_table`` (the z-test alone):
    at 200 runs one cell read 9% (18 of 200, ICC 0.2, rate 1%); with its 95% Wilson interval
    (``stats.wilson_interval``). Two small experiments (2,000 and 500 users: a few dozen users
    with a hit per arm) probe the delta method where expected counts are small."""
    rows = []
    for n_users, icc, rate in Z_CELLS:
        rng = np.random.default_rng([seed, 7, n_users, int(icc * 1000), int(rate * 1000)])
        fired = {"normal": 0, "t": 0}
        tested, dfs = 0, []
        for _ in range(runs):
            arm = rng.random(n_users) < 0.5
            x, y = users(rng, n_users, icc, rate)
            a, b = RatioStat.from_units(x[~arm], y[~arm]), RatioStat.from_units(x[arm], y[arm])
            # the same draw read both ways: the normal (no fourth moments) and Welch's t
            normal = diff_of_ratios(replace(a, fourth=None), replace(b, fourth=None))
            welch = diff_of_ratios(a, b)
            if normal.p_value is not None:
                tested += 1
                fired["normal"] += normal.p_value < 0.05
                fired["t"] += welch.p_value < 0.05
                dfs.append(welch_df(a, b))
        row = {"users": n_users, "icc": icc, "rate": rate, "runs": tested,
               "median_df": float(np.median(dfs)) if dfs else None}
        for name, count in fired.items():
            ci = wilson_interval(ProportionStat(tested, count))
            suffix = "" if name == "normal" else "_t"
            row.update({f"type_i{suffix}": ci.rate, f"ci_low{suffix}": ci.low, f"ci_high{suffix}": ci.high})
        rows.append(row)
    return rows


def _first(hits: np.ndarray) -> np.ndarray:
    return np.where(hits.any(axis=1), hits.argmax(axis=1), hits.shape[1])


def canary_run(p: float, target: float, sims: int, seed: int, min_labelled: int = 30,
               alpha: float = 0.05) -> dict[str, dict[str, float]]:
    """Share of canaries rolled back / promoted under each method, judged after every look."""
    rng = np.random.default_rng([seed, int(p * 1e5), int(target * 1e5)])
    k = rng.binomial(LABELS_PER_LOOK, p, size=(sims, CANARY_LOOKS)).cumsum(axis=1)
    n = np.broadcast_to(LABELS_PER_LOOK * np.arange(1, CANARY_LOOKS + 1), k.shape).astype("float64")
    enough = n >= min_labelled
    limit = np.log(1 / alpha)
    exact = (log_e_value(k, n, target, "above") >= limit,
             (log_e_value(k, n, target, "below") >= limit) & enough)
    # the replaced normal-approximation mSPRT (null variance, 5-point mixture)
    var = target * (1 - target) / n
    tau2 = DEFAULT_MIXTURE_SD ** 2
    log_lr = 0.5 * np.log(var / (var + tau2)) + tau2 * (k / n - target) ** 2 / (2 * var * (var + tau2))
    normal = ((log_lr >= limit) & (k / n > target), (log_lr >= limit) & (k / n < target) & enough)
    # the replaced fixed one-sided Clopper-Pearson bound, re-checked on every run
    low = np.where(k > 0, sps.beta.ppf(alpha, np.maximum(k, 1), n - k + 1), 0.0)
    high = np.where(k < n, sps.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)), 1.0)
    bound = (low > target, (high < target) & enough)
    out = {}
    for name, (roll, promote) in (("exact", exact), ("normal_msprt", normal), ("fixed_bound", bound)):
        r, q = _first(roll), _first(promote)
        out[name] = {"rollback": float(((r < CANARY_LOOKS) & (r <= q)).mean()),
                     "promote": float(((q < CANARY_LOOKS) & (q < r)).mean())}
    return out


def canary_table(sims: int, seed: int) -> list[dict]:
    rows = []
    for target in CANARY_TARGETS:
        for mult in CANARY_MULTIPLIERS:
            for method, shares in canary_run(target * mult, target, sims, seed).items():
                rows.append({"target": target, "multiplier": mult, "method": method, **shares})
    return rows


def check_msprt_identity() -> None:
    """The per-request mSPRT here and dashboard.control.stats agree (guards the inline copy)."""
    ref = msprt_statistic(0.03 - 0.02, 0.02 * 0.98 / 400, DEFAULT_MIXTURE_SD, null=0.02)
    var, tau2 = 0.02 * 0.98 / 400, DEFAULT_MIXTURE_SD ** 2
    mine = np.exp(0.5 * np.log(var / (var + tau2)) + tau2 * 0.01 ** 2 / (2 * var * (var + tau2)))
    assert abs(ref - mine) < 1e-9 * max(1.0, ref)


def draw(aa: list[dict], canary: list[dict], path: Path, ztest: list[dict] | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4 if ztest else 3, figsize=(21 if ztest else 16, 4.8))
    labels = [f"ICC {r['icc']:g}\nrate {r['rate']:.0%}" for r in aa]
    xs = np.arange(len(aa))
    ax = axes[0]
    for i, (key, name) in enumerate((("z_requests", "z-test per request"), ("z_users", "z-test per user"),
                                     ("msprt_requests", "mSPRT per request, peeked"),
                                     ("msprt_users", "mSPRT per user, peeked"))):
        ax.bar(xs + (i - 1.5) * 0.2, [r[key] for r in aa], 0.2, label=name)
    ax.axhline(0.05, color="k", ls="--", lw=1)
    ax.set_xticks(xs, labels, fontsize=7)
    ax.set_ylabel("A/A false-positive rate (nominal 0.05)")
    ax.legend(fontsize=7)
    ax.set_title("A/A with clustered users")
    ax = axes[1]
    ax.bar(xs - 0.2, [r["srm_requests"] for r in aa], 0.4, label="SRM on requests")
    ax.bar(xs + 0.2, [r["srm_users"] for r in aa], 0.4, label="SRM on users")
    ax.axhline(0.001, color="k", ls="--", lw=1)
    ax.set_yscale("symlog", linthresh=0.001)
    ax.set_xticks(xs, labels, fontsize=7)
    ax.set_ylabel("SRM false alarms (alpha 0.001)")
    ax.legend(fontsize=7)
    ax.set_title("Sample-ratio check")
    ax = axes[2]
    styles = {"exact": "-", "normal_msprt": "--", "fixed_bound": ":"}
    for method, style in styles.items():
        rows = [r for r in canary if r["method"] == method and r["target"] == 0.02]
        ax.plot([r["multiplier"] for r in rows], [r["promote"] for r in rows], style, color="tab:green",
                label=f"promote, {method}")
        ax.plot([r["multiplier"] for r in rows], [r["rollback"] for r in rows], style, color="tab:red",
                label=f"roll back, {method}")
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xlabel("true false-hit rate / target (target 2%)")
    ax.set_ylabel(f"share of canaries (looks every {LABELS_PER_LOOK} labels, up to "
                  f"{LABELS_PER_LOOK * CANARY_LOOKS:,})")
    ax.legend(fontsize=6)
    ax.set_title("Canary verdicts")
    if ztest:
        ax = axes[3]
        zs = np.arange(len(ztest))
        for offset, suffix, name in ((-0.18, "", "normal z (second moments)"),
                                     (0.18, "_t", "Welch t (fourth moments: df)")):
            value = lambda r, key: r[f"{key}{suffix}"] if r[f"{key}{suffix}"] is not None else np.nan
            rates = np.array([value(r, "type_i") for r in ztest])
            err = np.clip(np.nan_to_num([[value(r, "type_i") - value(r, "ci_low") for r in ztest],
                                         [value(r, "ci_high") - value(r, "type_i") for r in ztest]]), 0, None)
            ax.bar(zs + offset, rates, 0.36, yerr=err, capsize=2, label=name)
        ax.axhline(0.05, color="k", ls="--", lw=1)
        ax.set_xticks(zs, [f"{r['users']:,} users\nICC {r['icc']:g}\nrate {r['rate']:.0%}" for r in ztest],
                      fontsize=6)
        ax.set_ylabel("A/A type-I (nominal 0.05), 95% Wilson interval")
        ax.legend(fontsize=7)
        ax.set_title(f"Per-user fixed-horizon test, {ztest[0]['runs']:,} runs per cell")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sims", type=int, default=200, help="A/A experiments per (ICC, rate)")
    p.add_argument("--canary-sims", type=int, default=4000, help="canaries per (target, true rate)")
    p.add_argument("--z-runs", type=int, default=4000, help="A/A runs per cell of the z-test-only table")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--out", type=Path, default=RESULTS / "stats_simulation.json")
    p.add_argument("--redraw", action="store_true", help="only draw the PNG again from the JSON at --out")
    args = p.parse_args(argv)
    if args.redraw:
        saved = json.loads(args.out.read_text())
        draw(saved["aa"], saved["canary"], args.out.with_suffix(".png"), saved.get("ztest"))
        print(f"wrote {args.out.with_suffix('.png')}")
        return 0
    check_msprt_identity()
    started = time.perf_counter()
    aa = aa_table(args.sims, args.seed)
    srm_exact = srm_users_exact(200_000, args.seed)
    canary = canary_table(args.canary_sims, args.seed)
    ztest = ztest_table(args.z_runs, args.seed)
    elapsed = time.perf_counter() - started
    print(f"A/A, {USERS:,} users per experiment over {LOOKS} looks, {args.sims} experiments per row "
          "(false-positive shares; SRM at alpha 0.001, tests at 0.05):")
    print(f"{'ICC':>5} {'rate':>5} {'SRM req':>8} {'SRM user':>9} {'z req':>6} {'z user':>7} {'CI miss':>8} "
          f"{'mSPRT req':>10} {'mSPRT user':>11}")
    for r in aa:
        print(f"{r['icc']:>5g} {r['rate']:>5.0%} {r['srm_requests']:>8.3f} {r['srm_users']:>9.3f} "
              f"{r['z_requests']:>6.3f} {r['z_users']:>7.3f} {r['ci_users_misses_0']:>8.3f} "
              f"{r['msprt_requests']:>10.3f} {r['msprt_users']:>11.3f}")
    print(f"SRM on users over 200,000 A/A draws: {srm_exact:.4f} false alarms (alpha 0.001)")
    print(f"\nPer-user fixed-horizon test alone, {args.z_runs:,} A/A runs per row (type-I at 0.05, 95% Wilson "
          "interval): normal z (second moments only) vs Welch t (fourth moments: the variance's df)")
    for r in ztest:
        print(f"{r['users']:>7,} users ICC {r['icc']:<4g} rate {r['rate']:>4.0%}: z {r['type_i']:.4f} "
              f"({r['ci_low']:.4f}-{r['ci_high']:.4f})  t {r['type_i_t']:.4f} ({r['ci_low_t']:.4f}-"
              f"{r['ci_high_t']:.4f}), median df {r['median_df']:.0f}, over {r['runs']:,} runs")
    print(f"\nCanary, looks every {LABELS_PER_LOOK} labels up to {LABELS_PER_LOOK * CANARY_LOOKS:,}, "
          f"{args.canary_sims} canaries per row (share rolled back / promoted):")
    print(f"{'target':>6} {'x':>4} " + " ".join(f"{m:>22}" for m in ("exact", "normal_msprt", "fixed_bound")))
    for target in CANARY_TARGETS:
        for mult in CANARY_MULTIPLIERS:
            cells = {r["method"]: r for r in canary if r["target"] == target and r["multiplier"] == mult}
            print(f"{target:>6.0%} {mult:>4g} " + " ".join(
                f"{cells[m]['rollback']:>10.3f} / {cells[m]['promote']:<9.3f}"
                for m in ("exact", "normal_msprt", "fixed_bound")))
    print(f"\n{elapsed:.0f}s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"users": USERS, "looks": LOOKS, "sims": args.sims, "canary_sims": args.canary_sims,
                                    "labels_per_look": LABELS_PER_LOOK, "canary_looks": CANARY_LOOKS,
                                    "seed": args.seed, "elapsed_s": round(elapsed, 1), "aa": aa,
                                    "srm_users_200k_draws": srm_exact, "canary": canary,
                                    "z_runs": args.z_runs, "ztest": ztest},
                                   indent=1))
    draw(aa, canary, args.out.with_suffix(".png"), ztest)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
