"""Shadow checks (cache_core.shadow): sampling, the per-arm budget, the bounded queue, near-misses,
the equivalence checks and the verdicts they publish."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from cache_core.settings import ShadowSettings
from cache_core.shadow.checker import Budget, ShadowChecker
from cache_core.shadow.equivalence import EmbeddingCosine, ExactMatch, normalise
from cache_core.records import LookupResult
from tests.unit.cache_core.helpers import ManualClock
from infra.runtime import wait_until


def result(request_id="r1", hit=True, arm="a", answer="Use the app.", similarity=0.95, threshold=0.9,
           nearest=None) -> LookupResult:
    return LookupResult(request_id=request_id, decision="hit" if hit else "miss", hit=hit,
                        answer=answer if hit else None, similarity=similarity, threshold=threshold,
                        experiment_id="e", arm=arm, config_version=1, intent_cluster=-1, entry_id=None,
                        pending=None, nearest_answer=nearest)


class Recorder:
    def __init__(self):
        self.events = []
        self.lock = threading.Lock()

    def __call__(self, event):
        with self.lock:
            self.events.append(event)


def checker(fetch, publish, clock=None, **settings) -> ShadowChecker:
    options = {"hit_rate": 1.0, "near_miss_band": 0.1, "calls_per_minute": 1000, "equivalence": "exact",
               **settings}
    return ShadowChecker(ShadowSettings(**options), ExactMatch(), fetch, publish,
                         clock=clock or time.monotonic).start()


def test_a_checked_hit_publishes_a_shadow_verdict_under_its_request_id():
    published = Recorder()
    answers = {"how do I reset my PIN": "use the app!", "what is the fee": "It is 2 EUR."}
    shadow = checker(lambda query, request: answers[query], published)
    try:
        assert shadow.after_hit(result("r1", answer="Use the app."), "how do I reset my PIN") == "queued"
        assert shadow.after_hit(result("r2", answer="It is free."), "what is the fee") == "queued"
        wait_until(lambda: len(published.events) == 2, 5, "verdicts")
    finally:
        shadow.close()
    verdicts = {event.request_id: (event.verdict, event.source) for event in published.events}
    assert verdicts == {"r1": ("correct", "shadow"), "r2": ("wrong", "shadow")}
    assert shadow.stats()["hit_correct"] == 1 and shadow.stats()["hit_wrong"] == 1
    assert shadow.stats()["upstream_calls"] == 2


def test_only_the_configured_share_of_hits_is_checked_and_misses_never_call_upstream():
    calls = []
    draws = iter([0.05, 0.5, 0.15, 0.09])
    shadow = ShadowChecker(ShadowSettings(hit_rate=0.1, calls_per_minute=100), ExactMatch(),
                           lambda q, r: calls.append(q) or "x", Recorder(), sample=lambda: next(draws)).start()
    try:
        outcomes = [shadow.after_hit(result(f"r{i}"), f"q{i}") for i in range(4)]
        assert outcomes == ["queued", "skipped", "skipped", "queued"]
        assert shadow.after_hit(result("m", hit=False), "q") == "skipped"
        wait_until(lambda: len(calls) == 2, 5, "calls")
    finally:
        shadow.close()


def test_the_budget_is_calls_per_minute_per_arm():
    clock = ManualClock()
    budget = Budget(3, clock)
    assert [budget.take("a") for _ in range(5)] == [True, True, True, False, False]
    assert budget.take("b")                       # another arm has its own budget
    clock.advance(20)                             # a third of a minute: one call back
    assert budget.take("a") and not budget.take("a")
    clock.advance(3600)                           # never more than a minute's worth saved
    assert [budget.take("a") for _ in range(4)] == [True, True, True, False]
    assert not Budget(0, clock).take("a")


def test_a_checker_over_budget_drops_and_counts():
    clock = ManualClock()
    calls = []
    shadow = checker(lambda q, r: calls.append(q) or "x", Recorder(), clock=clock, calls_per_minute=2)
    try:
        outcomes = [shadow.after_hit(result(f"r{i}", arm="a"), "q") for i in range(5)]
        assert outcomes == ["queued", "queued"] + ["dropped_budget"] * 3
        assert shadow.after_hit(result("other", arm="b"), "q") == "queued"
        wait_until(lambda: len(calls) == 3, 5, "calls")
    finally:
        shadow.close()
    assert shadow.stats()["dropped_budget"] == 3 and shadow.stats()["upstream_calls"] == 3


def test_a_stalled_upstream_fills_the_queue_and_further_checks_are_dropped_without_waiting():
    gate = threading.Event()
    shadow = checker(lambda q, r: gate.wait(10) and "x", Recorder(), concurrency=1, queue_size=2)
    try:
        started = time.perf_counter()
        outcomes = [shadow.after_hit(result(f"r{i}"), "q") for i in range(20)]
        elapsed = time.perf_counter() - started
        # one in the worker's hands (maybe not yet taken), two waiting: the rest dropped at once
        assert outcomes.count("queued") in (2, 3) and outcomes.count("dropped_queue") == 20 - outcomes.count("queued")
        assert elapsed < 0.5
    finally:
        gate.set()
        shadow.close()


def test_near_miss_is_compared_with_the_nearest_answer_at_no_call():
    published = Recorder()
    shadow = checker(lambda q, r: pytest.fail("a near-miss must not call upstream"), published,
                     near_miss_band=0.1, calls_per_minute=0)
    try:
        near = result("m1", hit=False, similarity=0.85, threshold=0.9, nearest="Use the app.")
        far = result("m2", hit=False, similarity=0.7, threshold=0.9, nearest="Use the app.")
        none = result("m3", hit=False, similarity=None, threshold=0.9)
        assert shadow.after_miss(near, "use the app") == "queued"
        assert shadow.after_miss(far, "use the app") == "skipped"
        assert shadow.after_miss(none, "use the app") == "skipped"
        assert shadow.after_miss(near, None) == "skipped"      # no complete upstream answer
        wait_until(lambda: len(published.events) == 1, 5, "verdict")
    finally:
        shadow.close()
    assert published.events[0].request_id == "m1" and published.events[0].source == "shadow"
    assert published.events[0].verdict == "correct" and shadow.stats()["near_miss_correct"] == 1


def test_a_failing_upstream_or_publisher_is_counted_and_the_worker_lives_on():
    published = Recorder()
    answers = iter([RuntimeError("down"), None, "x"])

    def fetch(query, request):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    shadow = checker(fetch, published, concurrency=1)
    try:
        for i in range(3):
            shadow.after_hit(result(f"r{i}", answer="x"), "q")
        wait_until(lambda: len(published.events) == 1, 5, "verdict")
    finally:
        shadow.close()
    assert shadow.stats()["no_answer"] == 2 and shadow.stats()["upstream_calls"] == 3


def test_off_by_default_and_closed_checker_drops():
    shadow = ShadowChecker(ShadowSettings(), ExactMatch(), lambda q, r: "x", Recorder()).start()
    assert not shadow.enabled and shadow.after_hit(result(), "q") == "skipped"
    on = checker(lambda q, r: "x", Recorder())
    on.close()
    assert on.after_hit(result(), "q") == "dropped_closed"


def test_equivalence_checks():
    assert normalise("  Use the APP:  Card > PIN. ") == "use the app card pin"
    assert ExactMatch()("Use the app.", "use the app").same
    assert not ExactMatch()("Use the app.", "Call us.").same
    table = {"a": np.array([1.0, 0.0]), "b": np.array([0.9, 0.1]), "c": np.array([0.0, 1.0])}
    cosine = EmbeddingCosine(lambda texts: np.stack([table[t] for t in texts]), threshold=0.9)
    assert cosine("a", "b").same and cosine("a", "b").score == pytest.approx(0.9939, abs=1e-3)
    assert not cosine("a", "c").same
    with pytest.raises(ValueError):
        EmbeddingCosine(lambda texts: None, threshold=0.0)


def test_a_lookup_near_miss_asks_upstream_for_its_share_within_the_budget():
    published = Recorder()
    asked = []

    def fetch(query, request):
        asked.append((query, request))
        return "Use the app."

    draws = iter([0.1, 0.9, 0.1, 0.1])
    shadow = ShadowChecker(ShadowSettings(near_miss_band=0.1, near_miss_rate=0.5, calls_per_minute=2,
                                          equivalence="exact"), ExactMatch(), fetch, published,
                           clock=ManualClock(), sample=lambda: next(draws)).start()
    try:
        near = lambda rid, nearest="use the app": result(rid, hit=False, similarity=0.85, threshold=0.9,
                                                         nearest=nearest)
        assert shadow.after_lookup_miss(result("far", hit=False, similarity=0.7, nearest="x"), "q") == "skipped"
        assert shadow.after_lookup_miss(near("m1"), "how do I pay") == "queued"          # drew 0.1 < 0.5
        assert shadow.after_lookup_miss(near("m2"), "q") == "skipped"                   # drew 0.9: not sampled
        assert shadow.after_lookup_miss(near("m3", "It is free."), "what is the fee") == "queued"
        assert shadow.after_lookup_miss(near("m4"), "q") == "dropped_budget"           # 2 calls a minute
        wait_until(lambda: len(published.events) == 2, 5, "verdicts")
    finally:
        shadow.close()
    assert {e.request_id: e.verdict for e in published.events} == {"m1": "correct", "m3": "wrong"}
    assert asked == [("how do I pay", None), ("what is the fee", None)]
    assert shadow.stats()["near_miss_correct"] == 1 and shadow.stats()["near_miss_wrong"] == 1


def test_a_judge_veto_is_a_near_miss_whatever_its_similarity():
    """A judged arm's candidate above the floor that the judge refused: its verdict measures the
    false-hit rate below the judge's cut (tuning_judge), as the band does below a threshold."""
    published = Recorder()
    shadow = checker(lambda q, r: pytest.fail("a chat near-miss must not call upstream"), published,
                     near_miss_band=0.1, calls_per_minute=0)
    try:
        veto = result("v1", hit=False, similarity=0.97, threshold=0.6, nearest="Use the app.")
        veto.guard, veto.judge_probability = "judge", 0.41
        other = result("v2", hit=False, similarity=0.97, threshold=0.6, nearest="Use the app.")
        other.guard = "numbers"                      # a lexical guard's veto above the band: not a near-miss
        assert shadow.is_near_miss(veto) and not shadow.is_near_miss(other)
        assert shadow.after_miss(veto, "It is free.") == "queued"
        wait_until(lambda: len(published.events) == 1, 5, "verdict")
    finally:
        shadow.close()
    assert published.events[0].request_id == "v1" and published.events[0].verdict == "wrong"


