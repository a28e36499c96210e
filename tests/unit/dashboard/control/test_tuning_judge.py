"""dashboard.control.tuning_judge and its auto-tune step: a judged arm's probability cut tuned from
verdicts by judge probability (simulated traffic with a known truth), loosening only on a canary."""
import numpy as np
import pandas as pd
import pytest

from cache_core.experiments import ArmConfig, ExperimentConfig, JudgeConfig
from dashboard.control import autotune, changes, tuning_judge
from dashboard.control.guardrails import Guardrails

NOW = 10_000_000
G = Guardrails(target_false_hit_rate=0.05, min_decisions=100, min_labelled=30, cooldown_s=600)


def truth(band_wrong):
    """Wrong share of a served answer by judge probability bin (0.001): 1% at 0.800 and up,
    ``band_wrong`` in 0.750-0.799, 30% below."""
    bins = np.arange(0, 1000)
    return np.where(bins >= 800, 0.01, np.where(bins >= 750, band_wrong, 0.30))


def true_rate(cut, band_wrong):
    return truth(band_wrong)[np.arange(0, 1000) >= round(cut * 1000)].mean()


def simulated(seed=5, band_wrong=0.01, cut=0.80, per_bin=30, hit_rate=0.25, veto_rate=0.5, users_per_bin=5,
              arm="j", version="v1"):
    """Judged decisions spread evenly over probability 0.400-0.999 at cut ``cut``: hits above it (users
    label ``users_per_bin`` per bin, shadow checks ``hit_rate``), vetoes below (shadow checks
    ``veto_rate`` of those within 0.1 of the cut, as the near-miss band would)."""
    rng = np.random.default_rng(seed)
    wrong_at = truth(band_wrong)
    rows = []
    for b in range(400, 1000):
        p = wrong_at[b]
        hit = b >= round(cut * 1000)
        row = {"arm": arm, "judge_version": version, "probability_milli": b, "decisions": per_bin,
               "hits": per_bin if hit else 0, "user_correct": 0, "user_wrong": 0, "shadow_hit_correct": 0,
               "shadow_hit_wrong": 0, "shadow_miss_correct": 0, "shadow_miss_wrong": 0}
        if hit:
            uw = rng.binomial(users_per_bin, p)
            row.update(user_correct=users_per_bin - uw, user_wrong=uw)
            n = rng.binomial(per_bin, hit_rate)
            w = rng.binomial(n, p)
            row.update(shadow_hit_correct=n - w, shadow_hit_wrong=w)
        elif b >= round(cut * 1000) - 100:
            n = rng.binomial(per_bin, veto_rate)
            w = rng.binomial(n, p)
            row.update(shadow_miss_correct=n - w, shadow_miss_wrong=w)
        rows.append(row)
    return pd.DataFrame(rows)


def test_the_cut_replays_exactly_from_the_logged_probabilities():
    table = tuning_judge.cut_table(simulated(), [0.75, 0.80, 0.85], alpha=0.05).set_index("threshold")
    assert table.loc[0.80, "est_hits"] == 200 * 30 and table.loc[0.75, "est_hits"] == 250 * 30
    assert table.loc[0.80, "supported"] and not table.loc[0.75, "supported"]   # users never see vetoes
    assert table.loc[0.75, "shadow_supported"] and table.loc[0.75, "shadow_near_miss_checks"] > 500


def test_users_alone_hold_the_cut_shadow_checks_of_vetoes_loosen_it():
    probabilities = simulated()
    users_only = probabilities.assign(shadow_hit_correct=0, shadow_hit_wrong=0, shadow_miss_correct=0,
                                      shadow_miss_wrong=0)
    alone = tuning_judge.recommend_cut("j", "v1", 0.80, users_only, G, now_ms=NOW)
    assert alone.action == "hold" and alone.recommended == pytest.approx(0.80) and alone.basis == "users"
    rec = tuning_judge.recommend_cut("j", "v1", 0.80, probabilities, G, now_ms=NOW)
    assert rec.action == "change" and rec.recommended == pytest.approx(0.75) and rec.loosens
    assert rec.basis == "shadow" and rec.false_hit_upper <= 0.05 and "judge-veto checks" in rec.reason


