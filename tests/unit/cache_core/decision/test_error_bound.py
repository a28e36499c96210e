"""Error-bounded thresholds (cache_core.decision.error_bound, error_curves): the curves estimator
keeps δ on a simulated stream, lets young entries borrow their cluster's curve and is not blocked by
one noisy top verdict; the staircase estimator's bound holds and its levels fall back in order; the
option validates, and decide() uses it."""
from __future__ import annotations

from dataclasses import astuple

import numpy as np
import pytest
from pydantic import ValidationError

from cache_core.decision import error_curves
from cache_core.decision.error_bound import NOTHING_SAFE, Judged, VerdictBook, certified_threshold
from cache_core.decision.error_evidence import wrong_upper_bound
from cache_core.decision.rule import HitRule
from cache_core.events import JudgedLookup
from cache_core.experiments import ArmConfig, CanaryConfig, ErrorBoundedThresholds, verdicts_to_certify
from cache_core.records import CacheEntry, Candidate

POLICY = ErrorBoundedThresholds(delta=0.05, confidence=0.9, estimator="staircase")
CURVES = ErrorBoundedThresholds(delta=0.05, audit=True)
CURVES_ALONE = ErrorBoundedThresholds(delta=0.05, audit=False)
"""The curves' own cuts, without the evidence audit (what the curve tests are about)."""


def p_wrong(s: np.ndarray, boundary: float) -> np.ndarray:
    """The simulated truth: wrong-answer odds fall steeply with similarity around ``boundary``."""
    return 1.0 / (1.0 + np.exp(40.0 * (s - boundary)))


def served_error(theta: float, boundary: float) -> float:
    """P(wrong | s >= theta) for similarities uniform on [0.6, 1]."""
    grid = np.linspace(theta, 1.0, 2001)
    return float(p_wrong(grid, boundary).mean()) if theta <= 1.0 else 0.0


def test_the_bound_is_clopper_pearson_and_certification_needs_enough_verdicts():
    assert verdicts_to_certify(0.05, 0.9) == 45
    assert wrong_upper_bound(0, 45, 0.9) <= 0.05 < wrong_upper_bound(0, 44, 0.9)
    assert wrong_upper_bound(3, 3, 0.9) == 1.0
    sims = np.full(44, 0.99)
    assert certified_threshold(sims, np.zeros(44, bool), POLICY) is None  # too young to decide


@pytest.mark.parametrize("boundary", [0.75, 0.85, 0.92])
def test_learnt_thresholds_keep_delta_in_a_seeded_simulation(boundary):
    """Over 300 seeded windows of 400 verdicts, the served error at the learnt threshold exceeds
    δ in at most 1 − confidence of them (plus slack), and the threshold is not uselessly high."""
    rng = np.random.default_rng(7)
    breaches, thetas = 0, []
    for _ in range(300):
        sims = rng.uniform(0.6, 1.0, 400)
        wrong = rng.random(400) < p_wrong(sims, boundary)
        theta = certified_threshold(sims, wrong, POLICY)
        assert theta is not None
        thetas.append(theta)
        breaches += served_error(theta, boundary) > POLICY.delta
    assert breaches / 300 <= (1 - POLICY.confidence) + 0.03
    best = min(t for t in np.arange(0.6, 1.0, 0.005) if served_error(t, boundary) <= POLICY.delta)
    assert np.median(thetas) <= best + 0.06  # it learns something close to the best cut, not 1.0


def test_evidence_of_wrong_answers_serves_nothing_rather_than_falling_back():
    sims = np.linspace(0.9, 1.0, 100)
    assert certified_threshold(sims, np.arange(100) % 3 == 0, POLICY) == NOTHING_SAFE


def judged(entry: str, cluster: int, similarity: float, wrong: bool = False) -> Judged:
    return Judged("e", "a", entry, cluster, similarity, wrong)


