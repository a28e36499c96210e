"""Known CacheEvents for the attribution job test, and the totals the job must produce.

The reference is computed in plain Python with the same udfs functions the job uses.
"""
from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable

from kafka import KafkaProducer

from cache_core.events import CacheEvent, FeedbackEvent
from udfs.buckets import LATENCY_BUCKETS, latency_bucket_index, lifetime_bucket
from udfs.decay import sim_decay

ARMS = (("exp-a", "control"), ("exp-a", "treatment"), ("exp-b", "only"))
LATENCIES_MS = (0.4, 1.0, 3.0, 7.5, 15.0, 42.0, 90.0, 150.0, 420.0, 999.0, 1500.0, 4200.0, 9000.0)
AGES_S = (None, 0.0, 100.0, 1300.0, 2500.0, 3600.0, 3700.0, 5000.0)


def make_events(base_ms: int, window_s: int, n: int = 180, seed: int = 7,
                suffix: str = "") -> list[CacheEvent]:
    """Decisions spread over two windows from ``base_ms``: arms, clusters, hits, ages, edge cases."""
    rng = random.Random(seed)
    events = []
    for i in range(n):
        experiment_id, arm = ARMS[i % len(ARMS)]
        hit = rng.random() < 0.55
        age = rng.choice(AGES_S)
        similarity = rng.choice((None, round(rng.uniform(0.3, 1.0), 4))) if not hit \
            else round(rng.uniform(0.8, 1.0), 4)
        if i == 5:
            similarity = 1.5  # a data error: decays to None, still counted as a request
        checked = rng.random() < 0.3
        events.append(CacheEvent(
            ts_ms=base_ms + rng.randrange(0, 2 * window_s * 1000),
            experiment_id=experiment_id + suffix, arm=arm, unit_id=f"u{i % 23}",
            namespace=rng.choice(("default", "tenant-x")), config_version=1 + i % 2,
            decision="hit" if hit else "miss", hit=hit, threshold=0.8, similarity=similarity,
            intent_cluster=rng.randrange(0, 4), entry_id=None if age is None else f"e{i}",
            entry_age_s=age, entry_ttl_s=None if age is None else 3600.0,
            index_kind=rng.choice(("flat", "hnsw")), ann_checked=checked,
            ann_agree=(rng.random() < 0.9) if checked else None,
            guard="negation" if (not hit and rng.random() < 0.1) else None,
            latency_ms=rng.choice(LATENCIES_MS), variant=rng.choice(("base", "base", "canary")),
            # The tier a hit came from (no rng draw); None: logged before events carried it (memory).
            tier=(("disk" if i % 3 == 0 else "memory" if i % 4 else None) if hit else None),
            # exp-b's arm re-ranks by mixed score (no rng draw: the other fields stay as they were).
            **(multi_fields(i, similarity) if experiment_id == "exp-b" else {}),
        ))
    # In event-time order, as a cache produces them (the job drops events later than the
    # watermark delay from its windows; see jobs/attribution_job.py).
    return sorted(events, key=lambda e: e.ts_ms)


def multi_fields(i: int, similarity: float | None) -> dict:
    """A multi arm's score / score_margin (null when nothing passed the gate / no rival)."""
    score = None if similarity is None or i % 7 == 0 else round(similarity - 0.01 * (i % 5), 4)
    return {"similarity_mode": "multi", "score": score,
            "score_margin": None if score is None or i % 2 else round(0.001 * i, 4)}


def warehouse_raw_scores(client, request_ids: list[str]) -> dict[str, tuple]:
    """events_raw FINAL: request_id -> (similarity_mode, score, score_margin)."""
    rows = client.query("SELECT request_id, similarity_mode, score, score_margin FROM events_raw FINAL"
                        " WHERE request_id IN {ids:Array(String)}", parameters={"ids": request_ids})
    return {rid: (mode, score, margin) for rid, mode, score, margin in rows.result_rows}


def heartbeats(ts_ms: int, partitions: int) -> list[tuple[int, CacheEvent]]:
    """One heartbeat per partition at ``ts_ms``: moves every partition's watermark past it."""
    return [(p, CacheEvent(event_type="heartbeat", ts_ms=ts_ms, instance_id="test"))
            for p in range(partitions)]


