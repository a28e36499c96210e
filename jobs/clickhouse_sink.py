"""The attribution job's one ClickHouse sink: batched, idempotent, checkpoint-safe.

Flink SQL hands this operator rows ``(tbl, k, body)`` where ``body`` is JSON:

- raw tables (events_raw, feedback_raw): ``body`` is a whole processing-time batch of
  JSONEachRow rows, built in Java (JSON_OBJECT + ARRAY_AGG); it is inserted as it arrives.
- aggregate tables (window_agg, late_events, feedback_agg): one updating row per key
  ``k``; the latest version of each key waits in keyed MapState (checkpointed) and every
  ``flush_s`` all pending keys of a table go out in ONE insert, stamped ``emitted_at_ms``.
- ticks (``body`` empty, one per aggregate table and ``flush_s`` of processing time while
  the events topic carries anything, heartbeats included): they re-arm the flush timer of
  a table with pending rows. After a task failover, the restored MapState can hold rows
  whose flush timer the checkpoint did not keep (seen under load when the warehouse went
  down as a window fired: the windows never reached ClickHouse); a tick heals that.

Every table is a ReplacingMergeTree over the row's identity (request_id or the window x
dimensions, latest ``emitted_at_ms`` winning), so a batch written again after a restart
from checkpoint replaces rather than doubles. An unreachable server is retried in place for
``sink_retry_s`` (a ClickHouse restart or failover is absorbed without a job restart); after
that, or on any error the server returns, the insert raises and the job restarts.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import TypeVar
from dataclasses import dataclass, field

from clickhouse_connect.driver.exceptions import OperationalError
from pyflink.common import Types
from pyflink.common.types import RowKind
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor

from cache_core.events import (
    CacheEvent, FeedbackAggregate, FeedbackEvent, LateEventCount, WindowAggregate,
    clickhouse_columns, flink_columns,
)
from cache_core.settings import ClickHouseSettings

EVENTS_RAW = "events_raw"
FEEDBACK_RAW = "feedback_raw"
SHADOW_FEEDBACK_RAW = "shadow_feedback_raw"
"""Shadow checks' verdicts (source "shadow"); feedback_raw keeps the users' (migration 0007)."""
WINDOW_AGG = "window_agg"
LATE_EVENTS = "late_events"
FEEDBACK_AGG = "feedback_agg"

RAW_COLUMNS = [name for name, _ in clickhouse_columns(CacheEvent)]
FEEDBACK_COLUMNS = [name for name, _ in clickhouse_columns(FeedbackEvent)]
AGG_COLUMNS = list(WindowAggregate.model_fields)
AGG_DIMENSIONS = ["experiment_id", "arm", "variant", "namespace", "config_version", "intent_cluster",
                  "index_kind", "lifetime_bucket"]
# The Flink rows carry the same fields as the ClickHouse columns, in this order;
# aggregate rows have no emitted_at_ms yet (stamped at write time).
AGG_INPUT_COLUMNS = [c for c in AGG_COLUMNS if c != "emitted_at_ms"]
assert RAW_COLUMNS == [name for name, _ in flink_columns(CacheEvent)]


@dataclass(frozen=True)
class AggregateTable:
    """An updating aggregate's table: its columns (minus emitted_at_ms) and sorting key."""

    model: type
    keys: list[str]
    input_columns: list[str] = field(init=False)
    counters: list[str] = field(init=False)

    def __post_init__(self):
        columns = [c for c in self.model.model_fields if c != "emitted_at_ms"]
        object.__setattr__(self, "input_columns", columns)
        object.__setattr__(self, "counters", [c for c in columns if c not in self.keys
                                              and c != "window_end"])


TABLES = {
    WINDOW_AGG: AggregateTable(WindowAggregate, ["window_start", *AGG_DIMENSIONS]),
    LATE_EVENTS: AggregateTable(LateEventCount, ["window_start", "experiment_id", "arm"]),
    FEEDBACK_AGG: AggregateTable(FeedbackAggregate, ["window_start", "experiment_id", "arm", "variant",
                                                     "namespace", "config_version", "intent_cluster",
                                                     "source"]),
}
RAW_TABLES = (EVENTS_RAW, FEEDBACK_RAW, SHADOW_FEEDBACK_RAW)
TICK_BODY = ""
"""The body of a tick row (see the module doc)."""

