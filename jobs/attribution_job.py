"""The streaming attribution job: Kafka events -> per-window attribution -> ClickHouse.

Wiring only; the logic is in udfs/ (pure functions, registered as Flink UDFs) and the
writes in jobs/clickhouse_sink.py. Everything configurable comes from
``cache_core.settings.get_settings()``. Runs on the local mini-cluster
(``python jobs/attribution_job.py``) or on a cluster (see infra/flink/README.md);
``--explain`` prints the optimized plan instead of submitting.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyflink.common import Configuration, Types  # noqa: E402
from pyflink.datastream import StreamExecutionEnvironment  # noqa: E402
from pyflink.table import StreamTableEnvironment, Table  # noqa: E402

from cache_core.events import CacheEvent, FeedbackEvent, flink_columns  # noqa: E402
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
# Everything per event runs in Flink's Java operators (parsing, lateness, dedup, joins,
# aggregates, JSON batching) except the pandas UDFs, which see Arrow batches. Python
# (jobs/clickhouse_sink.py) only receives a few rows per second: one JSON batch per raw
# table per interval, and the aggregate rows that changed.

def _kafka_options(settings: Settings, topic: str, client: str) -> str:
    flink, kafka = settings.flink, settings.kafka
    options = {
        "connector": "kafka",
        "topic": topic,
        "properties.bootstrap.servers": kafka.bootstrap_servers,
        "properties.group.id": flink.group_id,
        "properties.client.id.prefix": f"{kafka.client_id}-{client}",
        # group-offsets with no committed offsets yet: start at the beginning.
        "properties.auto.offset.reset": "earliest",
        "scan.startup.mode": flink.startup_mode,
        "scan.watermark.idle-timeout": f"{flink.idle_timeout_s} s",
        "format": "json",
        # A malformed record is skipped, not a job crash looping on the same offset.
        "json.ignore-parse-errors": "true",
        "json.fail-on-missing-field": "false",
    }
    return ",\n  ".join(f"'{k}' = '{v}'" for k, v in options.items())


def _source_ddl(table: str, model, settings: Settings, topic: str, client: str) -> str:
    columns = ",\n  ".join(f"`{name}` {sql_type}" for name, sql_type in flink_columns(model))
    return (
        f"CREATE TEMPORARY TABLE {table} (\n  {columns},\n"
        f"  ts AS TO_TIMESTAMP_LTZ(ts_ms, 3),\n"
        f"  pt AS PROCTIME(),\n"
        f"  WATERMARK FOR ts AS ts - {_interval(watermark_lag_s(settings))}\n"
        f") WITH (\n  {_kafka_options(settings, topic, client)}\n)"
    )


def watermark_lag_s(settings: Settings) -> int:
    """How far the watermark trails the newest event: out-of-orderness + allowed lateness."""
    return settings.flink.watermark_delay_s + settings.flink.allowed_lateness_s


def source_ddl(settings: Settings) -> str:
    """The events topic as a Kafka/JSON table with event time ``ts``, its watermark, ``pt``."""
    return _source_ddl("events", CacheEvent, settings, settings.kafka.events_topic, "attribution")


def feedback_source_ddl(settings: Settings) -> str:
    """The feedback topic, same shape (event time = when the verdict was given)."""
    return _source_ddl("feedback", FeedbackEvent, settings, settings.kafka.feedback_topic,
                       "attribution-feedback")


def _window_start_ms(window_s: int, ts_ms: str = "ts_ms") -> str:
    return f"({ts_ms} - MOD({ts_ms}, {window_s * 1000}))"


def decisions_sql(settings: Settings) -> str:
    """Decisions with a lateness flag, computed next to the source.

    The watermark trails the newest event by watermark_delay_s + allowed_lateness_s, so a
    window fires only once that much later event time has passed its end; an event whose
    window has already fired is late (the window operator would drop it) and is counted in
    late_events instead. Dimensions are NOT NULL in ClickHouse; a record missing one lands
    in the "" / -1 group.
    """
    window_ms = settings.flink.window_s * 1000
    start = _window_start_ms(settings.flink.window_s)
    return f"""
