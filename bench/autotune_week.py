"""A simulated week of auto-tune, re-run every hour on a rolling window, under clustered users.

    python -m bench.autotune_week [--weeks 200] [--out bench/results/autotune_week.json]  # and .png

What issue 26 asks of the loop as it really runs: over a week of ``autotune --every``,
P(auto-tune ever serves a threshold truly over the false-hit target) <= alpha.

The world: a pool of 20,000 users with heavy-tailed activity (lognormal weights: a few
users send a large share of the requests) sends DECISIONS_PER_RUN lookups an hour; each
lookup's top-1 similarity falls in a 0.005 bin over [0.50, 1.00) (a share ``in_grid`` of
them uniform over [0.70, 1.00), the rest under 0.70, never served). A served hit is wrong
with probability sigmoid(g(s) + b_u): g falls with the similarity s, b_u ~ N(0, sd^2) is
the user's own propensity, persistent over the week, with sd set by the latent-scale ICC
(sd^2 = ICC / (1 - ICC) * pi^2 / 3: ICC 0.05 and 0.2). A share LABEL_SHARE of hits get a
verdict, at random (biased labels are item 4, not measured here). The true false-hit rate
of a threshold t is the request-weighted rate over every hit at or above t (exact, from g
and the distribution of b): a threshold is "truly over target" when it exceeds the target.

The loop, every hour, for each week in lock-step (numpy over weeks): a running canary is
judged on its labels since it started (``target_test.log_e_value``, the test of
``canary.evaluate_canary``): promote or roll back; an arm without a canary gets the rule of
``tuning.recommend`` + ``tuning.exploration`` over the last LOOKBACK_RUNS hours (labels of a
candidate only from decisions logged at a threshold at or below it; the time-uniform bound
of ``target_test.upper_confidence_bounds`` split over the candidates; min labels, max step,
explore memory), and every change goes out as a canary on CANARY_SHARE of the users (the
default: ``rollout`` routes every loosening through one). That rule is re-implemented over
arrays for speed; ``check_against_project`` replays week 0 of every scenario through the
project's own ``tuning.recommend`` / ``tuning.exploration`` and asserts the same actions.

Measured per scenario (share of weeks): ever *promoted* a truly over-target threshold
(served to every user: the goal, <= alpha), ever *recommended* one as a change (the
bound's own claim), ever *tried* one on a canary (explorations try unknown thresholds on
purpose; 10% of users see it until its test rolls it back), and how close the week ends
to the best safe threshold (the power side). Prints a table, writes the figures (with the
hour-by-hour path of the served threshold) as JSON and draws them to the PNG beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dashboard.control import tuning
from dashboard.control.guardrails import Guardrails
from dashboard.control.target_test import log_e_value, upper_confidence_bounds

RESULTS = Path(__file__).resolve().parent / "results"
BINS = 100  # similarity bins of 0.005 over [0.50, 1.00); threshold index i <-> 0.50 + 0.005 i (0..100)
LOW, WIDTH = 0.50, 0.005
USERS = 20_000
RUNS = 7 * 24  # one run an hour for a week
LOOKBACK_RUNS = 6  # autotune's default 6 h lookback
DECISIONS_PER_RUN = 20_000
LABEL_SHARE = 0.2
CANARY_SHARE = 0.1
START = 0.90
STEPS = 6  # max step 0.03 on the 0.005 grid
SLOPE = 60.0  # logit of a wrong hit falls by 3 per 0.05 of similarity
G = Guardrails(target_false_hit_rate=0.02, alpha=0.05, min_decisions=200, min_labelled=30, max_step=0.03,
               cooldown_s=1800, grid_step=WIDTH)


@dataclass(frozen=True)
class Scenario:
    icc: float
    target: float
    in_grid: float
    """Share of lookups with a top-1 similarity in [0.70, 1.00) (sets the hit rate)."""
    crossing: float
    """Similarity where a hit's wrong-probability (median user) equals the target."""

    @property
    def user_sd(self) -> float:
        return math.sqrt(self.icc / (1 - self.icc) * math.pi ** 2 / 3)


