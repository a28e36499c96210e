"""Labelled pairs from the traffic itself: the warehouse's user and shadow verdicts, each joined to
its lookup's event, as ``(cached_query, query, label)`` rows for ``judge_train --warehouse``.

A verdict says whether the answer of the entry served (or, for a shadow check of a near-miss,
of the nearest entry) fitted the question asked. The event names both questions when the
replicas run with ``SCACHE_CACHE__EMIT_QUERY_TEXT=true`` (``query_text``, ``matched_query_text``;
warehouse schema version 9); events without them are skipped and counted. Near-miss shadow
verdicts are the hard cases a cosine threshold gets wrong from below, and served hits judged
"wrong" the ones it gets wrong from above: the pairs a judge most needs, mined from the
cache's own traffic rather than from public sets.

When a request has a user's verdict and a shadow verdict, the user's wins (it judged the
answer the user actually saw).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Only events that name both questions are read and grouped: a verdict whose event does not (or
# that has none) finds no match in the LEFT JOIN and is counted as without text all the same.
PAIRS_SQL = """
SELECT v.request_id, v.source, v.verdict, e.asked, e.cached
FROM (
    SELECT request_id, 'user' AS source, argMax(verdict, ts_ms) AS verdict
    FROM feedback_raw WHERE source != 'shadow' AND ts >= now() - toIntervalDay({days:UInt32})
    GROUP BY request_id
    UNION ALL
    SELECT request_id, 'shadow' AS source, argMax(verdict, ts_ms) AS verdict
    FROM shadow_feedback_raw WHERE ts >= now() - toIntervalDay({days:UInt32})
    GROUP BY request_id
) AS v
LEFT JOIN (
    SELECT request_id, any(query_text) AS asked, any(matched_query_text) AS cached
    FROM events_raw WHERE ts >= now() - toIntervalDay({days:UInt32}) AND decision != 'heartbeat'
      AND query_text IS NOT NULL AND matched_query_text IS NOT NULL
    GROUP BY request_id
) AS e ON e.request_id = v.request_id
"""


@dataclass(frozen=True)
class WarehousePairs:
    pairs: list[tuple[str, str, int]]
    """(cached_query, query, label), one per request."""
    by_source: dict[str, int]
    """Pairs kept per verdict source ("user", "shadow")."""
    without_text: int
    """Verdicts whose event carried no question texts (emit_query_text off, or no event)."""


def pairs_from_rows(rows) -> WarehousePairs:
    """Fold ``PAIRS_SQL``'s rows (request_id, source, verdict, query, cached_query) into pairs."""
    chosen: dict[str, tuple[str, str, str, str]] = {}
    without_text = 0
    for request_id, source, verdict, query, cached in rows:
        if not query or not cached:
            without_text += 1
            continue
        if request_id not in chosen or source == "user":
            chosen[request_id] = (source, verdict, query, cached)
    by_source: dict[str, int] = {}
    pairs = []
    for source, verdict, query, cached in chosen.values():
        by_source[source] = by_source.get(source, 0) + 1
        pairs.append((cached, query, int(verdict == "correct")))
    return WarehousePairs(pairs, by_source, without_text)


def warehouse_pairs(ch_settings, days: int) -> WarehousePairs:
    """The last ``days`` of verdicts as pairs, read from the ClickHouse in ``ch_settings``."""
    from cache_core.chclient import connect

    client = connect(ch_settings)
    try:
        rows = client.query(PAIRS_SQL, parameters={"days": int(days)}).result_rows
    finally:
        client.close()
    return pairs_from_rows(rows)


class WarehouseUnavailable(RuntimeError):
    """The warehouse could not be read (not reachable, or an older schema)."""


def training_pairs(ch_settings, days: int) -> list[tuple[str, str, int]]:
    """``warehouse_pairs`` for ``judge_train --warehouse``: an unreachable warehouse, or verdicts
    without question texts, raise ``WarehouseUnavailable`` with a one-line reason."""
    try:
        found = warehouse_pairs(ch_settings, days)
    except Exception as exc:  # the client's own errors: connection refused, unknown column, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WarehouseUnavailable(f"cannot read verdicts from {ch_settings.url}: {first}") from None
    log.info("warehouse: %d verdict pairs (%s), %d verdicts without question texts", len(found.pairs),
             found.by_source, found.without_text)
    if found.without_text and not found.pairs:
        raise WarehouseUnavailable(f"{found.without_text} verdicts in the last {days} days, none with question "
                                   "texts: run the replicas with SCACHE_CACHE__EMIT_QUERY_TEXT=true")
    return found.pairs