T = TypeVar("T")


def stamp(body: str, emitted_at_ms: int) -> str:
    """Append ``emitted_at_ms`` to a JSON object's text (no re-parse on the hot path)."""
    return f'{body[:-1]},"emitted_at_ms":{emitted_at_ms}}}'


def emptied(table: str, body: str) -> str:
    """A deleted aggregate key (all its rows retracted) as the same row with zero counts."""
    row = json.loads(body)
    for column in TABLES[table].counters:
        if column not in row:
            continue
        value = row[column]
        row[column] = [0] * len(value) if isinstance(value, list) else 0
    return json.dumps(row, separators=(",", ":"))


def flush_due_ms(now_ms: int, flush_ms: int) -> int:
    """The next multiple of the flush interval after ``now_ms``."""
    return now_ms - now_ms % flush_ms + flush_ms


def insert_body(pending: Iterable[str], emitted_at_ms: int) -> str:
    """Pending aggregate rows as one JSONEachRow body, all stamped with one version."""
    return "\n".join(stamp(body, emitted_at_ms) for body in pending)


def retry_unreachable(call: Callable[[], T], retry_s: float, what: str, *,
                      sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, retried with backoff (0.5 s doubling to 5 s) while the server is unreachable.

    Only transport failures (``OperationalError``: refused, reset, timed out) retry, for at
    most ``retry_s``; an error the server answers with (a bad row, a missing table) would
    fail again, so it raises at once.
    """
    deadline, delay = clock() + retry_s, 0.5
    while True:
        try:
            return call()
        except OperationalError as error:
            if clock() + delay > deadline:
                raise
            # The Python worker's stdout reaches the job's log; its loggers are not configured.
            print(f"clickhouse unreachable ({what}), retrying in {delay:.1f}s: {error}", flush=True)
            sleep(delay)
            delay = min(delay * 2, 5.0)


class ClickHouseSink(KeyedProcessFunction):
    """Keyed by table name; emits one log line per insert."""

    def __init__(self, ch: ClickHouseSettings, flush_s: int, retry_s: float):
        self._ch = ch
        self._flush_ms = flush_s * 1000
        self._retry_s = retry_s
        self._client = None

    def open(self, runtime_context: RuntimeContext) -> None:
        from cache_core.chclient import connect

        self._client = retry_unreachable(lambda: connect(self._ch), self._retry_s, "connect")
        self._pending = runtime_context.get_map_state(
            MapStateDescriptor("pending", Types.STRING(), Types.STRING()))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def process_element(self, value, ctx: KeyedProcessFunction.Context):
        table, key, body = value[0], value[1], value[2]
        kind = value.get_row_kind()
        if table in RAW_TABLES:
            yield self._insert(table, body, rows=body.count("},{") + 1)
            return
        if body == TICK_BODY:
            if not self._pending.is_empty():
                self._arm_flush(ctx)
            return
        if kind == RowKind.UPDATE_BEFORE:
            return  # its UPDATE_AFTER follows with the new values
        self._pending.put(key, emptied(table, body) if kind == RowKind.DELETE else body)
        self._arm_flush(ctx)

    def _arm_flush(self, ctx: KeyedProcessFunction.Context) -> None:
        # Aligned to the interval: Flink keeps one timer per key and timestamp, so however many
        # rows (or ticks) arrive, a table gets at most one flush per interval.
        now = ctx.timer_service().current_processing_time()
        ctx.timer_service().register_processing_time_timer(flush_due_ms(now, self._flush_ms))

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        pending = list(self._pending.values())
        if pending:
            body = insert_body(pending, int(time.time() * 1000))
            yield self._insert(ctx.get_current_key(), body, rows=len(pending))
        self._pending.clear()

    def _insert(self, table: str, body: str, rows: int) -> str:
        started = time.monotonic()
        block = body.encode()
        retry_unreachable(lambda: self._client.raw_insert(
            table, insert_block=block, fmt="JSONEachRow", settings={"input_format_skip_unknown_fields": 1}),
            self._retry_s, f"insert into {table}")
        return f"{table} rows={rows} insert_ms={(time.monotonic() - started) * 1000:.0f}"