class Heartbeating:
    """A cache replica's heartbeats while a test waits: one per partition per call, each a
    second later than the last, from ``after_ms`` on.

    In service every cache heartbeats every 2 s. A test that sends one closing heartbeat and
    then goes quiet is a stricter world than production: after a task failover (a loaded CI
    machine makes them) the restored job needs traffic on the events topic to move its
    watermark and re-arm the sink's flush timers (see jobs/clickhouse_sink.py)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, after_ms: int):
        self._bootstrap, self._topic, self._partitions = bootstrap, topic, partitions
        self._next_ms = after_ms

    def __call__(self) -> None:
        self._next_ms += 1000
        produce(self._bootstrap, self._topic, [], heartbeats(self._next_ms, self._partitions))


def produce(bootstrap: str, topic: str, events: Iterable[CacheEvent],
            pinned: Iterable[tuple[int, CacheEvent]] = ()) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for event in events:
            producer.send(topic, key=event.kafka_key(), value=event.model_dump_json().encode())
        for partition, event in pinned:
            producer.send(topic, key=event.kafka_key(), value=event.model_dump_json().encode(),
                          partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close()


def expected_totals(events: Iterable[CacheEvent]) -> dict[tuple[str, str], dict]:
    """Per (experiment_id, arm): what ``window_agg FINAL`` must add up to."""
    totals: dict[tuple[str, str], dict] = defaultdict(_empty_totals)
    for e in events:
        if e.event_type == "heartbeat":
            continue
        t = totals[(e.experiment_id, e.arm)]
        t["requests"] += 1
        t["hits"] += int(e.hit)
        if e.hit:
            t["decayed_hits"] += sim_decay(e.similarity, e.entry_age_s) or 0.0
        t["ann_checks"] += int(e.ann_checked)
        t["ann_agreements"] += int(e.ann_checked and e.ann_agree is True)
        t["guard_blocks"] += int(e.guard is not None)
        t["similarity_count"] += int(e.similarity is not None)
        index = latency_bucket_index(e.latency_ms)
        if index is not None:
            t["latency_hist"][index] += 1
        t["lifetime_buckets"].add(lifetime_bucket(e.entry_age_s, e.entry_ttl_s))
    return dict(totals)


def _empty_totals() -> dict:
    return {"requests": 0, "hits": 0, "decayed_hits": 0.0, "ann_checks": 0, "ann_agreements": 0,
            "guard_blocks": 0, "similarity_count": 0, "latency_hist": [0] * LATENCY_BUCKETS,
            "lifetime_buckets": set()}


def warehouse_totals(client, experiment_ids: list[str]) -> dict[tuple[str, str], dict]:
    """The same totals, summed from ``window_agg FINAL``."""
    result = client.query(
        "SELECT experiment_id, arm, lifetime_bucket, requests, hits, decayed_hits, ann_checks,"
        " ann_agreements, guard_blocks, similarity_count, latency_hist"
        " FROM window_agg FINAL WHERE experiment_id IN {ids:Array(String)}",
        parameters={"ids": experiment_ids})
    totals: dict[tuple[str, str], dict] = defaultdict(_empty_totals)
    for (exp, arm, bucket, requests, hits, decayed, checks, agreements, guards, sims,
         hist) in result.result_rows:
        t = totals[(exp, arm)]
        t["requests"] += requests
        t["hits"] += hits
        t["decayed_hits"] += decayed
        t["ann_checks"] += checks
        t["ann_agreements"] += agreements
        t["guard_blocks"] += guards
        t["similarity_count"] += sims
        t["latency_hist"] = [a + b for a, b in zip(t["latency_hist"], hist)]
        t["lifetime_buckets"].add(bucket)
    return dict(totals)


# -- full-key references (every window_agg / late_events / feedback_agg row) ----------

def _window_start(ts_ms: int, window_s: int) -> int:
    return ts_ms - ts_ms % (window_s * 1000)


def unique(events: Iterable[CacheEvent]) -> list[CacheEvent]:
    """First copy of each request_id (the job dedupes the at-least-once publisher's repeats)."""
    seen: dict[str, CacheEvent] = {}
    for e in events:
        seen.setdefault(e.request_id, e)
    return list(seen.values())


def expected_windows(events: Iterable[CacheEvent], window_s: int) -> dict[tuple, dict]:
    """window_agg FINAL, keyed by (window_start_ms, experiment_id, arm, variant, namespace,
    config_version, intent_cluster, index_kind, lifetime_bucket)."""
    rows: dict[tuple, dict] = {}
    for e in unique(events):
        key = (_window_start(e.ts_ms, window_s), e.experiment_id, e.arm, e.variant, e.namespace,
               e.config_version, e.intent_cluster, e.index_kind,
               lifetime_bucket(e.entry_age_s, e.entry_ttl_s))
        r = rows.setdefault(key, {"requests": 0, "hits": 0, "disk_hits": 0, "decayed_hits": 0.0, "similarity_sum": 0.0,
                                  "similarity_count": 0, "ann_checks": 0, "ann_agreements": 0,
                                  "guard_blocks": 0, "latency_sum_ms": 0.0,
                                  "latency_hist": [0] * LATENCY_BUCKETS})
        r["requests"] += 1
        r["hits"] += int(e.hit)
        r["disk_hits"] += int(e.hit and e.tier == "disk")
        if e.hit:
            r["decayed_hits"] += sim_decay(e.similarity, e.entry_age_s) or 0.0
        r["similarity_sum"] += e.similarity or 0.0
        r["similarity_count"] += int(e.similarity is not None)
        r["ann_checks"] += int(e.ann_checked)
        r["ann_agreements"] += int(e.ann_checked and e.ann_agree is True)
        r["guard_blocks"] += int(e.guard is not None)
        r["latency_sum_ms"] += e.latency_ms
        index = latency_bucket_index(e.latency_ms)
        if index is not None:
            r["latency_hist"][index] += 1
    return {k: _rounded(v) for k, v in rows.items()}


def _rounded(row: dict) -> dict:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()}


