"""Flink wrappers of the pure UDFs: a row UDF for each, a pandas UDF for the hot path.

Row UDFs: sim_decay, lifetime_bucket, latency_bucket, similarity_bucket, precision_bucket.
Vectorised (pandas, Arrow batches): sim_decay_vec, lifetime_bucket_vec, latency_bucket_vec.
Data errors counted by the pure functions are forwarded to the Flink metric
``scache.udf_data_errors.<reason>`` of the function that found them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from pyflink.table import DataTypes, TableEnvironment
from pyflink.table.udf import FunctionContext, ScalarFunction, udf

from udfs import buckets, decay
from udfs.errors import DATA_ERRORS


def _floats(series: pd.Series) -> np.ndarray:
    """A pandas UDF argument as float64, nulls as NaN (what the *_array functions expect)."""
    return series.to_numpy("float64", na_value=float("nan"))


class _CountingFunction(ScalarFunction):
    """Registers a DATA_ERRORS listener that turns this function's errors into Flink counters."""

    error_prefix = ""

    def open(self, function_context: FunctionContext) -> None:
        group = function_context.get_metric_group().add_group("scache").add_group("udf_data_errors")
        counters: dict = {}

        def forward(reason: str, n: int) -> None:
            if not reason.startswith(self.error_prefix):
                return
            if reason not in counters:
                counters[reason] = group.counter(reason.replace(".", "_"))
            counters[reason].inc(n)

        self._listener = forward
        DATA_ERRORS.add_listener(forward)

    def close(self) -> None:
        DATA_ERRORS.remove_listener(getattr(self, "_listener", None))


class SimDecay(_CountingFunction):
    error_prefix = "sim_decay."

    def eval(self, similarity, age_s):
        return decay.sim_decay(similarity, age_s)


class SimDecayVec(_CountingFunction):
    error_prefix = "sim_decay."

    def eval(self, similarity: pd.Series, age_s: pd.Series) -> pd.Series:
        return pd.Series(decay.sim_decay_array(_floats(similarity), _floats(age_s)))


class LifetimeBucket(_CountingFunction):
    error_prefix = "lifetime_bucket."

    def eval(self, age_s, ttl_s):
        return buckets.lifetime_bucket(age_s, ttl_s)


class LifetimeBucketVec(_CountingFunction):
    error_prefix = "lifetime_bucket."

    def eval(self, age_s: pd.Series, ttl_s: pd.Series) -> pd.Series:
        return pd.Series(buckets.lifetime_bucket_array(
            _floats(age_s), _floats(ttl_s)))


class LatencyBucket(_CountingFunction):
    error_prefix = "latency_bucket."

    def eval(self, ms):
        return buckets.latency_bucket_index(ms)


class LatencyBucketVec(_CountingFunction):
    error_prefix = "latency_bucket."

    def eval(self, ms: pd.Series) -> pd.Series:
        index = buckets.latency_bucket_index_array(_floats(ms))
        # Object dtype with None: Flink's Arrow writer rejects pandas' nullable Int32 here.
        return pd.Series([None if np.isnan(i) else int(i) for i in index], dtype=object)


@udf(result_type=DataTypes.DOUBLE())
def similarity_bucket(sim):
    return buckets.similarity_bucket(sim)


@udf(result_type=DataTypes.STRING())
def precision_bucket(agreements, checks):
    return buckets.precision_bucket(agreements, checks)


ROW_UDFS = {
    "sim_decay": udf(SimDecay(), result_type=DataTypes.DOUBLE()),
    "lifetime_bucket": udf(LifetimeBucket(), result_type=DataTypes.STRING()),
    "latency_bucket": udf(LatencyBucket(), result_type=DataTypes.INT()),
    "similarity_bucket": similarity_bucket,
    "precision_bucket": precision_bucket,
}
PANDAS_UDFS = {
    "sim_decay_vec": udf(SimDecayVec(), result_type=DataTypes.DOUBLE(), func_type="pandas"),
    "lifetime_bucket_vec": udf(LifetimeBucketVec(), result_type=DataTypes.STRING(), func_type="pandas"),
    "latency_bucket_vec": udf(LatencyBucketVec(), result_type=DataTypes.INT(), func_type="pandas"),
}


def register_all(t_env: TableEnvironment) -> list[str]:
    """Register every UDF as a temporary system function; returns their SQL names."""
    for name, function in {**ROW_UDFS, **PANDAS_UDFS}.items():
        t_env.create_temporary_system_function(name, function)
    return sorted({**ROW_UDFS, **PANDAS_UDFS})