def test_levels_fall_back_entry_then_cluster_then_arm_then_static():
    book = VerdictBook()
    assert book.threshold("e", "a", POLICY, "x", 0, 0.9) == (0.9, "static")
    for i in range(45):  # entries y0.., cluster 1: enough at the arm level only
        book.record(judged(f"y{i}", 1, 0.80 + i * 0.004))
    theta, source = book.threshold("e", "a", POLICY, "x", 0, 0.9)
    assert source == "arm" and theta == pytest.approx(0.80)
    for i in range(45):  # cluster 0 gets its own verdicts, all at >= 0.95
        book.record(judged(f"z{i}", 0, 0.95 + i * 0.001))
    assert book.threshold("e", "a", POLICY, "x", 0, 0.9) == (pytest.approx(0.95), "cluster")
    for _ in range(45):  # entry x is judged wrong at 0.97 and below, right above
        book.record(judged("x", 0, 0.97, wrong=True))
    assert book.threshold("e", "a", POLICY, "x", 0, 0.9) == (NOTHING_SAFE, "entry")
    assert book.threshold("e", "other-arm", POLICY, "x", 0, 0.9) == (0.9, "static")
    assert book.counts("e", "a") == {"verdicts": 135, "entries": 91, "clusters": 2}


def test_the_option_is_validated_with_clear_errors():
    assert ArmConfig(name="a").threshold_policy.kind == "global"
    with pytest.raises(ValidationError, match="delta"):
        ArmConfig(name="a", threshold_policy={"kind": "error_bounded"})
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        ArmConfig(name="a", threshold_policy={"kind": "errorbound", "delta": 0.05})
    assert ErrorBoundedThresholds(delta=0.05).verdicts_needed == 59
    with pytest.raises(ValidationError, match="needs at least 59 verdicts"):
        ArmConfig(name="a", threshold_policy={"kind": "error_bounded", "delta": 0.05, "min_verdicts": 10})
    with pytest.raises(ValidationError, match="delta"):
        ArmConfig(name="a", threshold_policy={"kind": "error_bounded", "delta": 0.7})
    with pytest.raises(ValidationError, match="Extra inputs"):
        ArmConfig(name="a", threshold_policy={"kind": "error_bounded", "delta": 0.05, "detla": 1})


def candidate(entry_id: str, similarity: float, cluster: int = 0) -> Candidate:
    entry = CacheEntry(entry_id=entry_id, query=entry_id, embedding=np.zeros(2, dtype=np.float32), answer="a",
                       created_at=0.0, ttl_s=60.0, ttl_policy="absolute", max_age_s=60.0,
                       namespace="default", intent_cluster=cluster)
    return Candidate(entry, similarity)


def test_decide_uses_each_candidates_learnt_threshold_and_reports_its_source():
    rule = HitRule()
    for i in range(45):
        rule.verdicts.record(Judged("e", "a", f"y{i}", 0, 0.70 + i * 0.001, False))
    for _ in range(45):
        rule.verdicts.record(Judged("e", "a", "bad", 1, 0.99, True))
    bounded = ArmConfig(name="a", threshold=0.9, threshold_policy={"kind": "error_bounded", "delta": 0.05,
                                                                    "confidence": 0.9, "estimator": "staircase"})
    decision = rule.decide("q", [candidate("good", 0.75), candidate("bad", 0.95)], bounded, 0, experiment_id="e")
    assert decision.served.entry.entry_id == "good"
    assert (decision.threshold, decision.threshold_source) == (pytest.approx(0.70), "cluster")
    # A refused nearer candidate blocks the less similar ones: no fall-through to "good".
    miss = rule.decide("q", [candidate("bad", 0.95), candidate("good", 0.75)], bounded, 0, experiment_id="e")
    assert not miss.hit and miss.eligible == []
    assert (miss.threshold, miss.threshold_source) == (NOTHING_SAFE, "entry")
    static = rule.decide("q", [candidate("good", 0.75)], ArmConfig(name="a", threshold=0.9), 0, experiment_id="e")
    assert not static.hit and static.threshold == 0.9 and static.threshold_source is None
    canary = bounded.model_copy(update={"canary": CanaryConfig(threshold=0.8, share=0.5)})
    in_canary = rule.decide("q", [candidate("good", 0.75)], canary, 0, "canary", experiment_id="e")
    assert not in_canary.hit and in_canary.threshold == 0.8 and in_canary.threshold_source is None


