"""dashboard.control.queries against the real embedded warehouse, on seeded rows."""
import uuid
from datetime import timedelta

import pandas as pd
import pytest

from cache_core.events import ControlMessage
from cache_core.experiments import load_experiments
from dashboard.control import changes, publishing, queries, whatif
from tests.fixtures import dashboard_seed as seed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def seeded(warehouse, ch_settings, tmp_path_factory):
    from cache_core.chclient import connect

    client = connect(ch_settings)
    experiment_id = f"dash-q-{uuid.uuid4().hex[:8]}"
    now = seed.seed(client, experiment_id)
    filters = queries.Filters(experiment_id, now - timedelta(hours=1), now + timedelta(minutes=1))
    yield client, filters, experiment_id, tmp_path_factory.mktemp("exp")
    client.close()


def test_arm_summary_counts_each_window_once(seeded):
    client, filters, *_ = seeded
    df = queries.arm_summary(client, filters).set_index("arm")
    for arm, (requests, hits) in seed.EXPECTED.items():
        assert (df.at[arm, "requests"], df.at[arm, "hits"]) == (requests, hits)
    assert df.at["treatment", "hit_rate"] == pytest.approx(340 / 500)
    assert df.at["control", "latency_mean_ms"] == pytest.approx(7.0)


def test_hit_rate_by_tier_adds_up_to_the_arms(seeded):
    client, filters, *_ = seeded
    tiers = queries.tier_hit_rates(client, filters).set_index(["arm", "tier"])
    summary = queries.arm_summary(client, filters).set_index("arm")
    for arm in summary.index:
        memory, disk = tiers.loc[(arm, "memory")], tiers.loc[(arm, "disk")]
        assert memory.hits + disk.hits == summary.at[arm, "hits"]
        assert memory.hit_rate + disk.hit_rate == pytest.approx(summary.at[arm, "hit_rate"])
    assert tiers.loc[("control", "disk")].hits == 0 and tiers.loc[("treatment", "disk")].hits > 0


def test_filters_narrow_results(seeded):
    client, filters, experiment_id, _ = seeded
    other_ns = queries.Filters(experiment_id, filters.start, filters.end, namespace="nope")
    assert queries.arm_summary(client, other_ns).empty
    before = queries.Filters(experiment_id, filters.start - timedelta(days=2), filters.start - timedelta(days=1))
    assert queries.arm_summary(client, before).empty
    assert queries.namespaces(client, experiment_id) == ["default"]


def test_latency_quantiles_from_merged_histograms(seeded):
    client, filters, *_ = seeded
    df = queries.latency_quantiles(client, filters).set_index("arm")
    assert 5.0 < df.at["control", "p50_ms"] <= 10.0    # all in the (5, 10] ms bucket
    assert 2.0 < df.at["treatment", "p95_ms"] <= 5.0   # all in the (2, 5] ms bucket
    assert sum(df.at["control", "latency_hist"]) == 500


def test_timeseries_one_point_per_window(seeded):
    client, filters, *_ = seeded
    df = queries.hit_rate_timeseries(client, filters, bucket_s=60)
    control_points = df[df["arm"] == "control"]
    assert len(control_points) == seed.WINDOWS
    assert set(control_points["requests"]) == {100}
    assert control_points["hit_rate"].tolist() == pytest.approx([0.51] * seed.WINDOWS)


@pytest.mark.parametrize("dimension,key,arm,requests,hits", [
    ("intent_cluster", 1, "treatment", 300, 225),
    ("lifetime_bucket", "mid", "control", 150, 75),
    ("index_kind", "hnsw", "treatment", 500, 340),
])
def test_breakdowns(seeded, dimension, key, arm, requests, hits):
    client, filters, *_ = seeded
    df = queries.breakdown(client, filters, dimension)
    row = df[(df["arm"] == arm) & (df[dimension] == key)].iloc[0]
    assert (row["requests"], row["hits"]) == (requests, hits)


def test_index_precision(seeded):
    client, filters, *_ = seeded
    df = queries.breakdown(client, filters, "index_kind").set_index("arm")
    assert df.at["treatment", "ann_precision"] == pytest.approx(0.9)
    assert df.at["control", "ann_precision"] == pytest.approx(1.0)