SELECT request_id, ts_ms, ts, pt, hit, similarity, entry_age_s, entry_ttl_s, ann_checked, ann_agree,
  `guard`, latency_ms,
  COALESCE(experiment_id, '') AS experiment_id, COALESCE(arm, '') AS arm,
  COALESCE(`variant`, 'base') AS `variant`,
  COALESCE(namespace, '') AS namespace, COALESCE(config_version, 0) AS config_version,
  COALESCE(intent_cluster, -1) AS intent_cluster, COALESCE(index_kind, '') AS index_kind,
  COALESCE(tier, 'memory') AS tier,
  {start} AS window_start_ms,
  COALESCE(TO_TIMESTAMP_LTZ({start} + {window_ms - 1}, 3) <= CURRENT_WATERMARK(ts), FALSE) AS is_late
FROM events
WHERE event_type <> 'heartbeat' AND request_id IS NOT NULL AND ts_ms IS NOT NULL
"""


# The publisher is at-least-once: a re-sent decision (same request_id) counts once.
# Keep-first on processing time is append-only; its state lives state_ttl_s.
DEDUPED_SQL = """
SELECT * FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY request_id ORDER BY pt ASC) AS rn FROM decisions
) WHERE rn = 1
"""

ENRICHED_SQL = """
SELECT ts, window_start_ms, experiment_id, arm, `variant`, namespace, config_version, intent_cluster,
  index_kind, tier, hit, similarity, ann_checked, ann_agree, `guard`, latency_ms,
  lifetime_bucket_vec(entry_age_s, entry_ttl_s) AS lifetime_bucket,
  sim_decay_vec(similarity, entry_age_s) AS decayed_similarity,
  latency_bucket_vec(latency_ms) AS latency_bucket
FROM decisions_deduped
WHERE NOT is_late
"""


def _ts_text(ms_expr: str) -> str:
    """Epoch ms as ClickHouse's DateTime64(3) text (the session time zone is UTC)."""
    return f"DATE_FORMAT(TO_TIMESTAMP_LTZ({ms_expr}, 3), 'yyyy-MM-dd HH:mm:ss.SSS')"


def _json_row(pairs: list[tuple[str, str]]) -> str:
    return "JSON_OBJECT(" + ", ".join(f"KEY '{k}' VALUE {v}" for k, v in pairs) + ")"


def window_agg_sql(window_s: int) -> str:
    """Tumbling event-time windows x dimensions, emitted once when the watermark passes;
    fields = WindowAggregate minus emitted_at_ms, in order."""
    hist = ", ".join(f"CAST(SUM(CASE WHEN latency_bucket = {i} THEN 1 ELSE 0 END) AS BIGINT)"
                     for i in range(LATENCY_BUCKETS))
    return f"""
SELECT window_start_ms, window_start_ms + {window_s * 1000} AS window_end_ms,
  experiment_id, arm, `variant`, namespace, config_version, intent_cluster, index_kind, lifetime_bucket,
  COUNT(*) AS requests,
  CAST(SUM(CASE WHEN hit THEN 1 ELSE 0 END) AS BIGINT) AS hits,
  CAST(SUM(CASE WHEN hit AND tier = 'disk' THEN 1 ELSE 0 END) AS BIGINT) AS disk_hits,
  SUM(CASE WHEN hit THEN COALESCE(decayed_similarity, 0.0) ELSE 0.0 END) AS decayed_hits,
  SUM(COALESCE(similarity, 0.0)) AS similarity_sum,
  COUNT(similarity) AS similarity_count,
  CAST(SUM(CASE WHEN ann_checked THEN 1 ELSE 0 END) AS BIGINT) AS ann_checks,
  CAST(SUM(CASE WHEN ann_checked AND ann_agree IS TRUE THEN 1 ELSE 0 END) AS BIGINT) AS ann_agreements,
  CAST(SUM(CASE WHEN `guard` IS NOT NULL THEN 1 ELSE 0 END) AS BIGINT) AS guard_blocks,
  SUM(latency_ms) AS latency_sum_ms,
  ARRAY[{hist}] AS latency_hist
FROM TABLE(TUMBLE(TABLE enriched, DESCRIPTOR(ts), INTERVAL '{window_s}' SECOND))
GROUP BY window_start, window_end, window_start_ms, experiment_id, arm, `variant`, namespace,
  config_version, intent_cluster, index_kind, lifetime_bucket
"""


