"""The attribution job end to end: real broker -> PyFlink mini-cluster -> real warehouse."""
from __future__ import annotations

import time
import uuid

import pytest

from infra.runtime import wait_until
from tests.fixtures.flink import FAST_JOB_ENV, job_env
from tests.integration.attribution_data import (
    expected_totals, heartbeats, make_events, produce, warehouse_totals,
)

pytestmark = pytest.mark.integration

WINDOW_S = int(FAST_JOB_ENV["SCACHE_FLINK__WINDOW_S"])
RESULT_TIMEOUT_S = 180.0


def _raw_count(client, experiment_ids: list[str]) -> int:
    return client.query(
        "SELECT count() FROM events_raw FINAL WHERE experiment_id IN {ids:Array(String)}",
        parameters={"ids": experiment_ids}).result_rows[0][0]


def _comparable(totals: dict) -> dict:
    return {key: {**t, "decayed_hits": round(t["decayed_hits"], 6)} for key, t in totals.items()}


def test_window_totals_per_arm_match_python_reference(kafka_settings, ch_settings, ch_client,
                                                      flink_job_factory):
    started = time.monotonic()
    job = flink_job_factory(job_env(kafka_settings, ch_settings))
    startup_s = time.monotonic() - started

    suffix = f"-{uuid.uuid4().hex[:8]}"
    base_ms = int(time.time() * 1000) - 60_000
    events = make_events(base_ms, WINDOW_S, suffix=suffix)
    # Heartbeats far past the events close every window on every partition.
    closing = heartbeats(base_ms + (2 * WINDOW_S + 10) * 1000, kafka_settings.events_partitions)
    produce(kafka_settings.bootstrap_servers, kafka_settings.events_topic, events, closing)
    produced = time.monotonic()

    experiment_ids = sorted({e.experiment_id for e in events})
    expected = _comparable(expected_totals(events))
    assert len(expected) == 3 and all(t["requests"] for t in expected.values())

    def done() -> bool:
        return (_comparable(warehouse_totals(ch_client, experiment_ids)) == expected
                and _raw_count(ch_client, experiment_ids) == len(events))

    try:
        wait_until(done, RESULT_TIMEOUT_S, "window_agg totals", interval_s=1.0,
                   proc=job.proc, log_path=job.log_path)
    except TimeoutError:
        got = _comparable(warehouse_totals(ch_client, experiment_ids))
        assert got == expected  # shows the difference
        assert _raw_count(ch_client, experiment_ids) == len(events)
        raise
    print(f"job startup {startup_s:.1f}s, events -> warehouse {time.monotonic() - produced:.1f}s")

    # Re-emission replaces, never doubles: FINAL keeps one row per window x dimensions.
    dupes = ch_client.query(
        "SELECT count() FROM (SELECT window_start, experiment_id, arm, namespace, config_version,"
        " intent_cluster, index_kind, lifetime_bucket, count() AS n FROM window_agg FINAL"
        " WHERE experiment_id IN {ids:Array(String)} GROUP BY ALL HAVING n > 1)",
        parameters={"ids": experiment_ids}).result_rows[0][0]
    assert dupes == 0