def test_unknown_breakdown_is_a_clear_error(seeded):
    client, filters, *_ = seeded
    with pytest.raises(ValueError, match="unknown breakdown"):
        queries.breakdown(client, filters, "arm; DROP TABLE window_agg")


def test_similarity_histogram_feeds_whatif(seeded):
    client, filters, *_ = seeded
    hist = queries.similarity_histogram(client, filters)
    assert hist["decisions"].sum() == 80
    at_current = whatif.whatif_hit_rate(hist, 0.80).set_index("arm")
    assert at_current.at["treatment", "est_hit_rate"] == at_current.at["treatment", "observed_hit_rate"] == 0.75
    assert whatif.whatif_hit_rate(hist, 0.85).set_index("arm").at["control", "est_hit_rate"] == 0.5


def test_cluster_examples_most_frequent_first(seeded):
    client, filters, experiment_id, _ = seeded
    examples = queries.cluster_examples(client, filters).set_index("intent_cluster")
    assert sorted(examples.index) == [1, 2, 3]
    for cluster, texts in seed.CLUSTER_TEXTS.items():
        assert list(examples.at[cluster, "examples"]) == texts  # 3-4 of the first, 1 of the second
    assert examples["texts"].tolist() == [32, 24, 24]
    other_namespace = queries.Filters(experiment_id, filters.start, filters.end, namespace="elsewhere")
    assert queries.cluster_examples(client, other_namespace).empty
    before = queries.Filters(experiment_id, filters.start - timedelta(hours=2), filters.start)
    assert queries.cluster_examples(client, before).empty


def test_parameters_are_not_sql(seeded):
    client, filters, *_ = seeded
    evil = queries.Filters("x' OR '1'='1", filters.start, filters.end)
    assert queries.arm_summary(client, evil).empty


def test_audit_rows_readable_by_queries(seeded):
    client, filters, experiment_id, tmp = seeded
    config = load_experiments(seed.experiments_file(tmp / "e.yaml", experiment_id))[experiment_id]
    new = changes.with_threshold(config, "treatment", 0.77, "tester", at_ms=filters.parameters()["end_ms"] - 90_000)
    msg = ControlMessage(experiment=new, actor="tester", reason="seeded", ts_ms=new.updated_at_ms)
    publishing.record_change(client, msg, "treatment", 0.80, config.version)
    audit = queries.threshold_changes(client, filters)
    assert audit[["arm", "old_threshold", "new_threshold", "new_version"]].values.tolist() == [
        ["treatment", 0.80, 0.77, 2]]
    listed = queries.experiments(client).set_index("experiment_id")
    assert listed.at[experiment_id, "version"] == 2
    assert '"threshold":0.77' in listed.at[experiment_id, "config_json"]


# -- multi-similarity arms: score floor / answer margin re-applied in the SQL ---------

# (arm, similarity_mode, logged cosine threshold, similarity, hit, guard, score, score_margin, verdict)
MULTI_ROWS = [
    ("mx", "multi", 0.85, 0.90, True, None, 0.70, 0.05, "correct"),   # passes
    ("mx", "multi", 0.85, 0.90, True, None, 0.70, None, "wrong"),     # no rival: passes any margin
    ("mx", "multi", 0.85, 0.90, True, None, 0.70, 0.005, "wrong"),    # served then; margin 0.01 refuses
    ("mx", "multi", 0.85, 0.90, False, None, 0.40, 0.20, None),       # under the floor
    ("mx", "multi", 0.85, 0.82, False, None, None, None, None),       # nothing past the cosine gate
    ("mx", "multi", 0.80, 0.90, False, "negation", 0.70, 0.05, None), # a guard blocked it
    ("mx", "multi", 0.80, 0.95, True, None, 0.45, 0.10, "correct"),   # served under an older, lower floor
    ("old", "", 0.85, 0.90, False, None, None, None, None),           # written before migration 0003
    ("cos", "cosine", 0.85, 0.90, True, None, None, None, "correct"),
]
RULES = (queries.MultiRule("mx", 0.5, 0.01), queries.MultiRule("old", 0.5, 0.01))