@pytest.mark.parametrize("policy", [POLICY, CURVES], ids=["staircase", "curves"])
def test_the_book_round_trips_through_its_exported_state(policy):
    book = VerdictBook()
    for i in range(90):
        book.record(judged(f"y{i % 7}", i % 3, 0.8 + i * 0.002, wrong=i % 20 == 0))
    copy = VerdictBook()
    copy.load_state(book.export_state())
    assert copy.export_state() == book.export_state()
    for entry, cluster in (("y1", 0), ("nope", 2), ("nope", 9)):
        assert copy.threshold("e", "a", policy, entry, cluster, 0.9) == book.threshold("e", "a", policy, entry,
                                                                                       cluster, 0.9)


# -- the curves estimator (the default) ----------------------------------------------------


def test_a_noisy_top_verdict_does_not_block_the_similarities_below_it():
    """300 correct verdicts over 0.80-1.00 and one wrong at 0.995: the staircase, tested from the
    top, fails at once and serves nothing; the curve barely moves and certifies the range."""
    rng = np.random.default_rng(3)
    sims = np.append(rng.uniform(0.80, 1.0, 300), 0.995)
    wrong = np.append(np.zeros(300, bool), True)
    staircase = ErrorBoundedThresholds(delta=0.05, estimator="staircase")
    assert certified_threshold(sims, wrong, staircase) == NOTHING_SAFE
    book = VerdictBook()
    for s, w in zip(sims, wrong):
        book.record(judged(f"y{int(s * 1000)}", 0, float(s), bool(w)))
    theta, source = book.threshold("e", "a", CURVES_ALONE, "fresh", 0, 0.9)
    assert source == "cluster" and theta <= 0.81
    assert book.threshold("e", "a", staircase, "fresh", 0, 0.9) == (NOTHING_SAFE, "cluster")


def test_young_entries_borrow_their_clusters_curve_and_their_own_verdicts_move_it():
    rng = np.random.default_rng(4)
    book = VerdictBook()
    assert book.threshold("e", "a", CURVES_ALONE, "x", 0, 0.9) == (0.9, "static")
    for i, s in enumerate(rng.uniform(0.75, 1.0, 200)):  # wrong below ~0.85, right above
        book.record(judged(f"y{i}", 0, float(s), bool(rng.random() < 1 / (1 + np.exp(40 * (s - 0.85))))))
    cluster_theta, source = book.threshold("e", "a", CURVES_ALONE, "never-judged", 0, 0.9)
    assert source == "cluster" and 0.8 < cluster_theta < 0.95
    book.record(judged("good", 0, 0.9))
    good, source = book.threshold("e", "a", CURVES_ALONE, "good", 0, 0.9)
    assert source == "entry" and good <= cluster_theta + 0.005  # one verdict: about its cluster's
    for s in (0.96, 0.97, 0.98):
        book.record(judged("bad", 0, s, wrong=True))
    bad, _ = book.threshold("e", "a", CURVES_ALONE, "bad", 0, 0.9)
    cluster_after, _ = book.threshold("e", "a", CURVES_ALONE, "never-judged", 0, 0.9)
    # Its wrong answers near the top count for its cluster too, but raise its own threshold most.
    assert bad == NOTHING_SAFE and cluster_theta <= cluster_after < 0.99
    # an entry of a cluster without verdicts takes the arm's curve
    assert book.threshold("e", "a", CURVES_ALONE, "elsewhere", 5, 0.9)[1] == "arm"


