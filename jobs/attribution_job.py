"""The streaming attribution job: Kafka events -> per-window attribution -> ClickHouse.

Wiring only; the logic is in udfs/ (pure functions, registered as Flink UDFs) and the
writes in jobs/clickhouse_sink.py. Everything configurable comes from
``cache_core.settings.get_settings()``. Runs on the local mini-cluster
(``python jobs/attribution_job.py``) or on a cluster (see infra/flink/README.md).
"""
from __future__ import annotations

import logging
import sys
import time
import zlib
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyflink.common import Configuration, Time, Types  # noqa: E402
from pyflink.datastream import StreamExecutionEnvironment  # noqa: E402
from pyflink.datastream.window import TumblingEventTimeWindows  # noqa: E402
from pyflink.table import StreamTableEnvironment, Table  # noqa: E402

from cache_core.events import CacheEvent, flink_columns  # noqa: E402
from cache_core.logs import configure_logging  # noqa: E402
from cache_core.settings import FlinkSettings, Settings, get_settings  # noqa: E402
from jobs import clickhouse_sink  # noqa: E402
from udfs.buckets import LATENCY_BUCKETS  # noqa: E402
from udfs.flink import register_all  # noqa: E402

log = logging.getLogger("jobs.attribution_job")

REPO_ROOT = Path(__file__).resolve().parent.parent
JOB_NAME = "scache-attribution"
SUBMITTED_MARKER = "attribution job submitted"
RUNNING_MARKER = "attribution job running"
RUNNING_TIMEOUT_S = 120.0
SHIPPED_PACKAGES = ("udfs", "cache_core", "jobs")


# -- SQL --------------------------------------------------------------------------------

def source_ddl(settings: Settings) -> str:
    """The events topic as a Kafka/JSON table with event time ``ts`` and its watermark."""
    flink, kafka = settings.flink, settings.kafka
    columns = ",\n  ".join(f"`{name}` {sql_type}" for name, sql_type in flink_columns(CacheEvent))
    options = {
        "connector": "kafka",
        "topic": kafka.events_topic,
        "properties.bootstrap.servers": kafka.bootstrap_servers,
        "properties.group.id": flink.group_id,
        "properties.client.id.prefix": f"{kafka.client_id}-attribution",
        # group-offsets with no committed offsets yet: start at the beginning.
        "properties.auto.offset.reset": "earliest",
        "scan.startup.mode": flink.startup_mode,
        "scan.watermark.idle-timeout": f"{flink.idle_timeout_s} s",
        "format": "json",
        # A malformed record is skipped, not a job crash looping on the same offset.
        "json.ignore-parse-errors": "true",
        "json.fail-on-missing-field": "false",
    }
    with_clause = ",\n  ".join(f"'{k}' = '{v}'" for k, v in options.items())
    return (
        f"CREATE TEMPORARY TABLE events (\n  {columns},\n"
        f"  ts AS TO_TIMESTAMP_LTZ(ts_ms, 3),\n"
        f"  WATERMARK FOR ts AS ts - INTERVAL '{flink.watermark_delay_s}' SECOND\n"
        f") WITH (\n  {with_clause}\n)"
    )


DECISIONS_SQL = """
SELECT *,
  lifetime_bucket_vec(entry_age_s, entry_ttl_s) AS lifetime_bucket,
  sim_decay_vec(similarity, entry_age_s) AS decayed_similarity,
  latency_bucket_vec(latency_ms) AS latency_bucket
FROM events
WHERE event_type <> 'heartbeat'
"""