@pytest.fixture(scope="module")
def multi_seeded(seeded):
    client, filters, *_ = seeded
    experiment_id = f"dash-multi-{uuid.uuid4().hex[:8]}"
    ts_ms = filters.parameters()["end_ms"] - 120_000
    names = ["event_type", "request_id", "ts_ms", "namespace", "experiment_id", "arm", "decision", "hit",
             "threshold", "similarity", "guard", "similarity_mode", "score", "score_margin"]
    events, feedback = [], []
    for i, (arm, mode, threshold, sim, hit, guard, score, margin, verdict) in enumerate(MULTI_ROWS):
        rid = f"{experiment_id}-{i}"
        events.append(["decision", rid, ts_ms + i, "default", experiment_id, arm, "hit" if hit else "miss", hit,
                       threshold, sim, guard, mode, score, margin])
        if verdict:
            feedback.append([1, rid, verdict, ts_ms + 1000 + i, "test"])
    client.insert("events_raw", events, column_names=names)
    client.insert("feedback_raw", feedback, column_names=["schema_version", "request_id", "verdict", "ts_ms", "source"])
    return client, queries.Filters(experiment_id, filters.start, filters.end)


def _by_bin(df, arm):
    return df[df["arm"] == arm].set_index("similarity_milli")


def test_similarity_histogram_applies_the_multi_rule(multi_seeded):
    client, filters = multi_seeded
    hist = queries.similarity_histogram(client, filters, RULES)
    mx = _by_bin(hist, "mx")
    assert mx.loc[900, ["decisions", "hits", "guard_blocks", "multi_blocks"]].tolist() == [5, 3, 1, 2]
    assert mx.loc[820, "multi_blocks"] == 1 and mx.loc[950, "multi_blocks"] == 1
    assert whatif.replay_floor(hist[hist["arm"] == "mx"]) == pytest.approx(0.80)
    for arm in ("old", "cos"):  # not logged in multi mode: the plain cosine reading
        rows = hist[hist["arm"] == arm]
        assert rows["multi_blocks"].sum() == 0 and whatif.replay_floor(rows) is None
    plain = queries.similarity_histogram(client, filters)  # no rules: every arm read as cosine
    assert plain["multi_blocks"].sum() == 0 and plain["multi_min_threshold"].isna().all()
    assert plain["decisions"].sum() == hist["decisions"].sum() == len(MULTI_ROWS)


def test_labelled_similarity_keeps_only_hits_the_rule_still_serves(multi_seeded):
    client, filters = multi_seeded
    plain = _by_bin(queries.labelled_similarity(client, filters), "mx")
    ruled = _by_bin(queries.labelled_similarity(client, filters, RULES), "mx")
    assert plain.loc[900, ["correct", "wrong"]].tolist() == [1, 2] and plain.loc[950, "correct"] == 1
    assert ruled.loc[900, ["correct", "wrong"]].tolist() == [1, 1] and 950 not in ruled.index
    assert _by_bin(queries.labelled_similarity(client, filters, RULES), "cos").loc[900, "correct"] == 1


def test_multi_whatif_from_the_warehouse_differs_from_the_cosine_reading(multi_seeded):
    client, filters = multi_seeded
    mx = lambda df: df[df["arm"] == "mx"]
    ruled = whatif.threshold_table(mx(queries.similarity_histogram(client, filters, RULES)),
                                   mx(queries.labelled_similarity(client, filters, RULES)), [0.80, 0.90])
    plain = whatif.threshold_table(mx(queries.similarity_histogram(client, filters)),
                                   mx(queries.labelled_similarity(client, filters)), [0.80, 0.90])
    ruled, plain = ruled.set_index("threshold"), plain.set_index("threshold")
    assert (ruled.at[0.90, "est_hits"], plain.at[0.90, "est_hits"]) == (2, 5)
    assert (ruled.at[0.90, "labelled"], ruled.at[0.90, "wrong"]) == (2, 1)
    assert ruled["replayable"].all()
    below = whatif.threshold_table(mx(queries.similarity_histogram(client, filters, RULES)),
                                   mx(queries.labelled_similarity(client, filters, RULES)), [0.79])
    assert not below.iloc[0]["replayable"] and not below.iloc[0]["supported"]