def test_each_queued_check_reports_the_rate_it_was_sampled_at():
    """An error-bounded arm weighs a verdict by 1 / its check rate: hits at ``hit_rate``, lookup
    near-misses at ``near_miss_rate``, chat near-misses (always compared) at 1; drops report nothing."""
    rates = {}
    draws = iter([0.05, 0.1, 0.9, 0.9])
    shadow = ShadowChecker(ShadowSettings(hit_rate=0.25, near_miss_band=0.1, near_miss_rate=0.5, calls_per_minute=2,
                                          equivalence="exact"), ExactMatch(), lambda q, r: "x", Recorder(),
                           clock=ManualClock(), sample=lambda: next(draws),
                           on_checked=lambda request_id, p: rates.__setitem__(request_id, p)).start()
    try:
        near = lambda rid: result(rid, hit=False, similarity=0.85, threshold=0.9, nearest="x")  # noqa: E731
        assert shadow.after_hit(result("h1"), "q") == "queued"
        assert shadow.after_lookup_miss(near("m1"), "q") == "queued"
        assert shadow.after_miss(near("c1"), "x") == "queued"
        assert shadow.after_hit(result("h2"), "q") == "skipped"  # drew 0.9
        assert shadow.after_lookup_miss(near("m2"), "q") == "skipped"  # drew 0.9
    finally:
        shadow.close()
    assert rates == {"h1": 0.25, "m1": 0.5, "c1": 1.0}