def window_agg_sql(window_s: int) -> str:
    """Tumbling event-time windows x dimensions; columns = WindowAggregate minus emitted_at_ms.

    Window bounds leave as TIMESTAMP_LTZ: PyFlink's state coders cannot hold TIMESTAMP
    (LocalDateTime) values, which the window batching below keeps in state.
    """
    hist = ", ".join(f"CAST(SUM(CASE WHEN latency_bucket = {i} THEN 1 ELSE 0 END) AS BIGINT)"
                     for i in range(LATENCY_BUCKETS))
    return f"""
SELECT CAST(window_start AS TIMESTAMP_LTZ(3)) AS window_start,
  CAST(window_end AS TIMESTAMP_LTZ(3)) AS window_end,
  experiment_id, arm, namespace, config_version, intent_cluster, index_kind, lifetime_bucket,
  COUNT(*) AS requests,
  CAST(SUM(CASE WHEN hit THEN 1 ELSE 0 END) AS BIGINT) AS hits,
  SUM(CASE WHEN hit THEN COALESCE(decayed_similarity, 0.0) ELSE 0.0 END) AS decayed_hits,
  SUM(COALESCE(similarity, 0.0)) AS similarity_sum,
  COUNT(similarity) AS similarity_count,
  CAST(SUM(CASE WHEN ann_checked THEN 1 ELSE 0 END) AS BIGINT) AS ann_checks,
  CAST(SUM(CASE WHEN ann_checked AND ann_agree IS TRUE THEN 1 ELSE 0 END) AS BIGINT) AS ann_agreements,
  CAST(SUM(CASE WHEN `guard` IS NOT NULL THEN 1 ELSE 0 END) AS BIGINT) AS guard_blocks,
  SUM(latency_ms) AS latency_sum_ms,
  ARRAY[{hist}] AS latency_hist,
  window_time
FROM TABLE(TUMBLE(TABLE decisions_dims, DESCRIPTOR(ts), INTERVAL '{window_s}' SECOND))
GROUP BY window_start, window_end, window_time,
  experiment_id, arm, namespace, config_version, intent_cluster, index_kind, lifetime_bucket
"""


# Dimensions are NOT NULL in ClickHouse; a record missing one lands in the "" / -1 group.
DIMENSIONS_SQL = """
SELECT ts, hit, similarity, decayed_similarity, ann_checked, ann_agree, `guard`, latency_ms,
  latency_bucket,
  COALESCE(experiment_id, '') AS experiment_id, COALESCE(arm, '') AS arm,
  COALESCE(namespace, '') AS namespace, COALESCE(config_version, 0) AS config_version,
  COALESCE(intent_cluster, -1) AS intent_cluster, COALESCE(index_kind, '') AS index_kind,
  lifetime_bucket
FROM decisions
"""


# -- pipeline ---------------------------------------------------------------------------

def build_pipeline(t_env: StreamTableEnvironment, settings: Settings) -> None:
    """Declare source, UDFs, aggregation and both ClickHouse sinks on ``t_env``."""
    t_env.get_config().set("table.local-time-zone", "UTC")
    t_env.get_config().set("table.exec.source.idle-timeout", f"{settings.flink.idle_timeout_s} s")
    register_all(t_env)
    t_env.execute_sql(source_ddl(settings))
    t_env.create_temporary_view("decisions", t_env.sql_query(DECISIONS_SQL))
    t_env.create_temporary_view("decisions_dims", t_env.sql_query(DIMENSIONS_SQL))
    aggregates = t_env.sql_query(window_agg_sql(settings.flink.window_s))
    raw = t_env.sql_query(
        "SELECT " + ", ".join(f"`{n}`" for n in clickhouse_sink.RAW_COLUMNS)
        + ", ts FROM events WHERE event_type <> 'heartbeat'")
    _sink_window_aggregates(t_env, aggregates, settings)
    _sink_raw_events(t_env, raw, settings)


def _sink_window_aggregates(t_env: StreamTableEnvironment, aggregates: Table,
                            settings: Settings) -> None:
    # One batch = all dimension rows of one window: keyed by window start, collected in
    # a same-size event-time window (rows carry window_time = end - 1 ms as timestamp).
    window_start = clickhouse_sink.AGG_INPUT_COLUMNS.index("window_start")
    (t_env.to_data_stream(aggregates)
        .key_by(lambda row: clickhouse_sink.epoch_ms(row[window_start]), key_type=Types.LONG())
        .window(TumblingEventTimeWindows.of(Time.seconds(settings.flink.window_s)))
        .process(clickhouse_sink.window_agg_writer(settings.clickhouse), Types.STRING())
        .uid("window-agg-writer").name("window_agg -> ClickHouse")
        .print("scache-sink"))


