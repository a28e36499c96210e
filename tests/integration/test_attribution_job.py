"""The attribution job end to end: real broker -> PyFlink mini-cluster -> real warehouse.

A generated stream with known answers (out-of-order within the allowed lateness, late
events beyond it, duplicates of the at-least-once publisher, feedback after the decision,
a changed verdict, feedback outside the join bound) must make every row of window_agg,
late_events and feedback_agg equal a reference computed in plain Python from the same
events; a job killed mid-stream and restarted from its checkpoint must not double-count, and
neither may a warehouse that goes away under a running job and comes back.
"""
from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from cache_core.chclient import connect
from cache_core.events import CacheEvent, FeedbackEvent
from cache_core.settings import ClickHouseSettings
from infra.clickhouse.migrate import apply_migrations
from infra.clickhouse.warehouse import start_warehouse
from infra.runtime import free_port, wait_until
from jobs.attribution_job import latest_checkpoint
from tests.fixtures.flink import FAST_JOB_ENV, job_env
from tests.integration.attribution_data import (
    Heartbeating, expected_feedback, expected_late, expected_windows, heartbeats, jittered, make_events,
    produce, produce_feedback, warehouse_feedback, warehouse_late, warehouse_raw_scores, warehouse_windows,
)

pytestmark = pytest.mark.integration

WINDOW_S = int(FAST_JOB_ENV["SCACHE_FLINK__WINDOW_S"])
JOIN_S = 60
RESULT_TIMEOUT_S = 180.0


def _count(client, table: str, column: str, values: list[str]) -> int:
    return client.query(f"SELECT count() FROM {table} FINAL WHERE {column} IN {{v:Array(String)}}",
                        parameters={"v": values}).result_rows[0][0]


def _wait_equal(what: str, got, expected, job, beat: Callable[[], None] | None = None) -> None:
    """Until ``got() == expected``, calling ``beat()`` (a cache's heartbeats) before each look."""
    def arrived() -> bool:
        if beat is not None:
            beat()
        return got() == expected
    try:
        wait_until(arrived, RESULT_TIMEOUT_S, what, interval_s=1.0, proc=job.proc, log_path=job.log_path)
    except TimeoutError:
        log = job.log_path.read_text(errors="replace")
        # Shows the difference, and what the job went through (failovers, sink errors).
        assert got() == expected, f"{what}; flink restarts: {_flink_restarts(job)}; job log tail:\n{log[-2500:]}"
        raise


def _late_events(base_ms: int, suffix: str, n: int = 12) -> list[CacheEvent]:
    """Decisions for the first window, produced after it fired: beyond the allowed lateness."""
    return [CacheEvent(ts_ms=base_ms + 100 * i, experiment_id=("exp-a" if i % 2 else "exp-b") + suffix,
                       arm="control" if i % 2 else "only", unit_id=f"late{i}", decision="miss",
                       latency_ms=5.0) for i in range(n)]


def _feedback(events: list[CacheEvent], rng: random.Random) -> list[FeedbackEvent]:
    hits = [e for e in events if e.hit][:40]
    out = [FeedbackEvent(request_id=e.request_id, verdict=rng.choice(("correct", "wrong")),
                         ts_ms=e.ts_ms + rng.randrange(500, 5000), source="user") for e in hits]
    # A changed verdict (the later one counts), feedback on misses (no hit to join),
    # and feedback after the join bound (stored raw, not aggregated).
    out += [FeedbackEvent(request_id=f.request_id, verdict="wrong" if f.verdict == "correct" else "correct",
                          ts_ms=f.ts_ms + 1000, source="user") for f in out[:3]]
    out += [FeedbackEvent(request_id=e.request_id, verdict="wrong", ts_ms=e.ts_ms + 800, source="user")
            for e in events if not e.hit][:2]
    out.append(FeedbackEvent(request_id=hits[-1].request_id, verdict="wrong", source="user",
                             ts_ms=hits[-1].ts_ms + (JOIN_S + 60) * 1000))
    # Shadow checks on hits users also judged, and on a miss (a near-miss): counted apart, replacing none.
    out += [FeedbackEvent(request_id=e.request_id, verdict=rng.choice(("correct", "wrong")), source="shadow",
                          ts_ms=e.ts_ms + rng.randrange(500, 5000)) for e in hits[:12]]
    out += [FeedbackEvent(request_id=e.request_id, verdict="wrong", ts_ms=e.ts_ms + 900, source="shadow")
            for e in events if not e.hit][:2]
    return out


