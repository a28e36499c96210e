"""A/A simulation: how often each test declares a difference when there is none.

Used by the tests (and runnable by hand) to show that the mSPRT keeps its error
rate under continuous monitoring while a naive z-test checked at every refresh
does not. Seeded and small: a few seconds on one core.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from dashboard.control.stats import DEFAULT_ALPHA, DEFAULT_MIXTURE_SD, ProportionStat, sequential_test


@dataclass(frozen=True)
class AAResult:
    simulations: int
    looks: int
    naive_false_positive_rate: float
    """Share of A/A runs where a two-sided z-test at ``alpha`` fired at any look."""
    sequential_false_positive_rate: float
    """Share of A/A runs where the mSPRT rejected at any look."""
    final_look_false_positive_rate: float
    """The z-test looked at only once, at the end (should be close to alpha)."""


def aa_simulation(simulations: int = 400, looks: int = 40, per_look: int = 200, rate: float = 0.4,
                  alpha: float = DEFAULT_ALPHA, mixture_sd: float = DEFAULT_MIXTURE_SD,
                  seed: int = 7) -> AAResult:
    """Two identical arms, ``per_look`` new trials per arm between looks."""
    rng = np.random.default_rng(seed)
    control = rng.binomial(per_look, rate, size=(simulations, looks)).cumsum(axis=1)
    treatment = rng.binomial(per_look, rate, size=(simulations, looks)).cumsum(axis=1)
    n = per_look * np.arange(1, looks + 1)
    pooled = (control + treatment) / (2 * n)
    se = np.sqrt(pooled * (1 - pooled) * 2 / n)
    z = np.divide(treatment / n - control / n, se, out=np.zeros_like(se), where=se > 0)
    naive = 2 * sps.norm.sf(np.abs(z)) <= alpha
    sequential = np.zeros(simulations, dtype=bool)
    for s in range(simulations):
        p = 1.0
        for k in range(looks):
            result = sequential_test(ProportionStat(int(n[k]), int(control[s, k])),
                                     ProportionStat(int(n[k]), int(treatment[s, k])),
                                     alpha, mixture_sd, previous_p=p)
            p = result.p_value
            if result.reject:
                sequential[s] = True
                break
    return AAResult(simulations, looks, float(naive.any(axis=1).mean()), float(sequential.mean()),
                    float(naive[:, -1].mean()))


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m dashboard.control.simulation", description=__doc__.splitlines()[0])
    parser.add_argument("--simulations", type=int, default=400, help="A/A runs (default 400)")
    parser.add_argument("--looks", type=int, default=40, help="looks at the data per run (default 40)")
    parser.add_argument("--per-look", type=int, default=200, help="new trials per arm between looks (default 200)")
    parser.add_argument("--rate", type=float, default=0.4, help="the true rate of both arms (default 0.4)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    for flag in ("simulations", "looks", "per_look"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if not 0 < args.rate < 1:
        parser.error(f"--rate must be in (0, 1), got {args.rate}")
    print(aa_simulation(args.simulations, args.looks, args.per_look, args.rate, seed=args.seed))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
