"""dashboard.queries against the real embedded warehouse, on seeded rows."""
import uuid
from datetime import timedelta

import pytest

from cache_core.events import ControlMessage
from cache_core.experiments import load_experiments
from dashboard import control, queries
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
    at_current = control.whatif_hit_rate(hist, 0.80).set_index("arm")
    assert at_current.at["treatment", "est_hit_rate"] == at_current.at["treatment", "observed_hit_rate"] == 0.75
    assert control.whatif_hit_rate(hist, 0.85).set_index("arm").at["control", "est_hit_rate"] == 0.5


def test_parameters_are_not_sql(seeded):
    client, filters, *_ = seeded
    evil = queries.Filters("x' OR '1'='1", filters.start, filters.end)
    assert queries.arm_summary(client, evil).empty


def test_audit_rows_readable_by_queries(seeded):
    client, filters, experiment_id, tmp = seeded
    config = load_experiments(seed.experiments_file(tmp / "e.yaml", experiment_id))[experiment_id]
    new = control.with_threshold(config, "treatment", 0.77, "tester", at_ms=filters.parameters()["end_ms"] - 90_000)
    msg = ControlMessage(experiment=new, actor="tester", reason="seeded", ts_ms=new.updated_at_ms)
    control.record_change(client, msg, "treatment", 0.80, config.version)
    changes = queries.threshold_changes(client, filters)
    assert changes[["arm", "old_threshold", "new_threshold", "new_version"]].values.tolist() == [
        ["treatment", 0.80, 0.77, 2]]
    listed = queries.experiments(client).set_index("experiment_id")
    assert listed.at[experiment_id, "version"] == 2
    assert '"threshold":0.77' in listed.at[experiment_id, "config_json"]