def late_events_sql(window_s: int) -> str:
    """Late decisions per window, experiment and arm (updating: a late event may come any time)."""
    return f"""
SELECT window_start_ms, window_start_ms + {window_s * 1000} AS window_end_ms, experiment_id, arm,
  COUNT(*) AS late_count
FROM decisions_deduped WHERE is_late
GROUP BY window_start_ms, experiment_id, arm
"""


def _interval(seconds: int) -> str:
    """A day-time interval literal; plain SECOND literals stop at 99 s."""
    hours, rest = divmod(seconds, 3600)
    return f"INTERVAL '{hours}:{rest // 60:02d}:{rest % 60:02d}' HOUR TO SECOND"


def feedback_join_sql(settings: Settings) -> str:
    """Feedback interval-joined to the hit it judges (feedback within feedback_join_s after)."""
    return f"""
SELECT f.request_id, f.verdict, f.ts_ms, COALESCE(f.source, 'user') AS source,
  COALESCE(d.experiment_id, '') AS experiment_id, COALESCE(d.arm, '') AS arm,
  COALESCE(d.`variant`, 'base') AS `variant`, COALESCE(d.namespace, '') AS namespace,
  COALESCE(d.config_version, 0) AS config_version, COALESCE(d.intent_cluster, -1) AS intent_cluster
FROM feedback AS f
JOIN (SELECT request_id, ts, experiment_id, arm, `variant`, namespace, config_version, intent_cluster
      FROM events WHERE event_type = 'decision' AND hit) AS d
ON f.request_id = d.request_id
  AND f.ts BETWEEN d.ts AND d.ts + {_interval(settings.flink.feedback_join_s)}
WHERE f.verdict IN ('correct', 'wrong')
"""


# The latest verdict on a request counts, per source (user and shadow verdicts are counted apart, as
# feedback_raw and shadow_feedback_raw keep them apart); this also absorbs a
# re-sent feedback or decision. Keep-last is an updating stream; the aggregate retracts.
FEEDBACK_LATEST_SQL = """
SELECT * FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY request_id, source ORDER BY jpt DESC) AS rn
  FROM (SELECT *, PROCTIME() AS jpt FROM feedback_joined)
) WHERE rn = 1
"""


def feedback_agg_sql(window_s: int) -> str:
    """Labelled hits per feedback event-time window x decision dimensions (FeedbackAggregate)."""
    start = _window_start_ms(window_s)
    return f"""
SELECT window_start_ms, window_start_ms + {window_s * 1000} AS window_end_ms,
  experiment_id, arm, `variant`, namespace, config_version, intent_cluster, source,
  CAST(SUM(CASE WHEN verdict = 'correct' THEN 1 ELSE 0 END) AS BIGINT) AS correct,
  CAST(SUM(CASE WHEN verdict = 'wrong' THEN 1 ELSE 0 END) AS BIGINT) AS wrong
FROM (SELECT *, {start} AS window_start_ms FROM feedback_latest)
GROUP BY window_start_ms, experiment_id, arm, `variant`, namespace, config_version, intent_cluster, source
"""


def _as_sink_rows(table: str, view: str, columns: list[str], keys: list[str]) -> str:
    """Rows of ``view`` as (tbl, k, body); window_* columns become DateTime64 text."""
    def value(column: str) -> str:
        if column in ("window_start", "window_end"):
            return _ts_text(f"{column}_ms")
        return f"`{column}`"
    key_parts = [f"{k}_ms" if k in ("window_start", "window_end") else k for k in keys]
    key = "CONCAT_WS('|', " + ", ".join(f"CAST(`{c}` AS STRING)" for c in key_parts) + ")"
    body = _json_row([(c, value(c)) for c in columns])
    return f"SELECT '{table}' AS tbl, {key} AS k, {body} AS body FROM {view}"