def test_a_bad_band_under_the_cut_keeps_it_and_an_over_target_cut_is_raised():
    rec = tuning_judge.recommend_cut("j", "v1", 0.80, simulated(band_wrong=0.5), G, now_ms=NOW)
    assert rec.recommended is None or rec.recommended >= 0.78 - 1e-9
    assert true_rate(0.77, 0.5) > 0.05   # what going lower would have cost
    # the arm runs at 0.75 over a half-wrong band: measured over target, the cut goes up by the max step
    high = tuning_judge.recommend_cut("j", "v1", 0.75, simulated(band_wrong=0.5, cut=0.75), G, now_ms=NOW)
    assert high.action == "change" and high.recommended == pytest.approx(0.80) and not high.loosens


@pytest.mark.parametrize("band_wrong", [0.15, 0.3])
def test_over_many_seeds_the_chosen_cut_keeps_the_target(band_wrong):
    over = lowered = 0
    for seed in range(20):
        rec = tuning_judge.recommend_cut("j", "v1", 0.80, simulated(seed=seed, band_wrong=band_wrong), G, now_ms=NOW)
        chosen = rec.recommended if rec.recommended is not None else 0.80
        over += true_rate(chosen, band_wrong) > 0.05
        lowered += chosen < 0.80 - 1e-9
    assert over <= 1 and lowered >= 10


def _config(judge=JudgeConfig(version="v1", accept_at=0.80), canary=None):
    return ExperimentConfig(experiment_id="e", salt="s", version=3, arms=[
        ArmConfig(name="j", threshold=0.6, judge=judge, canary=canary), ArmConfig(name="plain", threshold=0.9)])


def _run_step(monkeypatch, config, probabilities, canary_share=0.1):
    pushed = []

    def push(settings, config, change, actor, reason, client, clock):
        pushed.append(reason)
        return changes.bumped(change(config), config.version + 1, actor, clock())

    monkeypatch.setattr(autotune, "_push", push)
    monkeypatch.setattr(autotune.queries, "judge_probabilities", lambda client, filters: probabilities)
    actions = []
    from cache_core.settings import Settings
    out = autotune._tune_judges(Settings(), config, G, None, set(), NOW, {}, actions, client=None, apply=True,
                                actor="t", canary_share=canary_share, clock=lambda: NOW)
    return out, actions, pushed


def test_autotune_loosens_a_judged_arm_on_a_canary_and_tightens_directly(monkeypatch):
    config, actions, pushed = _run_step(monkeypatch, _config(), simulated())
    canary = config.arm("j").canary
    assert canary is not None and canary.judge.accept_at == pytest.approx(0.75) and canary.share == 0.1
    assert canary.threshold == 0.6 and config.arm("j").judge.accept_at == 0.80      # the arm keeps its cut
    assert [a.kind for a in actions] == ["judge"] and actions[0].accept_at == pytest.approx(0.75)
    assert "judge v1 cut 0.800 -> 0.750" in pushed[0] and "shadow verdicts" in pushed[0]
    promoted = changes.promote_canary("j")(config)
    assert promoted.arm("j").judge.accept_at == pytest.approx(0.75) and promoted.arm("j").canary is None
    config, _, _ = _run_step(monkeypatch, _config(JudgeConfig(version="v1", accept_at=0.75)),
                             simulated(band_wrong=0.5, cut=0.75))
    assert config.arm("j").canary is None and config.arm("j").judge.accept_at == pytest.approx(0.80)


def test_autotune_holds_a_judged_arm_whose_cut_it_cannot_know(monkeypatch, tmp_path):
    judge = JudgeConfig(version="v9", max_false_hit_rate=0.05)         # no artifact in the judge dir
    monkeypatch.setenv("SCACHE_CACHE__JUDGE_DIR", str(tmp_path))
    config, actions, pushed = _run_step(monkeypatch, _config(judge), simulated(version="v9"))
    assert pushed == [] and actions[0].action == "hold" and "unknown here" in actions[0].reason