def simulated_stream(policy: ErrorBoundedThresholds, hit_check: float, floor: float = 0.0, lookups: int = 6000,
                     seed: int = 1) -> tuple[int, int, list[str]]:
    """Hits, wrong hits and threshold sources of a stream: 12 clusters with different boundaries
    (wrong odds fall steeply with similarity around each; ``floor``: a share wrong at any similarity,
    like near-identical questions with different answers), lookups at uniform similarities, a
    verdict on a share ``hit_check`` of the hits and on every near-miss in a 0.1 band below the
    threshold used (the shadow checks), each recorded with its check probability."""
    rng = np.random.default_rng(seed)
    boundaries = rng.uniform(0.75, 0.92, 12)
    entry_cluster = rng.integers(0, 12, 600)
    book, hits, wrongs, sources = VerdictBook(), 0, 0, []
    for _ in range(lookups):
        entry = int(rng.integers(0, 600))
        cluster = int(entry_cluster[entry])
        s = float(rng.uniform(0.6, 1.0))
        odds = floor + (1.0 - floor) / (1.0 + np.exp(40.0 * (s - boundaries[cluster])))
        wrong = bool(rng.random() < odds)
        theta, source = book.threshold("e", "a", policy, f"x{entry}", cluster, 1.0)  # the start: exact repeats
        sources.append(source)
        if s >= theta:
            hits, wrongs = hits + 1, wrongs + wrong
            if rng.random() < hit_check:
                book.record(Judged("e", "a", f"x{entry}", cluster, s, wrong, hit_check))
        elif s >= theta - 0.1:
            book.record(judged(f"x{entry}", cluster, s, wrong))
    return hits, wrongs, sources


@pytest.mark.parametrize(("policy", "hit_check", "serves"),
                         [(CURVES_ALONE, 0.25, 0.09), (CURVES_ALONE, 0.1, 0.06), (CURVES, 0.25, 0.01),
                          (CURVES, 0.1, 0.015)])
def test_the_realised_wrong_share_stays_within_delta_on_a_simulated_stream(policy, hit_check, serves):
    """The wrong share of hits stays within δ, most lookups are decided by a cluster's or an entry's
    own curve, and it serves a useful share (the per-cluster oracle serves ~32%, a global cut ~22%;
    the audit, resting on the verdicts behind each margin rather than on the curves, serves ~1-2% of
    these 6,000 lookups: it has to wait for checks at each margin before serving from it)."""
    hits, wrongs, sources = simulated_stream(policy, hit_check)
    assert wrongs / hits <= policy.delta + 0.01
    assert hits / 6000 >= serves  # fewer hit verdicts: less certified, less served
    assert (sources.count("entry") + sources.count("cluster")) / len(sources) >= 0.8


def test_at_a_small_delta_the_audit_keeps_it_where_the_curves_point_estimate_overshoots():
    """4% of answers wrong at any similarity (the floor a logistic curve, falling to 0 at the top,
    cannot see) and δ = 0.02: the curves alone extrapolate below the floor and serve 7% wrong (4 of
    57); the audit, an upper bound on the wrong share of verdicts its cuts had not seen, finds no
    cut that keeps 2% and serves nothing; at δ = 0.10 on the same stream it serves, far less than the
    curves alone (26 against 1,148 hits; those were 7.7% wrong)."""
    small = ErrorBoundedThresholds(delta=0.02)
    hits, wrongs, _ = simulated_stream(small.model_copy(update={"audit": False}), 0.5, floor=0.04)
    assert hits >= 40 and wrongs / hits > 0.04  # the point estimate promised 2%
    hits, wrongs, _ = simulated_stream(small, 0.5, floor=0.04)
    assert wrongs <= 0.02 * hits
    hits, wrongs, _ = simulated_stream(ErrorBoundedThresholds(delta=0.10, audit=True), 0.5, floor=0.04)
    assert hits >= 20 and wrongs / hits <= 0.10


def test_the_audit_is_on_by_default_only_where_the_curves_alone_overshot():
    """δ below 0.05 is audited unless told otherwise (the curves alone broke 0.02 on every bench run);
    at 0.05 and above the curves alone, which kept it; an explicit ``audit`` wins either way."""
    assert ErrorBoundedThresholds(delta=0.02).audited and ErrorBoundedThresholds(delta=0.049).audited
    assert not ErrorBoundedThresholds(delta=0.05).audited and not ErrorBoundedThresholds(delta=0.10).audited
    assert ErrorBoundedThresholds(delta=0.10, audit=True).audited
    assert not ErrorBoundedThresholds(delta=0.02, audit=False).audited