def raw_batches_sql(table: str, source: str, columns: list[str], settings: Settings) -> str:
    """Processing-time micro-batches of raw rows: one JSONEachRow body per batch and shard.

    Processing time keeps raw rows fresh whatever the watermark (late rows included); a
    batch replayed after a restart is absorbed by the table's ReplacingMergeTree.
    ARRAY_AGG + ARRAY_JOIN, not LISTAGG: Flink's LISTAGG concatenates the accumulator string
    on every row (quadratic in the batch; measured 270 ms CPU per 1,000 events at ~1,700/s),
    ARRAY_AGG appends to a list (7 ms per 1,000 events).
    """
    shards = settings.flink.parallelism
    body = _json_row([(c, f"`{c}`") for c in columns])
    return f"""
SELECT '{table}' AS tbl,
  CONCAT_WS('|', CAST(window_start AS STRING), CAST(shard AS STRING)) AS k,
  ARRAY_JOIN(ARRAY_AGG(row_json), ',') AS body
FROM TABLE(TUMBLE(TABLE {source}_rows, DESCRIPTOR(pt), INTERVAL '{settings.flink.raw_batch_s}' SECOND))
GROUP BY window_start, window_end, shard
""", f"SELECT pt, MOD(ts_ms, {shards}) AS shard, {body} AS row_json FROM {source}"


def ticks_sql(settings: Settings) -> str:
    """One tick per aggregate table and flush interval (processing time) while the events topic
    carries anything, the caches' heartbeats included; see jobs/clickhouse_sink.py."""
    tables = ", ".join(f"'{t}'" for t in clickhouse_sink.TABLES)
    return f"""
SELECT t.tbl AS tbl, '' AS k, '{clickhouse_sink.TICK_BODY}' AS body
FROM (SELECT window_start, ARRAY[{tables}] AS tick_tables
      FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(pt), INTERVAL '{settings.flink.raw_batch_s}' SECOND))
      GROUP BY window_start, window_end) AS w
CROSS JOIN UNNEST(w.tick_tables) AS t(tbl)
"""


# -- pipeline ---------------------------------------------------------------------------

def configure_table_env(t_env: StreamTableEnvironment, settings: Settings) -> None:
    config = t_env.get_config()
    config.set("table.local-time-zone", "UTC")
    config.set("table.exec.source.idle-timeout", f"{settings.flink.idle_timeout_s} s")
    config.set("table.exec.state.ttl", f"{settings.flink.state_ttl_s} s")
    # No mini-batch: its processing-time assigner replaces event-time watermarks downstream.
    config.set("python.fn-execution.bundle.size", "10000")
    config.set("python.fn-execution.arrow.batch.size", "10000")
    config.set("python.fn-execution.bundle.time", "500")


# Users' verdicts to feedback_raw, shadow checks' to shadow_feedback_raw: keyed by request id, one table
# would let either replace the other (migration 0007).
RAW_FEEDBACK_VIEWS = {
    "user_feedback": "SELECT * FROM feedback WHERE COALESCE(source, 'user') <> 'shadow'",
    "shadow_feedback": "SELECT * FROM feedback WHERE source = 'shadow'",
}


def build_pipeline(t_env: StreamTableEnvironment, settings: Settings) -> None:
    """Declare sources, UDFs, dedup, aggregates, the feedback join and the one ClickHouse sink."""
    _sink(t_env, sink_rows(t_env, settings), settings)