SCENARIOS = [Scenario(icc, target, in_grid, crossing) for icc in (0.05, 0.2)
             for target, in_grid, crossing in ((0.02, 0.04, 0.86), (0.02, 0.6, 0.86), (0.05, 1.0, 0.80))]


def bin_probs(s: Scenario) -> np.ndarray:
    """P(top-1 similarity in bin i); the rest (1 - in_grid) is under 0.70 (bins 0-39 uniform)."""
    p = np.zeros(BINS)
    p[40:] = s.in_grid / 60
    p[:40] = (1 - s.in_grid) / 40
    return p


def logit_wrong(s: Scenario) -> np.ndarray:
    """g(bin): the median user's logit of a wrong hit in each bin."""
    sim = LOW + WIDTH * (np.arange(BINS) + 0.5)
    return math.log(s.target / (1 - s.target)) + SLOPE * (s.crossing - sim)


def true_rates(s: Scenario) -> np.ndarray:
    """The true false-hit rate of every threshold index 0..BINS (request-weighted, over b_u)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    p = (1 / (1 + np.exp(-(logit_wrong(s)[:, None] + s.user_sd * nodes[None, :])))) @ (weights / weights.sum())
    mass = bin_probs(s)
    hits = np.concatenate([np.cumsum(mass[::-1])[::-1], [0.0]])
    wrong = np.concatenate([np.cumsum((mass * p)[::-1])[::-1], [0.0]])
    return np.divide(wrong, hits, out=np.zeros_like(wrong), where=hits > 0)


def candidates(current: np.ndarray) -> np.ndarray:
    """(weeks, 2 STEPS + 1) threshold indices around each current one, clipped to [0, BINS]
    (clipped duplicates are the same candidate; ``valid`` marks the first of each)."""
    return np.clip(current[:, None] + np.arange(-STEPS, STEPS + 1)[None, :], 0, BINS)


class Weeks:
    """The state of ``weeks`` simulated weeks of one scenario, advanced one run at a time."""

    def __init__(self, s: Scenario, weeks: int, seed: int):
        self.s, self.w = s, weeks
        self.rng = np.random.default_rng([seed, int(s.icc * 1000), int(s.target * 1000), int(s.in_grid * 100)])
        activity = self.rng.lognormal(0.0, 1.1, USERS)
        canary_user = np.arange(USERS) < CANARY_SHARE * USERS  # the canary hash: a fixed share of users
        self.canary_activity = activity[canary_user].sum() / activity.sum()
        self.canary_ids, self.base_ids = np.nonzero(canary_user)[0], np.nonzero(~canary_user)[0]
        self.canary_cdf = np.cumsum(activity[canary_user]) / activity[canary_user].sum()
        self.base_cdf = np.cumsum(activity[~canary_user]) / activity[~canary_user].sum()
        self.b = self.rng.normal(0.0, s.user_sd, (weeks, USERS))
        self.g = logit_wrong(s)
        self.base = np.full(weeks, round((START - LOW) / WIDTH))
        self.canary = np.full(weeks, -1)  # canary threshold index, -1: none
        self.canary_explore = np.zeros(weeks, bool)
        self.canary_n = np.zeros(weeks)
        self.canary_k = np.zeros(weeks)
        self.failed = np.full(weeks, -1)  # highest threshold a rolled-back canary tried (explore memory: a week)
        # labels per (week, bin, threshold in force) and decisions per (week, bin), one slot per run of the lookback
        self.labels = np.zeros((LOOKBACK_RUNS, weeks, BINS, BINS + 1), np.int32)
        self.wrong = np.zeros_like(self.labels)
        self.decisions = np.zeros((LOOKBACK_RUNS, weeks, BINS), np.int32)

    def traffic(self, run: int) -> None:
        """One hour of lookups for every week, into the lookback slot of ``run``: lookups per bin
        (multinomial), split between canary and other users by their share of the activity; the
        labelled hits are drawn one by one (their user, then whether the hit was wrong)."""
        w = self.w
        decisions = self.rng.multinomial(DECISIONS_PER_RUN, bin_probs(self.s), size=w)
        live = self.canary >= 0
        on_canary = self.rng.binomial(decisions, np.where(live, self.canary_activity, 0.0)[:, None])
        edges = np.arange(BINS)[None, :]
        labelled, thr, variant = [], [], []
        for is_canary, count, threshold in ((False, decisions - on_canary, self.base), (True, on_canary, self.canary)):
            hits = np.where((edges >= threshold[:, None]) & (threshold[:, None] >= 0), count, 0)
            labelled.append(self.rng.binomial(hits, LABEL_SHARE))
            thr.append(threshold)
            variant.append(is_canary)
        slot = run % LOOKBACK_RUNS
        self.labels[slot] = 0
        self.wrong[slot] = 0
        self.decisions[slot] = decisions
        for count, threshold, is_canary in zip(labelled, thr, variant):
            week, sim_bin = np.nonzero(count)
            reps = count[week, sim_bin]
            week, sim_bin = np.repeat(week, reps), np.repeat(sim_bin, reps)
            cdf, ids = (self.canary_cdf, self.canary_ids) if is_canary else (self.base_cdf, self.base_ids)
            user = ids[np.minimum(np.searchsorted(cdf, self.rng.random(week.size)), ids.size - 1)]
            logit = self.g[sim_bin] + self.b[week, user]
            wrong = self.rng.random(week.size) < 1 / (1 + np.exp(-logit))
            np.add.at(self.labels[slot], (week, sim_bin, threshold[week]), 1)
            np.add.at(self.wrong[slot], (week[wrong], sim_bin[wrong], threshold[week[wrong]]), 1)
            if is_canary:
                self.canary_n += np.bincount(week, minlength=w)
                self.canary_k += np.bincount(week[wrong], minlength=w)

    def table(self, runs_in: int):
        """The threshold table of every week (as ``whatif.threshold_table``): candidates, labelled,
        wrong, supported, est hits, bounds; over the last ``runs_in`` slots."""
        labels = self.labels[:runs_in].sum(axis=0, dtype=np.int64)
        wrong = self.wrong[:runs_in].sum(axis=0, dtype=np.int64)
        decisions = self.decisions[:runs_in].sum(axis=0, dtype=np.int64)
        # at bin >= c and logged at a threshold <= c: suffix over bins, prefix over thresholds
        suffix_n = np.cumsum(np.cumsum(labels[:, ::-1, :], axis=1)[:, ::-1, :], axis=2)
        suffix_k = np.cumsum(np.cumsum(wrong[:, ::-1, :], axis=1)[:, ::-1, :], axis=2)
        cand = candidates(self.base)
        cb = np.minimum(cand, BINS - 1)  # threshold 1.00: no bin reaches it
        rows = np.arange(self.w)[:, None]
        n = np.where(cand < BINS, suffix_n[rows, cb, cand], 0)
        k = np.where(cand < BINS, suffix_k[rows, cb, cand], 0)
        # lowest labelled bin among labels logged at a threshold <= c
        any_label = np.cumsum(labels, axis=2) > 0  # (w, bin, thr)
        has = any_label[rows, :, cand]  # (w, cand, bin)
        lowest = np.where(has.any(axis=2), has.argmax(axis=2), BINS + 1)
        supported = cand >= lowest
        est = np.concatenate([np.cumsum(decisions[:, ::-1], axis=1)[:, ::-1], np.zeros((self.w, 1), np.int64)], axis=1)
        est_hits = est[rows, cand]
        first = np.ones_like(cand, bool)
        first[:, 1:] = cand[:, 1:] != cand[:, :-1]
        count = first.sum(axis=1)
        bound = np.full(cand.shape, np.nan)
        for c in np.unique(count):  # one vectorised call per distinct candidate count (almost always one)
            m = count == c
            bound[m] = upper_confidence_bounds(k[m], n[m], G.alpha / c)
        return cand, n, k, supported, est_hits, bound, first

    def tune(self, runs_in: int, check=None) -> dict[str, np.ndarray]:
        """One auto-tune pass for every week; returns what happened (per week, -1: nothing).
        ``check(action, value)`` is called with the recommendations when week 0 had no canary."""
        limit = math.log(1 / G.alpha)
        live = self.canary >= 0
        e_above = log_e_value(self.canary_k, self.canary_n, self.s.target, "above")
        e_below = log_e_value(self.canary_k, self.canary_n, self.s.target, "below")
        rollback = live & (e_above >= limit)
        promote = live & ~rollback & (e_below >= limit) & (self.canary_n >= G.min_labelled)
        promoted_to = np.where(promote, self.canary, -1)
        # as canary.last_failed_try: the highest threshold any rolled-back canary tried
        self.failed = np.where(rollback, np.maximum(self.failed, self.canary), self.failed)
        self.base = np.where(promote, self.canary, self.base)
        ended = rollback | promote
        self.canary = np.where(ended, -1, self.canary)
        self.canary_n[ended] = self.canary_k[ended] = 0
        action, value = self.recommend(runs_in)
        if check is not None and not live[0]:
            check(action, value)
        free = ~live  # arms with a canary at the start of the run are only judged
        start = free & np.isin(action, (1, 2))
        self.canary = np.where(start, value, self.canary)
        self.canary_explore = np.where(start, action == 2, self.canary_explore)
        return {"promoted_to": promoted_to, "started": np.where(start, value, -1), "action": np.where(free, action, -1)}

    def recommend(self, runs_in: int) -> tuple[np.ndarray, np.ndarray]:
        """(action, threshold index) per week: 0 hold, 1 change, 2 explore (tuning.recommend +
        tuning.exploration as arrays)."""
        cand, n, k, supported, est_hits, bound, first = self.table(runs_in)
        rows = np.arange(self.w)
        cur = np.argmax(cand == self.base[:, None], axis=1)
        feasible = first & supported & (n >= G.min_labelled) & (bound <= self.s.target)
        # best: most est hits, then the highest threshold
        score = np.where(feasible, est_hits * (BINS + 2.0) + cand, -np.inf)
        best = cand[rows, np.argmax(score, axis=1)]
        any_feasible = feasible.any(axis=1)
        over = (n[rows, cur] >= G.min_labelled) & (bound[rows, cur] > self.s.target)
        action = np.zeros(self.w, int)
        value = self.base.copy()
        change = any_feasible & (best != self.base)
        action[change], value[change] = 1, best[change]
        raise_ = ~any_feasible & over
        action[raise_], value[raise_] = 1, cand[raise_, -1]
        # exploration: held at the best supported threshold (= current): lowest unsupported candidate
        # below it, above a failed try, serving more than the current one
        held = any_feasible & (best == self.base)
        below = first & (cand < self.base[:, None]) & ~supported & (cand > self.failed[:, None])
        step_idx = np.argmax(below, axis=1)  # candidates ascend: the first is the lowest
        step = cand[rows, step_idx]
        explore = held & below.any(axis=1) & (est_hits[rows, step_idx] > est_hits[rows, cur])
        action[explore], value[explore] = 2, step[explore]
        return action, value

    def frames(self, week: int, runs_in: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Week ``week``'s lookback as the project's frames (queries.similarity_histogram and
        labelled_similarity rows), for ``check_against_project``."""
        decisions = self.decisions[:runs_in, week].sum(axis=0)
        hist = pd.DataFrame({"arm": "a", "intent_cluster": -1, "similarity_milli": 500 + 5 * np.arange(BINS),
                             "decisions": decisions, "hits": 0, "guard_blocks": 0})
        labels = self.labels[:runs_in, week].sum(axis=0)
        wrong = self.wrong[:runs_in, week].sum(axis=0)
        b, t = np.nonzero(labels)
        lab = pd.DataFrame({"arm": "a", "intent_cluster": -1, "similarity_milli": 500 + 5 * b,
                            "threshold_milli": 500 + 5 * t, "correct": labels[b, t] - wrong[b, t],
                            "wrong": wrong[b, t]})
        return hist, lab