def test_the_cold_start_serves_only_at_or_above_start_threshold_until_the_arm_learns():
    """Before the arm holds enough verdicts its threshold is max(arm threshold, start_threshold):
    by default 1.0, only exact repeats; a lower start_threshold is the old, unbounded start."""
    assert CURVES.start_threshold == 1.0
    with pytest.raises(ValidationError):
        ErrorBoundedThresholds(delta=0.05, start_threshold=1.5)
    rule = HitRule()
    arm = ArmConfig(name="a", threshold=0.9,
                    threshold_policy={"kind": "error_bounded", "delta": 0.05, "audit": False})
    cold = rule.decide("q", [candidate("close", 0.97)], arm, 0, experiment_id="e")
    assert not cold.hit and (cold.threshold, cold.threshold_source) == (1.0, "static")
    repeat = rule.decide("q", [candidate("same", 1.0)], arm, 0, experiment_id="e")
    assert repeat.hit and repeat.threshold_source == "static"
    old = arm.model_copy(update={"threshold_policy": ErrorBoundedThresholds(delta=0.05, start_threshold=0.5)})
    assert rule.decide("q", [candidate("close", 0.97)], old, 0, experiment_id="e").threshold == 0.9  # the arm's
    assert rule.decide("q", [candidate("close", 0.97)], old, 0, experiment_id="e").hit
    for i in range(CURVES.verdicts_needed):  # enough verdicts, all correct: the learnt threshold decides
        rule.verdicts.record(Judged("e", "a", f"y{i}", 0, 0.85 + i * 0.002, False))
    warm = rule.decide("q", [candidate("close", 0.97)], arm, 0, experiment_id="e")
    assert warm.hit and warm.threshold < 0.97 and warm.threshold_source != "static"
    # Audited, those verdicts came before any cut, so none vouches for one: nothing is served yet.
    audited = arm.model_copy(update={"threshold_policy": ErrorBoundedThresholds(delta=0.05, audit=True)})
    assert rule.decide("q", [candidate("close", 0.97)], audited, 0, experiment_id="e").threshold == NOTHING_SAFE


# -- verdicts weighed by their check probability -------------------------------------------


def test_the_served_error_averages_over_the_lookups_a_verdict_stands_for():
    """Hits checked at 0.1 and near-misses at 1: weighing each by 1 / check_prob gives the
    threshold the whole population (every hit judged) gives, not the checked sample's."""
    bound = lambda s: np.where(np.asarray(s) >= 0.9, 0.02, 0.30)  # noqa: E731 - wrong odds by band
    near = np.linspace(0.80, 0.899, 40)  # every near-miss judged
    hits = np.linspace(0.90, 1.0, 20)  # a tenth of 200 hits judged
    args = (0.05, 0.5, 0.005, NOTHING_SAFE)
    census = error_curves.served_error_threshold(bound, np.concatenate([near, np.repeat(hits, 10)]), *args)
    weighted = error_curves.served_error_threshold(bound, np.concatenate([near, hits]), *args,
                                                   weights=np.concatenate([np.ones(40), np.full(20, 10.0)]))
    unweighted = error_curves.served_error_threshold(bound, np.concatenate([near, hits]), *args)
    assert weighted == pytest.approx(census) and weighted < 0.9
    assert unweighted > weighted  # the near-misses' weight in the sample made it too careful here


def test_weights_scale_to_the_effective_sample_size_and_move_the_fit():
    assert np.array_equal(error_curves.fit_weights(None, 3), np.ones(3))
    assert np.allclose(error_curves.fit_weights(np.full(5, 4.0), 5), np.ones(5))  # equal: the plain fit
    unequal = error_curves.fit_weights(np.array([1.0, 1.0, 4.0, 4.0]), 4)
    assert unequal.sum() == pytest.approx(10.0 ** 2 / 34.0)  # Kish: (sum w)^2 / sum w^2 < 4 verdicts
    rng = np.random.default_rng(5)
    sims = np.concatenate([rng.uniform(0.80, 0.90, 200), rng.uniform(0.90, 1.0, 20)])
    wrong = np.concatenate([rng.random(200) < 0.2, np.arange(20) % 5 < 2])  # hits: 40% wrong
    weights = np.concatenate([np.ones(200), np.full(20, 10.0)])
    prior = (error_curves.ARM_PRIOR.mean, error_curves.ARM_PRIOR.cov)
    plain, weighted = error_curves.fit(sims, wrong, prior), error_curves.fit(sims, wrong, prior, weights=weights)
    # the ten-fold hits pull the curve up above 0.9; the near-misses, now fewer effective verdicts,
    # pin it less where they lie
    assert weighted.wrong(np.array([0.95]))[0] > plain.wrong(np.array([0.95]))[0]
    assert weighted.variance(np.array([0.85]))[0] > plain.variance(np.array([0.85]))[0]