def test_every_aggregate_matches_python_reference(kafka_settings, ch_settings, ch_client, flink_job_factory):
    started = time.monotonic()
    job = flink_job_factory(job_env(kafka_settings, ch_settings, SCACHE_FLINK__FEEDBACK_JOIN_S=str(JOIN_S)))
    startup_s = time.monotonic() - started
    suffix = f"-{uuid.uuid4().hex[:8]}"
    base_ms = int(time.time() * 1000) - 60_000
    events = make_events(base_ms, WINDOW_S, suffix=suffix)
    duplicates = events[::17]
    # Heartbeats far past the events close every window on every partition.
    closing = heartbeats(base_ms + (2 * WINDOW_S + 10) * 1000, kafka_settings.events_partitions)
    produce(kafka_settings.bootstrap_servers, kafka_settings.events_topic,
            jittered(events, max_back_ms=1900) + duplicates, closing)
    produced = time.monotonic()
    experiment_ids = sorted({e.experiment_id for e in events})
    expected = expected_windows(events, WINDOW_S)
    assert len({k[1:3] for k in expected}) == 3 and len({k[3] for k in expected}) == 2

    beat = Heartbeating(kafka_settings.bootstrap_servers, kafka_settings.events_topic,
                        kafka_settings.events_partitions, closing[0][1].ts_ms)
    _wait_equal("window_agg rows", lambda: warehouse_windows(ch_client, experiment_ids), expected, job, beat)
    windows_s = time.monotonic() - produced

    # Phase 2, after every window has fired: late decisions (and a late duplicate), feedback.
    late = _late_events(base_ms, suffix)
    feedback = _feedback(events, random.Random(11))
    produce(kafka_settings.bootstrap_servers, kafka_settings.events_topic, late + events[:1])
    produce_feedback(kafka_settings.bootstrap_servers, kafka_settings.feedback_topic, feedback)
    expected_fb = expected_feedback(events, feedback, WINDOW_S, JOIN_S)
    by_source = lambda source: sum(c + w for key, (c, w) in expected_fb.items() if key[-1] == source)
    assert by_source("user") == 40 and by_source("shadow") == 12  # changed verdicts count once

    _wait_equal("late_events rows", lambda: warehouse_late(ch_client, experiment_ids),
                expected_late(late, WINDOW_S), job, beat)
    _wait_equal("feedback_agg rows", lambda: warehouse_feedback(ch_client, experiment_ids), expected_fb, job,
                beat)
    ids = [e.request_id for e in events + late]
    _wait_equal("events_raw FINAL rows", lambda: _count(ch_client, "events_raw", "request_id", ids), len(ids), job)
    # Raw rows carry the multi arm's mixed score columns as produced (cosine arms: nulls).
    assert warehouse_raw_scores(ch_client, ids) == {
        e.request_id: (e.similarity_mode, e.score, e.score_margin) for e in events + late}
    assert sum(e.score is not None for e in events) > 20 and sum(e.score_margin is not None for e in events) > 5
    for table, source in (("feedback_raw", "user"), ("shadow_feedback_raw", "shadow")):
        fb_ids = sorted({f.request_id for f in feedback if f.source == source})
        _wait_equal(f"{table} rows", lambda: _count(ch_client, table, "request_id", fb_ids), len(fb_ids), job)
    assert ch_client.command("SELECT count() FROM feedback_raw FINAL WHERE source = 'shadow'") == 0
    # Late events never leak into the windows they missed.
    assert warehouse_windows(ch_client, experiment_ids) == expected
    print(f"job startup {startup_s:.1f}s, events -> window_agg {windows_s:.1f}s")


def test_kill_mid_stream_and_restart_from_checkpoint_does_not_double_count(
        kafka_settings, ch_settings, ch_client, flink_job_factory, tmp_path):
    env = job_env(kafka_settings, ch_settings,
                  SCACHE_FLINK__CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
                  SCACHE_FLINK__GROUP_ID=f"restart-{uuid.uuid4().hex[:8]}")
    first = flink_job_factory(env)
    suffix = f"-{uuid.uuid4().hex[:8]}"
    base_ms = int(time.time() * 1000) - 60_000
    events = make_events(base_ms, WINDOW_S, n=240, seed=9, suffix=suffix)
    half = len(events) // 2
    produce(kafka_settings.bootstrap_servers, kafka_settings.events_topic, events[:half])
    ids = [e.request_id for e in events]
    wait_until(lambda: _count(ch_client, "events_raw", "request_id", ids[:half]) == half, RESULT_TIMEOUT_S,
               "first half in events_raw", proc=first.proc, log_path=first.log_path)
    consumed_at = time.time()
    wait_until(lambda: (chk := latest_checkpoint(tmp_path / "checkpoints")) is not None
               and chk.stat().st_mtime > consumed_at, 60, "a checkpoint after the first half",
               proc=first.proc, log_path=first.log_path)
    first.kill()  # kill -9 with windows still open (no heartbeat has closed them)

    closing = heartbeats(base_ms + (2 * WINDOW_S + 10) * 1000, kafka_settings.events_partitions)
    produce(kafka_settings.bootstrap_servers, kafka_settings.events_topic, events[half:], closing)
    second = flink_job_factory(env)
    assert "resuming from checkpoint" in second.log_path.read_text(errors="replace")
    experiment_ids = sorted({e.experiment_id for e in events})
    beat = Heartbeating(kafka_settings.bootstrap_servers, kafka_settings.events_topic,
                        kafka_settings.events_partitions, closing[0][1].ts_ms)
    _wait_equal("window_agg rows after restart", lambda: warehouse_windows(ch_client, experiment_ids),
                expected_windows(events, WINDOW_S), second, beat)
    _wait_equal("events_raw rows after restart",
                lambda: _count(ch_client, "events_raw", "request_id", ids), len(ids), second)