def sink_rows(t_env: StreamTableEnvironment, settings: Settings) -> Table:
    """Every row bound for ClickHouse, as (table, key, JSON body), from the declared sources."""
    window_s = settings.flink.window_s
    configure_table_env(t_env, settings)
    register_all(t_env)
    t_env.execute_sql(source_ddl(settings))
    t_env.execute_sql(feedback_source_ddl(settings))
    views = {
        "decisions": decisions_sql(settings),
        "decisions_deduped": DEDUPED_SQL,
        "enriched": ENRICHED_SQL,
        "window_agg_rows": window_agg_sql(window_s),
        "late_rows": late_events_sql(window_s),
        "feedback_joined": feedback_join_sql(settings),
        "feedback_latest": FEEDBACK_LATEST_SQL,
        "feedback_agg_rows": feedback_agg_sql(window_s),
    }
    for name, sql in views.items():
        t_env.create_temporary_view(name, t_env.sql_query(sql))
    raw_events = "SELECT * FROM events WHERE event_type <> 'heartbeat'"
    t_env.create_temporary_view("raw_events", t_env.sql_query(raw_events))
    for view, sql in RAW_FEEDBACK_VIEWS.items():
        t_env.create_temporary_view(view, t_env.sql_query(sql))
    parts = []
    for table, source, columns in ((clickhouse_sink.EVENTS_RAW, "raw_events", clickhouse_sink.RAW_COLUMNS),
                                   (clickhouse_sink.FEEDBACK_RAW, "user_feedback",
                                    clickhouse_sink.FEEDBACK_COLUMNS),
                                   (clickhouse_sink.SHADOW_FEEDBACK_RAW, "shadow_feedback",
                                    clickhouse_sink.FEEDBACK_COLUMNS)):
        batch_sql, rows_sql = raw_batches_sql(table, source, columns, settings)
        t_env.create_temporary_view(f"{source}_rows", t_env.sql_query(rows_sql))
        parts.append(batch_sql)
    for table, view in ((clickhouse_sink.WINDOW_AGG, "window_agg_rows"),
                        (clickhouse_sink.LATE_EVENTS, "late_rows"),
                        (clickhouse_sink.FEEDBACK_AGG, "feedback_agg_rows")):
        spec = clickhouse_sink.TABLES[table]
        parts.append(_as_sink_rows(table, view, spec.input_columns, spec.keys))
    parts.append(ticks_sql(settings))
    return t_env.sql_query("\nUNION ALL\n".join(parts))


def _sink(t_env: StreamTableEnvironment, sink_rows: Table, settings: Settings) -> None:
    # Keyed by table: each table's pending rows flush as one insert per batch interval.
    (t_env.to_changelog_stream(sink_rows)
        .key_by(lambda row: row[0], key_type=Types.STRING())
        .process(clickhouse_sink.ClickHouseSink(settings.clickhouse, settings.flink.raw_batch_s,
                                                  settings.flink.sink_retry_s),
                 Types.STRING())
        .uid("clickhouse-sink").name("-> ClickHouse")
        .print("scache-sink"))


# -- environment ------------------------------------------------------------------------

def connector_jar(flink: FlinkSettings) -> Path:
    """The connector jar the launcher passes in (``SCACHE_FLINK__CONNECTOR_JAR``): infra/stack.py,
    infra/flink/cluster.py and the deploy manifests set it; ``python -m infra.flink.resolve`` prints it."""
    if flink.connector_jar is None:
        raise FileNotFoundError("Flink Kafka connector jar not set: SCACHE_FLINK__CONNECTOR_JAR="
                                "$(python -m infra.flink.resolve)")
    return flink.connector_jar


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python jobs/attribution_job.py",
                                     description="The scache attribution job (settings from SCACHE_*).")
    parser.add_argument("--explain", action="store_true",
                        help="print the optimized plan of every row bound for ClickHouse and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    started = time.monotonic()
    try:
        env = create_environment(settings)
        t_env = StreamTableEnvironment.create(env)
        if args.explain:
            print(sink_rows(t_env, settings).explain(), flush=True)
            return 0
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
    if detached(t_env):
        return 0 if status == "RUNNING" else 1
    client.get_job_execution_result().result()
    return 0


def detached(t_env: StreamTableEnvironment) -> bool:
    """Submitted with ``flink run -d``: the cluster keeps the job, so the client must return
    (waiting for the result would never end). The embedded mini-cluster lives in this
    process (target ``local``), so there the main waits for the job."""
    config = t_env.get_config()
    return (config.get("execution.target", "local") != "local"
            and config.get("execution.attached", "true") == "false")


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