def test_multi_margin_histogram_feeds_the_margin_whatif(multi_seeded):
    client, filters = multi_seeded
    margins = queries.multi_margin_histogram(client, filters, RULES)
    assert set(margins["arm"]) == {"mx"}  # "old" has no multi rows
    rows = {(None if pd.isna(m) else int(m)): (d, c, w) for m, d, c, w in
            margins[["margin_milli", "decisions", "correct", "wrong"]].itertuples(index=False)}
    assert rows == {None: (1, 0, 1), 5: (1, 0, 1), 50: (1, 1, 0)}
    table = whatif.margin_table(margins, 7, [0.005, 0.01]).set_index("answer_margin")
    assert table["est_hits"].to_dict() == {0.005: 3, 0.01: 2}
    assert table["wrong"].to_dict() == {0.005: 2, 0.01: 1}
    assert queries.multi_margin_histogram(client, filters, ()).empty


def test_multi_score_histogram_feeds_the_floor_and_margin_tuning(multi_seeded):
    client, filters = multi_seeded
    hist = queries.multi_score_histogram(client, filters, RULES)
    assert set(hist["arm"]) == {"mx", "old"}  # only arms that are multi now; "cos" is not
    mx = hist[hist["arm"] == "mx"]
    rows = {(None if pd.isna(s) else int(s), None if pd.isna(m) else int(m)): (d, v, c, w) for s, m, d, v, c, w in
            mx[["score_milli", "margin_milli", "decisions", "servable", "correct", "wrong"]].itertuples(index=False)}
    assert rows == {(700, 50): (2, 1, 1, 0),  # the guard-blocked one is not servable
                    (700, None): (1, 1, 0, 1), (700, 5): (1, 1, 0, 1), (400, 200): (1, 1, 0, 0),
                    (None, None): (1, 0, 0, 0), (450, 100): (1, 1, 1, 0)}
    old = hist[hist["arm"] == "old"]  # written before migration 0003: counted, never servable
    assert old["decisions"].sum() == 1 and old["servable"].sum() == 0 and old["score_milli"].isna().all()
    assert set(mx["config_version"]) == {0}
    # At the arm's current floor / margin and the logged cosine gates, the floor / margin replay
    # agrees with the threshold what-if (ruled est_hits 2, labelled 2, wrong 1 at 0.80 and 0.90).
    table = whatif.multi_table(mx, [0.5], [0.01], lowest_floor=0.5, lowest_margin=0.01).iloc[0]
    assert (table["decisions"], table["est_hits"], table["labelled"], table["wrong"]) == (7, 2, 2, 1)
    assert queries.multi_score_histogram(client, filters, ()).empty


# -- per user (dashboard.control.ratio): the delta method's sums computed in ClickHouse ---

