"""judge_train --warehouse reads the traffic's verdicts from the real (embedded) warehouse: each
user or shadow verdict joined to its lookup's event, which names both questions (schema 9)."""
from __future__ import annotations

import time
import uuid
from collections import Counter

from cache_core.decision.judge_verdicts import warehouse_pairs
from cache_core.events import CacheEvent, clickhouse_columns

import pytest

pytestmark = pytest.mark.integration


def _event(request_id: str, query: str | None, cached: str | None, ts_ms: int) -> dict:
    event = CacheEvent(request_id=request_id, ts_ms=ts_ms, experiment_id="e", arm="a", unit_id="u",
                       decision="hit", hit=True, query_text=query, matched_query_text=cached)
    return event.model_dump()


def test_verdicts_become_pairs_with_the_users_winning(ch_settings, ch_client):
    # The session's warehouse holds other tests' verdicts too: count what this test adds.
    before = warehouse_pairs(ch_settings, days=1)
    now = int(time.time() * 1000)
    run = uuid.uuid4().hex[:8]
    r1, r2, r3, r4 = (f"{run}-{i}" for i in range(1, 5))
    events = [_event(r1, "how do i reset my pin", "reset my pin please", now),
              _event(r2, "how do i close my account", "how do i open an account", now),
              _event(r3, "why was my card declined", "card declined why", now),
              _event(r4, None, None, now)]
    columns = [name for name, _ in clickhouse_columns(CacheEvent)]
    ch_client.insert("events_raw", [[e[c] for c in columns] for e in events], column_names=columns)
    verdicts = ["schema_version", "request_id", "verdict", "ts_ms", "source"]
    ch_client.insert("feedback_raw", [[1, r1, "correct", now, "user"], [1, r3, "wrong", now, "user"],
                                      [1, r4, "correct", now, "user"]], column_names=verdicts)
    ch_client.insert("shadow_feedback_raw", [[1, r2, "wrong", now, "shadow"], [1, r3, "correct", now, "shadow"]],
                     column_names=verdicts)

    found = warehouse_pairs(ch_settings, days=1)

    added = Counter(found.pairs) - Counter(before.pairs)
    assert sorted(added.elements()) == [("card declined why", "why was my card declined", 0),
                                        ("how do i open an account", "how do i close my account", 0),
                                        ("reset my pin please", "how do i reset my pin", 1)]
    grew = {k: found.by_source.get(k, 0) - before.by_source.get(k, 0) for k in ("user", "shadow")}
    assert grew == {"user": 2, "shadow": 1} and found.without_text - before.without_text == 1