def warehouse_windows(client, experiment_ids: list[str]) -> dict[tuple, dict]:
    result = client.query(
        "SELECT toUnixTimestamp64Milli(window_start), experiment_id, arm, variant, namespace, config_version,"
        " intent_cluster, index_kind, lifetime_bucket, requests, hits, disk_hits, decayed_hits, similarity_sum,"
        " similarity_count, ann_checks, ann_agreements, guard_blocks, latency_sum_ms, latency_hist"
        " FROM window_agg FINAL WHERE experiment_id IN {ids:Array(String)}", parameters={"ids": experiment_ids})
    names = ["requests", "hits", "disk_hits", "decayed_hits", "similarity_sum", "similarity_count", "ann_checks",
             "ann_agreements", "guard_blocks", "latency_sum_ms", "latency_hist"]
    return {tuple(row[:9]): _rounded(dict(zip(names, row[9:]))) for row in result.result_rows}


def expected_late(events: Iterable[CacheEvent], window_s: int) -> dict[tuple, int]:
    """late_events FINAL: (window_start_ms, experiment_id, arm) -> late_count."""
    counts: dict[tuple, int] = defaultdict(int)
    for e in unique(events):
        counts[(_window_start(e.ts_ms, window_s), e.experiment_id, e.arm)] += 1
    return dict(counts)


def warehouse_late(client, experiment_ids: list[str]) -> dict[tuple, int]:
    rows = client.query(
        "SELECT toUnixTimestamp64Milli(window_start), experiment_id, arm, late_count FROM late_events FINAL"
        " WHERE experiment_id IN {ids:Array(String)}", parameters={"ids": experiment_ids}).result_rows
    return {tuple(r[:3]): r[3] for r in rows if r[3]}


def expected_feedback(decisions: Iterable[CacheEvent], feedback: Iterable[FeedbackEvent],
                      window_s: int, join_s: int) -> dict[tuple, tuple[int, int]]:
    """feedback_agg FINAL: the latest verdict per request and source, joined to its hit when it came
    within join_s after it, per (feedback window, decision dimensions, source) -> (correct, wrong)."""
    hits = {e.request_id: e for e in unique(decisions) if e.hit and e.event_type == "decision"}
    latest: dict[tuple[str, str], FeedbackEvent] = {}
    for f in feedback:  # produced in order, so the last one produced is the latest
        d = hits.get(f.request_id)
        if d is not None and d.ts_ms <= f.ts_ms <= d.ts_ms + join_s * 1000:
            latest[(f.request_id, f.source)] = f
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for (rid, source), f in latest.items():
        d = hits[rid]
        key = (_window_start(f.ts_ms, window_s), d.experiment_id, d.arm, d.variant, d.namespace,
               d.config_version, d.intent_cluster, source)
        counts[key][0 if f.verdict == "correct" else 1] += 1
    return {k: tuple(v) for k, v in counts.items()}


def warehouse_feedback(client, experiment_ids: list[str]) -> dict[tuple, tuple[int, int]]:
    rows = client.query(
        "SELECT toUnixTimestamp64Milli(window_start), experiment_id, arm, variant, namespace, config_version,"
        " intent_cluster, source, correct, wrong FROM feedback_agg FINAL WHERE experiment_id IN {ids:Array(String)}",
        parameters={"ids": experiment_ids}).result_rows
    return {tuple(r[:8]): (r[8], r[9]) for r in rows if r[8] or r[9]}


def produce_feedback(bootstrap: str, topic: str, feedback: Iterable[FeedbackEvent]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for f in feedback:
            producer.send(topic, key=f.kafka_key(), value=f.model_dump_json().encode())
        producer.flush(timeout=30)
    finally:
        producer.close()


def jittered(events: list[CacheEvent], max_back_ms: int, seed: int = 3) -> list[CacheEvent]:
    """Out of order by at most ``max_back_ms``: no event follows one more than that newer."""
    rng = random.Random(seed)
    return sorted(events, key=lambda e: e.ts_ms - rng.randrange(0, max_back_ms))
