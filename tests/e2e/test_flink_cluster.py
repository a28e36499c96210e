"""The attribution job on a real standalone Flink cluster, submitted with the README's `flink run` line.

Not the in-process mini-cluster: infra.flink.cluster starts the wheel's JobManager and
TaskManager (loopback, free ports), `bin/flink run -d -py jobs/attribution_job.py ...`
submits the same job file with the SCACHE_* settings of this test's broker topics and
warehouse, and decisions published with the cache's EventPublisher must reach events_raw
and window_agg (equal to the plain-Python reference) while the cluster reports the job
RUNNING. The job is cancelled and the cluster stopped at teardown, even on failure.
"""
from __future__ import annotations

import time
import uuid

import pytest

from cache_core.publish.publisher import EventPublisher
from infra.flink.cluster import JOB_FILE, FlinkCluster, start
from infra.flink.resolve import connector_jar
from infra.runtime import group_alive, wait_until
from tests.fixtures.flink import FAST_JOB_ENV, job_env
from tests.integration.attribution_data import expected_windows, make_events, warehouse_windows

pytestmark = pytest.mark.e2e

WINDOW_S = int(FAST_JOB_ENV["SCACHE_FLINK__WINDOW_S"])
RESULT_TIMEOUT_S = 120.0


@pytest.fixture
def flink_cluster(tmp_path):
    cluster = start(tmp_path / "flink-cluster")
    groups = dict(cluster.pids)  # JobManager / TaskManager process groups (JVMs + Python workers)
    try:
        yield cluster
    finally:
        try:
            for job in cluster.jobs():
                if job["status"] not in ("CANCELED", "FAILED", "FINISHED"):
                    cluster.cancel(job["id"])
        finally:
            cluster.stop()
    assert not [name for name, pgid in groups.items() if group_alive(pgid)], "flink processes left after stop"


def _raw_count(client, request_ids: list[str]) -> int:
    return client.query("SELECT count() FROM events_raw FINAL WHERE request_id IN {ids:Array(String)}",
                        parameters={"ids": request_ids}).result_rows[0][0]


def _wait(what: str, check, cluster: FlinkCluster, job_id: str) -> None:
    """Until ``check()``; fails at once (with the job's root exception) if the job stops running."""
    def ready() -> bool:
        status = cluster.job_status(job_id)
        if status != "RUNNING":
            exceptions = cluster.job_exceptions(job_id)
            raise AssertionError(f"job {job_id} is {status} while waiting for {what}:\n{exceptions}")
        return check()
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(1.0)
    raise AssertionError(f"{what}: not there after {RESULT_TIMEOUT_S:.0f}s\n{cluster.log_tail(15)}")


def test_attribution_job_runs_on_standalone_cluster(flink_cluster, kafka_settings, ch_settings, ch_client,
                                                    tmp_path):
    started = time.monotonic()
    env = job_env(kafka_settings, ch_settings, **FAST_JOB_ENV,
                  SCACHE_FLINK__CONNECTOR_JAR=str(connector_jar()),
                  SCACHE_FLINK__CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
                  SCACHE_FLINK__GROUP_ID=f"scache-cluster-test-{uuid.uuid4().hex[:8]}")
    job_id = flink_cluster.submit(JOB_FILE, env)
    submitted_s = time.monotonic() - started

    # The cluster (not a client-side mini-cluster) runs it: the standalone JobManager's REST
    # API has the job RUNNING, and every task deployed to the TaskManager (a job is RUNNING
    # while its tasks are still CREATED / DEPLOYING).
    assert flink_cluster.job_status(job_id) == "RUNNING"
    assert flink_cluster.job(job_id)["name"] == "scache-attribution"

    def tasks_running() -> bool:
        return all(v["status"] == "RUNNING" for v in flink_cluster.job(job_id)["vertices"])
    _wait("every task RUNNING", tasks_running, flink_cluster, job_id)
    tasks_s = time.monotonic() - started
    overview = flink_cluster.overview()
    assert overview["jobs-running"] == 1 and overview["slots-available"] < overview["slots-total"]

    # Decisions from 30 s ago over two windows, then heartbeats at "now" on every
    # partition: the watermark passes both windows, so they fire without waiting.
    suffix = f"-{uuid.uuid4().hex[:8]}"
    events = make_events(int(time.time() * 1000) - 30_000, WINDOW_S, n=60, suffix=suffix)
    publisher = EventPublisher(kafka_settings, tmp_path / "spool", instance_id="cluster-test")
    try:
        for event in events:
            publisher.publish_event(event)
        assert publisher.flush(timeout_s=30), publisher.stats()
        publisher.start_heartbeats(1.0)

        ids = [e.request_id for e in events]
        _wait("events_raw rows", lambda: _raw_count(ch_client, ids) == len(ids), flink_cluster, job_id)
        raw_s = time.monotonic() - started
        experiment_ids = sorted({e.experiment_id for e in events})
        expected = expected_windows(events, WINDOW_S)
        try:
            _wait("window_agg rows", lambda: warehouse_windows(ch_client, experiment_ids) == expected,
                  flink_cluster, job_id)
        except AssertionError:
            assert warehouse_windows(ch_client, experiment_ids) == expected  # shows the difference
            raise
    finally:
        publisher.close()
    assert warehouse_windows(ch_client, experiment_ids) == expected
    print(f"submit {submitted_s:.1f}s, tasks running {tasks_s:.1f}s, events_raw {raw_s:.1f}s, "
          f"window_agg after {time.monotonic() - started:.1f}s")

    assert flink_cluster.cancel(job_id) == "CANCELED"
    wait_until(lambda: flink_cluster.overview()["jobs-running"] == 0, 30, "no running job after cancel")