def check_against_project(weeks: Weeks, runs_in: int, action: np.ndarray, value: np.ndarray) -> None:
    """Week 0's recommendation through the project's tuning.recommend / exploration; raises on
    a difference."""
    hist, lab = weeks.frames(0, runs_in)
    g = Guardrails(**{**G.__dict__, "target_false_hit_rate": weeks.s.target})
    current = round(LOW + WIDTH * weeks.base[0], 6)
    rec = tuning.recommend("a", current, hist, lab, g, now_ms=10**13)
    failed = None
    if weeks.failed[0] >= 0:
        from dashboard.control.canary import RolledBack
        failed = RolledBack("a", 0, round(LOW + WIDTH * weeks.failed[0], 6), None)
    rec = tuning.exploration(rec, failed) or rec
    mine, theirs = {0: "hold", 1: "change", 2: "explore"}[int(action[0])], rec.action
    same = mine == theirs and (mine == "hold" or abs(rec.recommended - (LOW + WIDTH * value[0])) < 1e-6)
    if not same:
        raise AssertionError(f"week 0 differs from tuning.recommend: {mine} {value[0]} vs {rec.action} "
                             f"{rec.recommended} ({rec.reason})")


def run_scenario(s: Scenario, weeks: int, seed: int, check: bool = True, runs: int = RUNS) -> dict:
    sim = Weeks(s, weeks, seed)
    over = true_rates(s) > s.target
    safe = np.nonzero(~over[:BINS])[0]
    best_safe = int(safe.min()) if safe.size else BINS
    ever = {k: np.zeros(weeks, bool) for k in ("promoted_over", "recommended_over", "tried_over")}
    promotions = np.zeros(weeks, int)
    checks = 0
    path = {k: [] for k in ("base_p10", "base_median", "base_p90", "canary_share", "over_served")}
    for run in range(runs):
        sim.traffic(run)
        runs_in = min(run + 1, LOOKBACK_RUNS)
        checker = None
        if check and run % 4 == 0:
            def checker(action, value, runs_in=runs_in):
                nonlocal checks
                check_against_project(sim, runs_in, action, value)
                checks += 1
        happened = sim.tune(runs_in, checker)
        p, st, act = happened["promoted_to"], happened["started"], happened["action"]
        ever["promoted_over"] |= (p >= 0) & over[np.maximum(p, 0)]
        ever["tried_over"] |= (st >= 0) & over[np.maximum(st, 0)]
        ever["recommended_over"] |= (act == 1) & (st >= 0) & over[np.maximum(st, 0)]
        promotions += p >= 0
        # after the run: the threshold every user gets (quantiles over weeks), canaries running, weeks over target
        thresholds = LOW + WIDTH * sim.base
        for key, q in (("base_p10", 10), ("base_median", 50), ("base_p90", 90)):
            path[key].append(round(float(np.percentile(thresholds, q)), 4))
        path["canary_share"].append(float((sim.canary >= 0).mean()))
        path["over_served"].append(float(over[sim.base].mean()))
    final = sim.base
    return {"icc": s.icc, "target": s.target, "in_grid": s.in_grid, "weeks": weeks,
            "hit_rate_at_best_safe": float(bin_probs(s)[best_safe:].sum()),
            "best_safe_threshold": round(LOW + WIDTH * best_safe, 3),
            "true_rate_at_start": float(true_rates(s)[round((START - LOW) / WIDTH)]),
            **{k: float(v.mean()) for k, v in ever.items()},
            "promotions_mean": float(promotions.mean()),
            "final_threshold_median": round(LOW + WIDTH * float(np.median(final)), 3),
            "final_over_target": float(over[final].mean()),
            "final_hit_rate_mean": float(np.mean([bin_probs(s)[f:].sum() for f in final])),
            "project_checks": checks,
            "threshold_over_from": _over_from(over), "path": path}