def _flink_restarts(job) -> int:
    """How often Flink restarted the job, from its own log (FLINK_LOG_DIR, see tests/fixtures)."""
    log_dir = Path(job.info["env"]["FLINK_LOG_DIR"])
    return sum(path.read_text(errors="replace").count("switched from state RUNNING to RESTARTING")
               for path in log_dir.glob("*.log"))


@pytest.mark.parametrize("sink_retry_s", [0, 120], ids=["restarts-from-checkpoint", "retried-in-place"])
def test_warehouse_outage_mid_stream_loses_and_doubles_nothing(
        kafka_settings, flink_job_factory, tmp_path, sink_retry_s):
    """ClickHouse restarts under a running job (an upgrade, a crash): inserts fail; the sink
    retries in place for sink_retry_s, else the job restarts from its checkpoint until the
    server is back. Either way every row lands exactly once."""
    data_dir, port = tmp_path / "outage-warehouse", free_port()
    warehouse = start_warehouse(data_dir, port=port)
    ch = ClickHouseSettings(url=warehouse.info["url"], database="scache")
    try:
        setup = connect(ch, database="default")
        apply_migrations(setup, "scache")
        setup.close()
        job = flink_job_factory(job_env(kafka_settings, ch, SCACHE_FLINK__SINK_RETRY_S=str(sink_retry_s)))
        suffix = f"-{uuid.uuid4().hex[:8]}"
        events = make_events(int(time.time() * 1000) - 60_000, WINDOW_S, n=240, seed=11, suffix=suffix)
        half, ids = len(events) // 2, [e.request_id for e in events]
        client = connect(ch)
        produce(kafka_settings.bootstrap_servers, kafka_settings.events_topic, events[:half])
        wait_until(lambda: _count(client, "events_raw", "request_id", ids[:half]) == half, RESULT_TIMEOUT_S,
                   "first half in events_raw", proc=job.proc, log_path=job.log_path)
        client.close()

        warehouse.stop()  # the second half and the window results meet a dead server
        closing = heartbeats(events[0].ts_ms + (2 * WINDOW_S + 10) * 1000, kafka_settings.events_partitions)
        produce(kafka_settings.bootstrap_servers, kafka_settings.events_topic, events[half:], closing)
        time.sleep(3 * WINDOW_S)  # windows fire and raw batches flush while it is down
        assert job.proc.poll() is None, "the job died with the warehouse: " + job.log_path.read_text()[-3000:]

        warehouse = start_warehouse(data_dir, port=port)
        client = connect(ch)
        experiment_ids = sorted({e.experiment_id for e in events})
        # A restore from a checkpoint taken after the last event restarts the watermark with
        # nothing left to read: the caches' heartbeats move it on.
        beat = Heartbeating(kafka_settings.bootstrap_servers, kafka_settings.events_topic,
                            kafka_settings.events_partitions, closing[0][1].ts_ms)
        _wait_equal("window_agg rows after the outage", lambda: warehouse_windows(client, experiment_ids),
                    expected_windows(events, WINDOW_S), job, beat)

        # Raw rows flush on their own processing-time batches: they may land after the windows.
        _wait_equal("events_raw rows after the outage",
                    lambda: _count(client, "events_raw", "request_id", ids), len(ids), job)
        client.close()
        log = job.log_path.read_text(errors="replace")
        if sink_retry_s:
            assert "clickhouse unreachable" in log and _flink_restarts(job) == 0
        else:
            assert "clickhouse unreachable" not in log and _flink_restarts(job) >= 1
    finally:
        warehouse.stop()
