"""Measure the embedded warehouse: start time, 10k-row Native insert throughput, query latency.

    PYTHONPATH=. python bench/warehouse_bench.py
"""
from __future__ import annotations

import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from cache_core.chclient import connect
from cache_core.events import CacheEvent, clickhouse_columns
from cache_core.settings import ClickHouseSettings
from infra.clickhouse.migrate import apply_migrations
from infra.clickhouse.warehouse import start_warehouse


def _events(n: int) -> tuple[list[str], list[list]]:
    now_ms = int(datetime.now(timezone.utc).timestamp() * 1000)
    events = [CacheEvent(ts_ms=now_ms + i, experiment_id="bench", arm=f"a{i % 2}", similarity=0.9,
                         decision="hit", hit=True).model_dump() for i in range(n)]
    names = [name for name, _ in clickhouse_columns(CacheEvent)]
    return names, [[event[name] for name in names] for event in events]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        service = start_warehouse(Path(tmp) / "data")
        start_s = time.perf_counter() - started
        try:
            settings = ClickHouseSettings(url=service.info["url"])
            apply_migrations(connect(settings, database="default"), "scache")
            client = connect(settings)
            names, rows = _events(10_000)
            client.insert("events_raw", rows[:100], column_names=names)  # warm-up
            timings = []
            for _ in range(5):
                begin = time.perf_counter()
                client.insert("events_raw", rows, column_names=names)
                timings.append(time.perf_counter() - begin)
            latencies = []
            for _ in range(200):
                begin = time.perf_counter()
                client.query("SELECT 1")
                latencies.append((time.perf_counter() - begin) * 1000)
            agg = []
            for _ in range(50):
                begin = time.perf_counter()
                client.query("SELECT arm, count(), avg(similarity) FROM events_raw FINAL "
                             "WHERE experiment_id = {e:String} GROUP BY arm", parameters={"e": "bench"})
                agg.append((time.perf_counter() - begin) * 1000)
        finally:
            service.stop()
    best = min(timings)
    print(f"warehouse start (spawn -> /ping ok): {start_s:.2f} s")
    print(f"10k-row Native insert (lz4, events_raw): median {statistics.median(timings) * 1000:.0f} ms, "
          f"best {best * 1000:.0f} ms = {10_000 / best:,.0f} rows/s")
    print(f"SELECT 1 latency: median {statistics.median(latencies):.2f} ms, p95 {sorted(latencies)[189]:.2f} ms")
    print(f"GROUP BY arm over events_raw FINAL (~50k rows): median {statistics.median(agg):.2f} ms")


if __name__ == "__main__":
    main()