def _sink_raw_events(t_env: StreamTableEnvironment, raw: Table, settings: Settings) -> None:
    # Micro-batches of raw_batch_s; a late event re-fires its batch (ReplacingMergeTree by
    # request_id absorbs the repeat) until allowed_lateness_s, so lateness loses no raw row.
    request_id = clickhouse_sink.RAW_COLUMNS.index("request_id")
    shards = settings.flink.parallelism
    (t_env.to_data_stream(raw)
        .key_by(lambda row: zlib.crc32(row[request_id].encode()) % shards, key_type=Types.INT())
        .window(TumblingEventTimeWindows.of(Time.seconds(settings.flink.raw_batch_s)))
        .allowed_lateness(settings.flink.allowed_lateness_s * 1000)
        .process(clickhouse_sink.events_raw_writer(settings.clickhouse), Types.STRING())
        .uid("events-raw-writer").name("events_raw -> ClickHouse")
        .print("scache-sink"))


# -- environment ------------------------------------------------------------------------

def connector_jar(flink: FlinkSettings) -> Path:
    if flink.connector_jar is not None:
        return flink.connector_jar
    from infra.flink.resolve import connector_jar as resolve_connector_jar

    return resolve_connector_jar()


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest completed checkpoint (``<job id>/chk-N`` with ``_metadata``) under the dir."""
    done = [p.parent for p in checkpoint_dir.glob("*/chk-*/_metadata")]
    return max(done, key=lambda p: p.stat().st_mtime, default=None)


def flink_configuration(settings: Settings) -> Configuration:
    """Parallelism, checkpointing (retained, resumed on restart) and the connector jar."""
    flink = settings.flink
    flink.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    jar = connector_jar(flink)
    if not jar.exists():
        raise FileNotFoundError(f"Flink Kafka connector jar not found: {jar}")
    config = Configuration()
    config.set_string("parallelism.default", str(flink.parallelism))
    config.set_string("pipeline.jars", jar.resolve().as_uri())
    config.set_string("execution.checkpointing.interval", f"{flink.checkpoint_interval_s} s")
    config.set_string("execution.checkpointing.dir", flink.checkpoint_dir.resolve().as_uri())
    config.set_string("execution.checkpointing.externalized-checkpoint-retention",
                      "RETAIN_ON_CANCELLATION")
    config.set_string("execution.checkpointing.num-retained", "2")
    # A restarted process picks up the windows (and Kafka offsets) it had in flight.
    resume = latest_checkpoint(flink.checkpoint_dir)
    if resume is not None:
        config.set_string("execution.state-recovery.path", resume.as_uri())
        config.set_string("execution.state-recovery.ignore-unclaimed-state", "true")
        log.info("resuming from checkpoint", extra={"checkpoint": str(resume)})
    return config


def create_environment(settings: Settings) -> StreamExecutionEnvironment:
    """A configured environment with this repo's Python packages shipped to the workers."""
    env = StreamExecutionEnvironment.get_execution_environment(flink_configuration(settings))
    for package in SHIPPED_PACKAGES:
        env.add_python_file(str(REPO_ROOT / package))
    return env


def main() -> int:
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    started = time.monotonic()
    try:
        env = create_environment(settings)
        t_env = StreamTableEnvironment.create(env)
        build_pipeline(t_env, settings)
        client = env.execute_async(JOB_NAME)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    job_id = str(client.get_job_id())
    log.info(SUBMITTED_MARKER, extra={"job_id": job_id, "submit_s": round(time.monotonic() - started, 2),
                                      "topic": settings.kafka.events_topic,
                                      "window_s": settings.flink.window_s})
    print(f"{SUBMITTED_MARKER} job_id={job_id} submit_s={time.monotonic() - started:.1f}", flush=True)
    status = wait_for_status(client, "RUNNING", RUNNING_TIMEOUT_S)
    print(f"{RUNNING_MARKER} job_id={job_id} status={status} start_s={time.monotonic() - started:.1f}",
          flush=True)
    client.get_job_execution_result().result()
    return 0


def wait_for_status(client, wanted: str, timeout_s: float) -> str:
    """Poll the job status until ``wanted`` (or a terminal state, or the timeout)."""
    deadline = time.monotonic() + timeout_s
    status = ""
    while time.monotonic() < deadline:
        status = str(client.get_job_status().result()).rsplit(".", 1)[-1]
        if status in (wanted, "FAILED", "CANCELED", "FINISHED"):
            break
        time.sleep(0.2)
    return status


if __name__ == "__main__":
    sys.exit(main())