def test_check_probability_is_validated_and_round_trips():
    with pytest.raises(ValueError, match="check_prob"):
        Judged("e", "a", "x", 0, 0.9, False, 0.0)
    with pytest.raises(ValueError, match="check_prob"):
        Judged("e", "a", "x", 0, 0.9, False, 1.5)
    book = VerdictBook()
    for i in range(80):
        book.record(Judged("e", "a", f"y{i % 5}", 0, 0.85 + i * 0.001, i % 9 == 0, 0.25 if i % 2 else 1.0))
    state = book.export_state()
    copy = VerdictBook()
    copy.load_state(state)
    assert copy.export_state() == state
    assert copy.threshold("e", "a", CURVES, "y1", 0, 1.0) == book.threshold("e", "a", CURVES, "y1", 0, 1.0)
    old = {"arms": [{**state["arms"][0], "arm_verdicts": [row[:2] for row in state["arms"][0]["arm_verdicts"]]}]}
    copy.load_state(old)  # saved before check_prob: two columns, each verdict weighs 1
    assert {row[2] for row in copy.export_state()["arms"][0]["arm_verdicts"]} == {1.0}
    with pytest.raises(ValueError):
        copy.load_state({"arms": [{**state["arms"][0], "arm_verdicts": [[0.9, 0, 0.0]]}]})


def test_replicas_audit_the_same_verdicts_alike_whatever_cuts_each_had():
    """A verdict's audit reading (margin over the cut in force, edge, depth) is made once, by the
    replica that made the lookup, and travels with it: a replica that learns the same verdicts from
    the entries topic, its own cuts computed at other moments, keeps the same audit rows. Without the
    reading (a message from an older replica) it measures against its own cuts, and they differ."""
    policy = ErrorBoundedThresholds(delta=0.05, audit=True)
    rng = np.random.default_rng(3)
    serving, follower, measuring = VerdictBook(), VerdictBook(), VerdictBook()
    for step in range(4000):
        entry, cluster, s = int(rng.integers(0, 200)), int(rng.integers(0, 6)), float(rng.uniform(0.6, 1.0))
        theta, _ = serving.threshold("e", "a", policy, f"x{entry}", cluster, 1.0)
        if s < theta - 0.1:
            continue
        made = Judged("e", "a", f"x{entry}", cluster, s, bool(rng.random() < 1 / (1 + np.exp(40 * (s - 0.8)))))
        reading = serving.record(made)
        assert reading == () or len(reading) == 3
        follower.record(Judged(*astuple(made)[:-1], audit=reading))
        measuring.record(made)
        if step % 7 == 0:  # the others decide their own lookups at other moments: other cuts
            for book in (follower, measuring):
                book.threshold("e", "a", policy, f"x{(entry + 1) % 200}", (cluster + 1) % 6, 1.0)
    audit = lambda book: list(book._arms[("e", "a")].audit)  # noqa: E731
    assert len(audit(serving)) > 500
    assert audit(follower) == audit(serving)
    assert audit(measuring) != audit(serving)


def test_an_audit_reading_is_three_numbers_or_none():
    assert Judged("e", "a", "x", 0, 0.9, False, audit=()).audit == ()
    with pytest.raises(ValueError, match="margin, edge, depth"):
        Judged("e", "a", "x", 0, 0.9, False, audit=(0.1, 0.2))
    fields = {"arm": "a", "cluster": 0, "similarity": 0.9, "wrong": False}
    assert JudgedLookup(**fields).audit is None  # an older replica's message: the receiver measures
    assert JudgedLookup(**fields, audit=[0.01, 0.0, 0.02]).audit == [0.01, 0.0, 0.02]
    for bad in ([0.1, 0.2], [0.1, float("nan"), 0.2], [0.1] * 4):
        with pytest.raises(ValidationError):
            JudgedLookup(**fields, audit=bad)
