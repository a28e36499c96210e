"""udfs: the pure functions, then the same inputs through real PyFlink row and pandas UDFs."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from udfs import buckets, decay
from udfs.errors import DATA_ERRORS

# (similarity, entry_age_s, entry_ttl_s, latency_ms): normal rows and every edge case.
EDGE_ROWS = [
    (0.9, 0.0, 3600.0, 0.5),        # age 0: no decay
    (0.9, 3600.0, 3600.0, 1.0),     # exactly max age: one full factor; exactly a bound
    (0.9, 3601.0, 3600.0, 5000.0),  # beyond max age: expired, 0.0
    (None, 10.0, None, None),       # None in -> None out / "none"
    (1.5, 10.0, 100.0, 7000.0),     # similarity out of range; overflow latency
    (0.8, -1.0, 100.0, -3.0),       # negative age and latency: data errors
    (0.95, 1200.0, 3600.0, 20.0),   # mid
    (-0.2, 2400.0, 3600.0, 2.0),    # negative similarity is legal; late
    (1.0000001, 100.0, 100.0, 1.5), # rounding above 1 is clamped
    (0.7, None, 60.0, 0.0),         # no entry
]


@pytest.fixture(autouse=True)
def _fresh_counter():
    DATA_ERRORS.reset()
    yield
    DATA_ERRORS.reset()


class TestSimDecay:
    def test_formula(self):
        assert decay.sim_decay(0.9, 1800) == pytest.approx(0.9 * 0.85 ** 0.5)

    def test_age_zero_keeps_similarity(self):
        assert decay.sim_decay(0.9, 0) == pytest.approx(0.9)

    def test_exactly_max_age_is_one_factor(self):
        assert decay.sim_decay(0.9, 3600) == pytest.approx(0.9 * 0.85)

    def test_beyond_max_age_is_expired(self):
        assert decay.sim_decay(0.9, 3600.001) == 0.0

    def test_custom_factor_and_age(self):
        assert decay.sim_decay(1.0, 10, decay_factor=0.5, max_age_s=10) == pytest.approx(0.5)

    @pytest.mark.parametrize("sim,age", [(None, 1.0), (0.5, None), (None, None)])
    def test_none_in_none_out_without_error(self, sim, age):
        assert decay.sim_decay(sim, age) is None
        assert DATA_ERRORS.total() == 0

    @pytest.mark.parametrize("sim", [1.5, -1.01, float("nan")])
    def test_out_of_range_similarity_is_counted(self, sim):
        assert decay.sim_decay(sim, 10) is None
        assert DATA_ERRORS.get(decay.ERR_SIMILARITY) == 1

    def test_negative_age_is_counted(self):
        assert decay.sim_decay(0.5, -1) is None
        assert DATA_ERRORS.get(decay.ERR_AGE) == 1

    def test_rounding_above_one_is_clamped(self):
        assert decay.sim_decay(1.0000001, 0) == 1.0
        assert DATA_ERRORS.total() == 0

    def test_listener_sees_errors(self):
        seen = []
        listener = lambda reason, n: seen.append((reason, n))  # noqa: E731
        DATA_ERRORS.add_listener(listener)
        try:
            decay.sim_decay(2.0, 1)
        finally:
            DATA_ERRORS.remove_listener(listener)
        assert seen == [(decay.ERR_SIMILARITY, 1)]

    def test_array_matches_scalar(self):
        sims = [r[0] for r in EDGE_ROWS]
        ages = [r[1] for r in EDGE_ROWS]
        expected = [decay.sim_decay(s, a) for s, a in zip(sims, ages)]
        scalar_errors = DATA_ERRORS.total()
        got = decay.sim_decay_array(np.array(sims, dtype=float), np.array(ages, dtype=float))
        assert DATA_ERRORS.total() == 2 * scalar_errors
        assert _nan_to_none(got) == pytest.approx(expected)


class TestLifetimeBucket:
    @pytest.mark.parametrize("age,ttl,bucket", [
        (0, 90, "fresh"), (29.9, 90, "fresh"), (30, 90, "mid"), (59.9, 90, "mid"),
        (60, 90, "late"), (89.9, 90, "late"), (90, 90, "expired"), (500, 90, "expired"),
        (None, 90, "none"), (10, None, "none"), (None, None, "none"),
    ])
    def test_buckets(self, age, ttl, bucket):
        assert buckets.lifetime_bucket(age, ttl) == bucket

    @pytest.mark.parametrize("age,ttl", [(-1, 90), (1, 0), (1, -5)])
    def test_invalid_is_none_and_counted(self, age, ttl):
        assert buckets.lifetime_bucket(age, ttl) == "none"
        assert DATA_ERRORS.get(buckets.ERR_LIFETIME) == 1

    def test_array_matches_scalar(self):
        ages = [r[1] for r in EDGE_ROWS]
        ttls = [r[2] for r in EDGE_ROWS]
        expected = [buckets.lifetime_bucket(a, t) for a, t in zip(ages, ttls)]
        got = buckets.lifetime_bucket_array(np.array(ages, dtype=float), np.array(ttls, dtype=float))
        assert list(got) == expected


class TestSimilarityBucket:
    @pytest.mark.parametrize("sim,edge", [
        (0.0, 0.0), (0.049, 0.0), (0.05, 0.05), (0.15, 0.15), (0.849, 0.8), (0.85, 0.85),
        (0.999, 0.95), (1.0, 0.95), (-0.01, -0.05), (-1.0, -1.0),
    ])
    def test_lower_edges(self, sim, edge):
        assert buckets.similarity_bucket(sim) == pytest.approx(edge)

    def test_none(self):
        assert buckets.similarity_bucket(None) is None

    def test_custom_width(self):
        assert buckets.similarity_bucket(0.37, width=0.1) == pytest.approx(0.3)

    def test_bad_width(self):
        with pytest.raises(ValueError, match="width"):
            buckets.similarity_bucket(0.5, width=0)


class TestPrecisionBucket:
    @pytest.mark.parametrize("agree,checks,bucket", [
        (0, 0, "unchecked"), (None, 5, "unchecked"), (8, 10, "lt_0.90"), (9, 10, "0.90-0.95"),
        (96, 100, "0.95-0.99"), (99, 100, "ge_0.99"), (10, 10, "ge_0.99"),
    ])
    def test_buckets(self, agree, checks, bucket):
        assert buckets.precision_bucket(agree, checks) == bucket

    def test_more_agreements_than_checks(self):
        with pytest.raises(ValueError, match="agreements"):
            buckets.precision_bucket(11, 10)


class TestLatency:
    def test_bounds_are_log_spaced_and_increasing(self):
        bounds = buckets.LATENCY_BOUNDS_MS
        assert list(bounds) == sorted(bounds) and bounds[0] == 1 and bounds[-1] == 5000
        assert buckets.LATENCY_BUCKETS == len(bounds) + 1

    @pytest.mark.parametrize("ms,index", [
        (0, 0), (1, 0), (1.01, 1), (2, 1), (49.9, 5), (50, 5), (5000, 11), (5000.1, 12), (1e9, 12),
    ])
    def test_index(self, ms, index):
        assert buckets.latency_bucket_index(ms) == index

    def test_none_and_negative(self):
        assert buckets.latency_bucket_index(None) is None
        assert buckets.latency_bucket_index(-1) is None
        assert DATA_ERRORS.get(buckets.ERR_LATENCY) == 1

    def test_histogram_and_merge(self):
        hist = buckets.latency_histogram([0.5, 1.5, 1.7, None, 9000])
        assert hist[:2] == [1, 2] and hist[-1] == 1 and sum(hist) == 4
        merged = buckets.merge_histograms([hist, hist])
        assert sum(merged) == 8 and merged[1] == 4

    def test_merge_rejects_wrong_length(self):
        with pytest.raises(ValueError, match="buckets"):
            buckets.merge_histograms([[1, 2]])

    def test_quantiles(self):
        hist = [0] * buckets.LATENCY_BUCKETS
        hist[3] = 100  # all in (5, 10]
        assert buckets.histogram_quantile(hist, 0.5) == pytest.approx(7.5)
        assert buckets.histogram_quantile(hist, 1.0) == pytest.approx(10.0)
        hist[-1] = 100  # half overflow -> highest finite bound
        assert buckets.histogram_quantile(hist, 0.99) == 5000.0
        assert buckets.histogram_quantile([0] * buckets.LATENCY_BUCKETS, 0.5) is None

    def test_quantile_of_first_bucket_starts_at_zero(self):
        hist = [10] + [0] * (buckets.LATENCY_BUCKETS - 1)
        assert buckets.histogram_quantile(hist, 0.5) == pytest.approx(0.5)

    def test_bad_quantile(self):
        with pytest.raises(ValueError, match="q must"):
            buckets.histogram_quantile([1] * buckets.LATENCY_BUCKETS, 1.5)

    def test_array_matches_scalar(self):
        values = [r[3] for r in EDGE_ROWS]
        expected = [buckets.latency_bucket_index(v) for v in values]
        got = buckets.latency_bucket_index_array(np.array(values, dtype=float))
        assert [None if math.isnan(x) else int(x) for x in got] == expected


def _nan_to_none(values) -> list:
    return [None if (v is None or (isinstance(v, float) and math.isnan(v))) else v for v in values]


@pytest.fixture
def _restored_environ():
    """An in-process PyFlink job runs its Python workers in loopback mode and leaves
    PYFLINK_GATEWAY_DISABLED / PYTHON_LOOPBACK_SERVER_ADDRESS in os.environ; a job that a later
    fixture spawns would inherit them and refuse to start its own gateway."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_flink_row_and_pandas_udfs_equal_plain_functions(_restored_environ):
    """Every registered UDF, run by a real PyFlink job (Python worker), equals the plain function."""
    from pyflink.table import DataTypes, EnvironmentSettings, TableEnvironment

    from udfs.flink import register_all

    t_env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    t_env.get_config().set("parallelism.default", "1")
    names = register_all(t_env)
    assert {"sim_decay", "sim_decay_vec", "lifetime_bucket_vec", "latency_bucket_vec"} <= set(names)
    rows = [(i, *r) for i, r in enumerate(EDGE_ROWS)]
    schema = DataTypes.ROW([DataTypes.FIELD(n, t) for n, t in [
        ("id", DataTypes.INT()), ("sim", DataTypes.DOUBLE()), ("age", DataTypes.DOUBLE()),
        ("ttl", DataTypes.DOUBLE()), ("lat", DataTypes.DOUBLE())]])
    t_env.create_temporary_view("edge", t_env.from_elements(rows, schema))
    result = t_env.execute_sql(
        "SELECT id, sim_decay(sim, age), sim_decay_vec(sim, age), lifetime_bucket(age, ttl),"
        " lifetime_bucket_vec(age, ttl), latency_bucket(lat), latency_bucket_vec(lat),"
        " similarity_bucket(sim), precision_bucket(CAST(id AS BIGINT), CAST(9 AS BIGINT)) FROM edge")
    with result.collect() as it:
        got = {row[0]: tuple(row[1:]) for row in it}
    assert len(got) == len(EDGE_ROWS)
    for i, (sim, age, ttl, lat) in enumerate(EDGE_ROWS):
        row_decay, vec_decay, row_life, vec_life, row_lat, vec_lat, sim_b, prec_b = got[i]
        expected_decay = decay.sim_decay(sim, age)
        for value in (row_decay, vec_decay):
            assert (value is None) == (expected_decay is None), (i, value)
            if expected_decay is not None:
                assert value == pytest.approx(expected_decay)
        assert row_life == vec_life == buckets.lifetime_bucket(age, ttl), i
        assert row_lat == vec_lat == buckets.latency_bucket_index(lat), i
        assert sim_b == (None if sim is None else pytest.approx(buckets.similarity_bucket(sim))), i
        assert prec_b == (buckets.precision_bucket(i, 9) if i <= 9 else None), i
