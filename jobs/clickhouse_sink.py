"""Batched, idempotent ClickHouse writes for the attribution job.

A Flink event-time window collects the rows of one batch in keyed (checkpointed) state;
when it fires, ``ClickHouseBatchWriter`` inserts them in ONE insert. A failed insert
raises, the job restarts from its last checkpoint and the batch fires again. Repeats are
harmless: the tables are ReplacingMergeTrees keyed by the row's identity, and every
insert carries an ``insert_deduplication_token`` derived from the batch's content.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone

from pyflink.datastream.functions import ProcessWindowFunction

from cache_core.events import CacheEvent, WindowAggregate, clickhouse_columns, flink_columns
from cache_core.settings import ClickHouseSettings

log = logging.getLogger(__name__)

EVENTS_RAW = "events_raw"
WINDOW_AGG = "window_agg"

RAW_COLUMNS = [name for name, _ in clickhouse_columns(CacheEvent)]
AGG_COLUMNS = list(WindowAggregate.model_fields)
AGG_DIMENSIONS = ["experiment_id", "arm", "namespace", "config_version", "intent_cluster",
                  "index_kind", "lifetime_bucket"]
# The Flink rows carry the same fields as the ClickHouse columns, in this order;
# window_agg rows have no emitted_at_ms yet (stamped at write time).
AGG_INPUT_COLUMNS = [c for c in AGG_COLUMNS if c != "emitted_at_ms"]
assert RAW_COLUMNS == [name for name, _ in flink_columns(CacheEvent)]


def utc(value) -> datetime:
    """A Flink timestamp (TIMESTAMP_LTZ arrives as a pyflink Instant) as an aware UTC datetime."""
    if hasattr(value, "to_epoch_milli"):
        return datetime.fromtimestamp(value.to_epoch_milli() / 1000, tz=timezone.utc)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def epoch_ms(value) -> int:
    if hasattr(value, "to_epoch_milli"):
        return int(value.to_epoch_milli())
    return int(utc(value).timestamp() * 1000)


def window_agg_row(values: Sequence, emitted_at_ms: int) -> list:
    """A Flink aggregate row (AGG_INPUT_COLUMNS order) as a window_agg insert row."""
    row = dict(zip(AGG_INPUT_COLUMNS, values))
    row["window_start"] = utc(row["window_start"])
    row["window_end"] = utc(row["window_end"])
    row["latency_hist"] = [int(c) for c in row["latency_hist"]]
    row["emitted_at_ms"] = emitted_at_ms
    return [row[c] for c in AGG_COLUMNS]


def raw_event_row(values: Sequence, emitted_at_ms: int = 0) -> list:
    """A Flink source row (RAW_COLUMNS order, extra trailing columns ignored) as-is."""
    return list(values[:len(RAW_COLUMNS)])


def dedup_token(table: str, key: object, rows: Iterable[Sequence], skip: Sequence[int] = ()) -> str:
    """Stable token for a batch: same table, key and row content -> same token.

    Columns at positions ``skip`` (e.g. emitted_at_ms, which changes on a re-send)
    are left out, so a replayed batch deduplicates.
    """
    digest = hashlib.sha256()
    for row in sorted(json.dumps([v for i, v in enumerate(r) if i not in skip], default=str)
                      for r in rows):
        digest.update(row.encode())
    return f"{table}:{key}:{digest.hexdigest()[:24]}"


class ClickHouseBatchWriter(ProcessWindowFunction):
    """Writes all rows of one fired window as one insert; emits (key, window end, rows)."""

    def __init__(self, ch: ClickHouseSettings, table: str, columns: list[str],
                 to_row: Callable[[Sequence, int], list], token_skip: Sequence[int] = ()):
        self._ch = ch
        self._table = table
        self._columns = columns
        self._to_row = to_row
        self._token_skip = tuple(token_skip)
        self._client = None

    def open(self, runtime_context) -> None:
        from cache_core.chclient import connect

        self._client = connect(self._ch)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def process(self, key, context: ProcessWindowFunction.Context, elements: Iterable):
        now_ms = int(time.time() * 1000)
        rows = [self._to_row(element, now_ms) for element in elements]
        if not rows:
            return
        token = dedup_token(self._table, f"{key}:{context.window().end}", rows, self._token_skip)
        self._client.insert(self._table, rows, column_names=self._columns,
                            database=self._ch.database,
                            settings={"insert_deduplication_token": token})
        yield f"{self._table} key={key} window_end_ms={context.window().end} rows={len(rows)}"


def window_agg_writer(ch: ClickHouseSettings) -> ClickHouseBatchWriter:
    return ClickHouseBatchWriter(ch, WINDOW_AGG, AGG_COLUMNS, window_agg_row,
                                 token_skip=[AGG_COLUMNS.index("emitted_at_ms")])


def events_raw_writer(ch: ClickHouseSettings) -> ClickHouseBatchWriter:
    return ClickHouseBatchWriter(ch, EVENTS_RAW, RAW_COLUMNS, raw_event_row)