def test_unit_statistics_match_the_per_user_sums(warehouse, ch_settings):
    """Three users across two arms and two minutes, one request re-sent (FINAL counts it
    once), one event without a unit id (a user of its own), labels on some hits."""
    import numpy as np

    from cache_core.chclient import connect
    from dashboard.control import processing
    from dashboard.control.ratio import RatioStat

    client = connect(ch_settings)
    experiment_id = f"dash-u-{uuid.uuid4().hex[:8]}"
    t0 = (int(pd.Timestamp.now(tz="UTC").timestamp()) // 60 - 5) * 60_000
    # (request, unit, arm, minute, hit)
    decisions = [("r1", "u1", "control", 0, True), ("r2", "u1", "control", 0, False), ("r3", "u1", "control", 1, True),
                 ("r4", "u2", "control", 1, False), ("r5", "u3", "treatment", 0, True), ("r6", "u3", "treatment", 1, True),
                 ("r7", "", "treatment", 1, False)]
    names = ["event_type", "request_id", "ts_ms", "namespace", "experiment_id", "arm", "unit_id", "decision", "hit"]
    rows = [["decision", f"{experiment_id}-{r}", t0 + m * 60_000 + i, "default", experiment_id, arm, u,
             "hit" if hit else "miss", hit] for i, (r, u, arm, m, hit) in enumerate(decisions)]
    client.insert("events_raw", rows + rows[:1], column_names=names)  # r1 twice
    client.insert("feedback_raw", [[1, f"{experiment_id}-r1", "wrong", t0 + 9, "t"], [1, f"{experiment_id}-r3", "correct", t0 + 9, "t"],
                                   [1, f"{experiment_id}-r5", "correct", t0 + 9, "t"]],
                  column_names=["schema_version", "request_id", "verdict", "ts_ms", "source"])
    start = pd.Timestamp(t0, unit="ms", tz="UTC").to_pydatetime()
    filters = queries.Filters(experiment_id, start, start + timedelta(minutes=10))
    stats = processing.ratio_stats(queries.unit_stats(client, filters))
    assert stats["control"] == RatioStat.from_units([3, 1], [2, 0])  # fourth moments too: (3^4 + 1, ...)
    assert stats["control"].fourth == (82.0, 54.0, 36.0, 24.0, 16.0)
    assert stats["treatment"] == RatioStat.from_units([2, 1], [2, 0])
    labels = processing.ratio_stats(queries.unit_false_hits(client, filters))
    assert labels["control"] == RatioStat.from_units([2], [1]) and labels["treatment"] == RatioStat.from_units([1], [0])
    paths = processing.cumulative_unit_paths(queries.unit_path(client, filters, 60), ["control", "treatment"])
    # the looks carry second moments only (the mSPRT reads no degrees of freedom)
    assert paths["control"] == [RatioStat.from_units([2], [1], fourth=False),
                                RatioStat.from_units([3, 1], [2, 0], fourth=False)]
    assert paths["treatment"] == [RatioStat.from_units([1], [1], fourth=False),
                                  RatioStat.from_units([2, 1], [2, 0], fourth=False)]
    assert np.isclose(paths["control"][-1].rate, 0.5)
    client.close()


def test_solicited_verdicts_weighted_apart_from_unasked_ones(warehouse, ch_settings):
    """Hits the service asked about (feedback_requested at feedback_prob) weigh 1 / feedback_prob, per
    user; an unasked verdict stays out; an unanswered request counts in the response rate only."""
    from cache_core.chclient import connect
    from dashboard.control import processing
    from dashboard.control.ratio import RatioStat

    client = connect(ch_settings)
    experiment_id = f"dash-s-{uuid.uuid4().hex[:8]}"
    t0 = (int(pd.Timestamp.now(tz="UTC").timestamp()) // 60 - 5) * 60_000
    # (request, unit, requested, prob, verdict)
    hits = [("r1", "u1", True, 0.5, "wrong"), ("r2", "u1", True, 0.5, "correct"), ("r3", "u2", True, 0.25, "correct"),
            ("r4", "u2", True, 0.25, None), ("r5", "u1", False, 0.5, "wrong")]
    names = ["event_type", "request_id", "ts_ms", "namespace", "experiment_id", "arm", "unit_id", "decision", "hit",
             "feedback_requested", "feedback_prob"]
    client.insert("events_raw", [["decision", f"{experiment_id}-{r}", t0 + i, "default", experiment_id, "control", u,
                                  "hit", True, asked, p] for i, (r, u, asked, p, _) in enumerate(hits)],
                  column_names=names)
    client.insert("feedback_raw", [[1, f"{experiment_id}-{r}", v, t0 + 9, "user"] for r, _, _, _, v in hits if v],
                  column_names=["schema_version", "request_id", "verdict", "ts_ms", "source"])
    start = pd.Timestamp(t0, unit="ms", tz="UTC").to_pydatetime()
    filters = queries.Filters(experiment_id, start, start + timedelta(minutes=10))
    stats = processing.ratio_stats(queries.unit_solicited_false_hits(client, filters))
    assert stats["control"] == RatioStat.from_units([4.0, 4.0], [2.0, 0.0])  # u1: 2 + 2, one wrong; u2: 4
    response = queries.solicited_response(client, filters).set_index("arm").loc["control"]
    assert (response["requested"], response["answered"]) == (4, 3)
    assert (response["requested_weight"], response["answered_weight"], response["wrong_weight"]) == (12.0, 8.0, 2.0)
    # the users' own reading still has every verdict (r5 unasked included): 4 labelled hits, 2 wrong
    assert processing.ratio_stats(queries.unit_false_hits(client, filters))["control"].sum_x == 4
    client.close()


def test_user_and_shadow_verdicts_stay_apart(seeded):
    """A shadow verdict on a request users also judged replaces nothing; feedback_agg's shadow rows
    never reach the users' false-hit rate; near-miss verdicts read with the miss's similarity."""
    client, filters, *_ = seeded
    experiment_id = f"dash-shadow-{uuid.uuid4().hex[:8]}"
    ts_ms = filters.parameters()["end_ms"] - 120_000
    names = ["event_type", "request_id", "ts_ms", "namespace", "experiment_id", "arm", "decision", "hit",
             "threshold", "similarity"]
    rows = [("h1", "hit", 0.93, "correct", "wrong"), ("h2", "hit", 0.95, None, "correct"),
            ("m1", "miss", 0.853, None, "wrong"), ("m2", "miss", 0.857, None, "correct"),
            ("m3", "miss", 0.81, None, "wrong")]
    client.insert("events_raw", [["decision", f"{experiment_id}-{rid}", ts_ms + i, "default", experiment_id, "a",
                                  decision, decision == "hit", 0.9, sim]
                                 for i, (rid, decision, sim, _, _) in enumerate(rows)], column_names=names)
    columns = ["schema_version", "request_id", "verdict", "ts_ms", "source"]
    client.insert("feedback_raw", [[1, f"{experiment_id}-{rid}", user, ts_ms + 1000, "user"]
                                   for rid, _, _, user, _ in rows if user], column_names=columns)
    client.insert("shadow_feedback_raw", [[1, f"{experiment_id}-{rid}", shadow, ts_ms + 2000, "shadow"]
                                          for rid, _, _, _, shadow in rows], column_names=columns)
    start = pd.Timestamp(ts_ms // 60_000 * 60_000, unit="ms", tz="UTC").to_pydatetime()
    agg = ["window_start", "window_end", "experiment_id", "arm", "variant", "namespace", "config_version",
           "intent_cluster", "source", "correct", "wrong", "emitted_at_ms"]
    client.insert("feedback_agg", [[start, start + timedelta(minutes=1), experiment_id, "a", "base", "default", 1,
                                    -1, source, correct, wrong, 1] for source, correct, wrong in
                                   (("user", 1, 0), ("shadow", 1, 1), ("", 3, 1))], column_names=agg)
    mine = queries.Filters(experiment_id, filters.start, filters.end)
    users = queries.false_hits(client, mine)
    assert users[["correct", "wrong"]].sum().tolist() == [4, 1]        # '' (before 0007) counts as users'
    shadow = queries.shadow_verdicts(client, mine)
    by = shadow.groupby(["decision", "similarity_milli"])[["correct", "wrong"]].sum()
    assert by.loc[("hit", 930)].tolist() == [0, 1] and by.loc[("hit", 950)].tolist() == [1, 0]
    assert by.loc[("miss", 850)].tolist() == [1, 1] and by.loc[("miss", 810)].tolist() == [0, 1]
    strata = queries.shadow_strata(client, mine)  # hits per hour and the checked ones: misses never count
    assert strata[["hits", "checked", "wrong"]].sum().tolist() == [2, 2, 1] and set(strata["arm"]) == {"a"}
    labels = client.query("SELECT verdict FROM feedback_raw FINAL WHERE request_id = {r:String}",
                          parameters={"r": f"{experiment_id}-h1"}).result_rows
    assert labels == [("correct",)]                                       # the user's, not replaced
    fine = queries.shadow_labelled(client, mine)                          # the what-if's bins: 0.001
    at = fine.set_index(["decision", "similarity_milli"])[["correct", "wrong"]]
    assert at.loc[("miss", 853)].tolist() == [0, 1] and at.loc[("miss", 857)].tolist() == [1, 0]
    assert at.loc[("hit", 930)].tolist() == [0, 1] and len(fine) == 5
    canary = queries.canary_shadow_stats(client, experiment_id, "a", ts_ms - 1)
    assert canary[["correct", "wrong"]].sum().tolist() == [1, 1]            # hits only, not the near-misses


def test_judge_versions_from_decisions_and_both_kinds_of_verdicts(seeded):
    client, filters, *_ = seeded
    experiment_id = f"dash-judge-{uuid.uuid4().hex[:8]}"
    ts_ms = filters.parameters()["end_ms"] - 120_000
    names = ["event_type", "request_id", "ts_ms", "namespace", "experiment_id", "arm", "decision", "hit",
             "threshold", "similarity", "judge_version", "judge_probability", "judge_ms"]
    rows = [("a", "hit", None, None, "correct", None), ("a", "miss", None, None, None, None),
            ("j", "hit", "v2", 4.0, "wrong", "correct"), ("j", "hit", "v2", 6.0, "correct", "wrong"),
            ("j", "miss", "v2", 8.0, None, None), ("j", "hit", "v3", 2.0, None, "correct")]
    client.insert("events_raw", [["decision", f"{experiment_id}-{i}", ts_ms + i, "default", experiment_id, arm,
                                  decision, decision == "hit", 0.9, 0.95, version, 0.7 if version else None, ms]
                                 for i, (arm, decision, version, ms, _, _) in enumerate(rows)], column_names=names)
    columns = ["schema_version", "request_id", "verdict", "ts_ms", "source"]
    for table, at, source in (("feedback_raw", 4, "user"), ("shadow_feedback_raw", 5, "shadow")):
        client.insert(table, [[1, f"{experiment_id}-{i}", row[at], ts_ms + 1000, source]
                              for i, row in enumerate(rows) if row[at]], column_names=columns)
    df = queries.judge_versions(client, queries.Filters(experiment_id, filters.start, filters.end))
    by = df.set_index(["arm", "judge_version"])
    assert by.loc[("a", ""), ["requests", "hits", "judged", "user_correct", "shadow_correct"]].tolist() == [2, 1, 0, 1, 0]
    assert pd.isna(by.loc[("a", ""), "judge_ms_mean"])
    v2 = by.loc[("j", "v2")]
    assert [v2["requests"], v2["hits"], v2["judged"]] == [3, 2, 3] and v2["judge_ms_mean"] == pytest.approx(6.0)
    assert [v2["user_correct"], v2["user_wrong"], v2["shadow_correct"], v2["shadow_wrong"]] == [1, 1, 1, 1]
    assert by.loc[("j", "v3"), "shadow_correct"] == 1
    # By judge probability (tuning_judge): hits and judge vetoes only; a veto's shadow verdict apart.
    client.insert("events_raw", [["decision", f"{experiment_id}-veto", ts_ms + 50, "default", experiment_id, "j",
                                  "miss", False, 0.9, 0.95, "v2", 0.4, 5.0, "judge"]], column_names=names + ["guard"])
    client.insert("shadow_feedback_raw", [[1, f"{experiment_id}-veto", "wrong", ts_ms + 1000, "shadow"]],
                  column_names=columns)
    probs = queries.judge_probabilities(client, queries.Filters(experiment_id, filters.start, filters.end))
    at = probs.set_index(["arm", "judge_version", "probability_milli"])
    hits = at.loc[("j", "v2", 700)]
    assert [hits["decisions"], hits["hits"], hits["user_correct"], hits["user_wrong"], hits["shadow_hit_correct"],
            hits["shadow_hit_wrong"], hits["shadow_miss_wrong"]] == [2, 2, 1, 1, 1, 1, 0]  # the unjudged miss: out
    veto = at.loc[("j", "v2", 400)]
    assert [veto["decisions"], veto["hits"], veto["shadow_miss_wrong"], veto["user_wrong"]] == [1, 0, 1, 0]
    assert ("a", "") not in {(a, v) for a, v, _ in at.index}                 # no judge: not there


def test_threshold_sources_per_error_bounded_arm_and_level(seeded):
    from dashboard.control import verdicts

    client, filters, *_ = seeded
    experiment_id = f"dash-src-{uuid.uuid4().hex[:8]}"
    seed.insert_threshold_sources(client, experiment_id, filters.parameters()["end_ms"] - 120_000)
    df = queries.threshold_sources(client, queries.Filters(experiment_id, filters.start, filters.end))
    assert set(df["arm"]) == {"b"}                                     # the global arm logs no source
    by = df.set_index("threshold_source")
    assert by.loc["static", ["requests", "hits", "user_wrong", "shadow_correct"]].tolist() == [2, 1, 1, 0]
    assert by.loc["cluster", ["requests", "hits", "user_correct", "shadow_correct", "shadow_wrong"]].tolist() == \
        [3, 2, 1, 1, 1]                                                # the near-miss's shadow verdict: not a hit's
    table = verdicts.threshold_source_frame(df).set_index("threshold_source")
    assert table.index.tolist() == ["entry", "cluster", "arm", "static"]
    assert table["share"].tolist() == pytest.approx([1 / 7, 3 / 7, 1 / 7, 2 / 7])
    assert table.loc["cluster", "shadow_false_hit_rate"] == pytest.approx(0.5)
    assert table.loc["static", "user_false_hit_rate"] == 1.0 and pd.isna(table.loc["static", "shadow_false_hit_rate"])