def _over_from(over: np.ndarray) -> float | None:
    """The highest threshold truly over target (None: none is): thresholds at or under it serve over target."""
    idx = np.nonzero(over[:BINS])[0]
    return round(LOW + WIDTH * int(idx.max()), 3) if idx.size else None


def draw(rows: list[dict], path: Path) -> None:
    """One panel per scenario: the threshold every user gets over the week (median and 10-90% of
    weeks), the thresholds truly over target shaded, the best safe one dashed, and the share of weeks
    running a canary (right axis)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(rows) // 2, figsize=(15, 7.5), sharex=True, squeeze=False)
    for ax, r in zip(axes.ravel(), rows):  # a row per ICC
        hours = np.arange(1, len(r["path"]["base_median"]) + 1)
        ax.fill_between(hours, r["path"]["base_p10"], r["path"]["base_p90"], color="tab:blue", alpha=0.25,
                        step="post", label="threshold, 10-90% of weeks")
        ax.step(hours, r["path"]["base_median"], where="post", color="tab:blue", label="threshold, median week")
        low, high = ax.get_ylim()
        if r["threshold_over_from"] is not None:
            ax.axhspan(min(low, 0.70), r["threshold_over_from"] + WIDTH / 2, color="tab:red", alpha=0.12,
                       label="truly over target")
        ax.axhline(r["best_safe_threshold"], color="k", ls="--", lw=1, label="best safe threshold")
        ax.set_ylim(min(r["best_safe_threshold"], min(r["path"]["base_p10"])) - 0.03,
                    max(max(r["path"]["base_p90"]), START) + 0.02)
        ax.set_title(f"ICC {r['icc']:g}, target {r['target']:.0%}, {r['hit_rate_at_best_safe']:.0%} hits at best safe"
                     f"\npromoted over target in {r['promoted_over']:.1%} of weeks", fontsize=9)
        twin = ax.twinx()
        twin.plot(hours, r["path"]["canary_share"], color="tab:green", lw=0.8, alpha=0.8)
        twin.set_ylim(0, 1)
        twin.tick_params(labelsize=7, colors="tab:green")
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("hour of the week (one auto-tune run an hour)")
    for ax in axes[:, 0]:
        ax.set_ylabel("cosine threshold served to every user")
    axes[0, 0].legend(fontsize=7, loc="lower left")
    fig.text(0.995, 0.5, "share of weeks running a canary (green)", rotation=90, va="center", ha="right",
             color="tab:green", fontsize=8)
    fig.suptitle(f"Auto-tune every hour for a week ({rows[0]['weeks']} simulated weeks per scenario)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.985, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weeks", type=int, default=200, help="simulated weeks per scenario")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--runs", type=int, default=RUNS, help="auto-tune runs (hours) per week (tests: fewer)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip replaying week 0 through tuning.recommend")
    p.add_argument("--out", type=Path, default=RESULTS / "autotune_week.json")
    args = p.parse_args(argv)
    started = time.perf_counter()
    rows = [run_scenario(s, args.weeks, args.seed, args.check, args.runs) for s in SCENARIOS]
    elapsed = time.perf_counter() - started
    print(f"auto-tune every hour for a week ({args.runs} runs, {LOOKBACK_RUNS} h lookback, {DECISIONS_PER_RUN:,} lookups "
          f"an hour, {LABEL_SHARE:.0%} of hits labelled, canaries on {CANARY_SHARE:.0%} of users, alpha {G.alpha}), "
          f"{args.weeks} weeks per row; shares of weeks:")
    print(f"{'ICC':>5} {'target':>6} {'hit rate':>8} {'best safe':>9} {'promoted over':>13} {'recommended over':>16} "
          f"{'tried over':>10} {'promotions':>10} {'final thr':>9} {'final hits':>10}")
    for r in rows:
        print(f"{r['icc']:>5g} {r['target']:>6.0%} {r['hit_rate_at_best_safe']:>8.1%} {r['best_safe_threshold']:>9.3f} "
              f"{r['promoted_over']:>13.3f} {r['recommended_over']:>16.3f} {r['tried_over']:>10.3f} "
              f"{r['promotions_mean']:>10.2f} {r['final_threshold_median']:>9.3f} {r['final_hit_rate_mean']:>10.1%}")
    print(f"\n{elapsed:.0f}s; week 0 of every scenario replayed through tuning.recommend "
          f"{sum(r['project_checks'] for r in rows)} times, all equal")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": args.runs, "lookback_runs": LOOKBACK_RUNS, "decisions_per_run": DECISIONS_PER_RUN,
                                    "label_share": LABEL_SHARE, "canary_share": CANARY_SHARE, "alpha": G.alpha,
                                    "seed": args.seed, "elapsed_s": round(elapsed, 1), "rows": rows}, indent=1))
    draw(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
