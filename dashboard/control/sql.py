"""The SQL text behind ``queries``: fixed at import time, values bound server-side.

Every value from the UI reaches ClickHouse as a server-side parameter (``{name:Type}``
here, ``parameters=`` in clickhouse-connect); column names only ever come from closed
vocabularies (``BREAKDOWNS``). ``window_agg`` is a ReplacingMergeTree, so every read of
it uses FINAL: a window re-emitted after a restart must count once. ``COLUMNS`` holds
each query's output columns (an empty result carries none).
"""
from __future__ import annotations

from typing import Literal


Breakdown = Literal["intent_cluster", "lifetime_bucket", "index_kind"]


BREAKDOWNS: tuple[Breakdown, ...] = ("intent_cluster", "lifetime_bucket", "index_kind")


# Shared WHERE clause of the window_agg queries (a constant, not user input).
_WINDOW_FILTER = """
WHERE experiment_id = {experiment_id:String}
  AND window_start >= fromUnixTimestamp64Milli({start_ms:Int64}, 'UTC')
  AND window_start < fromUnixTimestamp64Milli({end_ms:Int64}, 'UTC')
  AND ({namespace:String} = '' OR namespace = {namespace:String})
"""


_SUMS = ["requests", "hits", "decayed_hits", "similarity_sum", "similarity_count",
         "ann_checks", "ann_agreements"]
"""The counters the arm summary and every breakdown add up (and ``COLUMNS`` expects of them)."""


_SUMS_SQL = ",\n".join(f"       sum({c}) AS {c}" for c in _SUMS)


ARM_SUMMARY_SQL = f"""
SELECT arm,
{_SUMS_SQL},
       sum(guard_blocks) AS guard_blocks,
       sum(latency_sum_ms) AS latency_sum_ms
FROM window_agg FINAL
{_WINDOW_FILTER}
GROUP BY arm
ORDER BY arm
"""


TIER_HITS_SQL = f"""
SELECT arm,
       sum(requests) AS requests,
       sum(hits) - sum(disk_hits) AS hits_memory,
       sum(disk_hits) AS hits_disk
FROM window_agg FINAL
{_WINDOW_FILTER}
GROUP BY arm
ORDER BY arm
"""
"""Per arm: requests and the hits each store tier served (window_agg.disk_hits, migration 0014)."""


LATENCY_HIST_SQL = f"""
SELECT arm, sum(requests) AS requests, sumForEach(latency_hist) AS latency_hist
FROM window_agg FINAL
{_WINDOW_FILTER}
GROUP BY arm
ORDER BY arm
"""


TIMESERIES_SQL = f"""
SELECT arm,
       toStartOfInterval(window_start, toIntervalSecond({{bucket_s:UInt32}}), 'UTC') AS bucket,
       sum(requests) AS requests,
       sum(hits) AS hits,
       sum(latency_sum_ms) AS latency_sum_ms,
       sumForEach(latency_hist) AS latency_hist
FROM window_agg FINAL
{_WINDOW_FILTER}
GROUP BY arm, bucket
ORDER BY bucket, arm
"""


_BREAKDOWN_TEMPLATE = """
SELECT arm,
       {dimension},
{sums}
FROM window_agg FINAL
{where}
GROUP BY arm, {dimension}
ORDER BY arm, {dimension}
"""


# Built once from the closed BREAKDOWNS vocabulary: column names never come from input.
BREAKDOWN_SQL: dict[str, str] = {
    dim: _BREAKDOWN_TEMPLATE.format(dimension=dim, sums=_SUMS_SQL, where=_WINDOW_FILTER)
    for dim in BREAKDOWNS
}


NAMESPACES_SQL = """
SELECT DISTINCT namespace FROM window_agg
WHERE experiment_id = {experiment_id:String}
ORDER BY namespace
"""


# Multi-similarity arms (ArmConfig.similarity="multi") serve a candidate only if it
# passes the cosine threshold AND its mixed score reaches the arm's floor AND it leads
# the best candidate with another answer by the arm's answer margin. Events log
# `score` / `score_margin` of the best-ranked candidate past the cosine gate *at
# decision time* (cache_core.events.CacheEvent), and whether that one passes decides
# for all the others, so the floor and margin of the arm's current config can be
# re-applied offline (same weights, guards aside). The arms, floors and margins come
# in as three parallel array parameters (MultiRule); the rule applies to rows logged
# in multi mode of arms that are multi now. Rows with similarity_mode '' (written
# before migration 0003) or 'cosine' keep the plain cosine reading.
# The WITH prefix below names, per row: multi_row (the rule applies), the arm's
# score_floor / answer_margin, and multi_refused: no candidate past the cosine gate
# (score NULL), a score under the floor, or a rival answer closer than the margin (no
# rival: score_margin NULL, never refused by the margin).
_MULTI_WITH = """WITH similarity_mode = 'multi' AND has({multi_arms:Array(String)}, arm) AS multi_row,
     transform(arm, {multi_arms:Array(String)}, {score_floors:Array(Float64)}, 0.) AS score_floor,
     transform(arm, {multi_arms:Array(String)}, {answer_margins:Array(Float64)}, 0.) AS answer_margin,
     ifNull(score < score_floor, true) OR ifNull(score_margin < answer_margin, false) AS multi_refused"""


_DECISIONS_FILTER = """
WHERE event_type = 'decision'
  AND decision IN ('hit', 'miss')
  AND experiment_id = {experiment_id:String}
  AND ts_ms >= {start_ms:Int64} AND ts_ms < {end_ms:Int64}
  AND ({namespace:String} = '' OR namespace = {namespace:String})
"""


# Similarities of real decisions (holdout bypasses and heartbeats excluded), binned
# at SIMILARITY_BIN. A NULL bin is a lookup against an empty index: a miss at any threshold.
# multi_blocks: decisions of multi arms the current score floor / margin refuse (and no
# guard blocked: those are guard_blocks already), so servable = decisions - guard_blocks
# - multi_blocks at any cosine threshold t >= the logged one. multi_min_threshold: the
# lowest cosine threshold those rows were logged at (NULL: no multi rows). Below it the
# what-if cannot be replayed: candidates between t and the logged threshold were never
# ranked (they could have won, or been the rival), so tuning marks such t unsupported.
# (If the threshold changed within the range, rows logged at a higher one are read as
# if they had been logged at t: the bound is the lowest, not each row's own.)
SIMILARITY_HIST_SQL = f"""
{_MULTI_WITH}
SELECT arm,
       intent_cluster,
       toInt64(floor(similarity * 1000 + 1e-9)) AS similarity_milli,
       count() AS decisions,
       countIf(hit) AS hits,
       countIf(guard IS NOT NULL) AS guard_blocks,
       countIf(guard IS NULL AND multi_row AND multi_refused) AS multi_blocks,
       minIf(threshold, multi_row) AS multi_min_threshold
FROM events_raw FINAL
{_DECISIONS_FILTER}
GROUP BY arm, intent_cluster, similarity_milli
ORDER BY arm, intent_cluster, similarity_milli
"""


# Feedback-labelled hits per similarity bin: the what-if false-hit rate at t counts
# the labelled hits with similarity >= t (for multi arms: those the current floor and
# margin would still serve), by the threshold logged with each (threshold_milli: the
# candidate t counts only labels of decisions logged at or below t). Both tables are replacing: FINAL on each.
LABELLED_SIMILARITY_SQL = f"""
SELECT e.arm AS arm,
       e.intent_cluster AS intent_cluster,
       toInt64(floor(e.similarity * 1000 + 1e-9)) AS similarity_milli,
       toInt64(round(ifNull(e.threshold, 0) * 1000)) AS threshold_milli,
       countIf(f.verdict = 'correct') AS correct,
       countIf(f.verdict = 'wrong') AS wrong
FROM (
    {_MULTI_WITH}
    SELECT request_id, arm, intent_cluster, similarity, threshold FROM events_raw FINAL
    {_DECISIONS_FILTER}
      AND decision = 'hit' AND similarity IS NOT NULL
      AND NOT (multi_row AND multi_refused)
) AS e
INNER JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS f USING (request_id)
GROUP BY arm, intent_cluster, similarity_milli, threshold_milli
ORDER BY arm, intent_cluster, similarity_milli, threshold_milli
"""


# Multi arms' decisions by answer margin (at SIMILARITY_BIN; NULL = no rival answer past the
# cosine gate), at the cosine thresholds as logged, keeping only those whose score
# reaches the current floor and that no guard blocked: a decision is served at margin
# m iff its bin is NULL or >= m. Exact at the logged cosine gate (the margin changes
# eligibility, not ranking), guards aside: a decision the margin refused never met the
# guards. correct / wrong: its feedback-labelled hits.
MULTI_MARGIN_SQL = f"""
SELECT e.arm AS arm,
       e.margin_milli AS margin_milli,
       count() AS decisions,
       countIf(e.hit AND f.verdict = 'correct') AS correct,
       countIf(e.hit AND f.verdict = 'wrong') AS wrong
FROM (
    {_MULTI_WITH}
    SELECT request_id, arm, hit, toInt64(floor(score_margin * 1000 + 1e-9)) AS margin_milli
    FROM events_raw FINAL
    {_DECISIONS_FILTER}
      AND multi_row AND guard IS NULL AND ifNull(score >= score_floor, false)
) AS e
LEFT JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS f USING (request_id)
GROUP BY arm, margin_milli
ORDER BY arm, margin_milli
"""


# Multi arms' decisions by config version x mixed-score bin x answer-margin bin (NULL score:
# nothing past the cosine gate, or not logged in multi mode; NULL margin: no rival answer),
# at the cosine thresholds as logged, for auto-tuning the score floor and margin together:
# a decision is served at (f, m) iff it is servable (multi mode, no guard veto, a score)
# and its score bin >= f and its margin bin is NULL or >= m. The config version tells which
# floor / margin were in force (tuning.multi_replay_limits). correct / wrong: labelled hits.
MULTI_SCORE_SQL = f"""
SELECT e.arm AS arm,
       e.config_version AS config_version,
       e.score_milli AS score_milli,
       e.margin_milli AS margin_milli,
       count() AS decisions,
       countIf(e.servable) AS servable,
       countIf(e.hit AND f.verdict = 'correct') AS correct,
       countIf(e.hit AND f.verdict = 'wrong') AS wrong
FROM (
    SELECT request_id, arm, config_version, hit,
           similarity_mode = 'multi' AND guard IS NULL AND score IS NOT NULL AS servable,
           if(similarity_mode = 'multi', toInt64(floor(score * 1000 + 1e-9)), NULL) AS score_milli,
           if(similarity_mode = 'multi', toInt64(floor(score_margin * 1000 + 1e-9)), NULL) AS margin_milli
    FROM events_raw FINAL
    {_DECISIONS_FILTER}
      AND has({{multi_arms:Array(String)}}, arm)
) AS e
LEFT JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS f USING (request_id)
GROUP BY arm, config_version, score_milli, margin_milli
ORDER BY arm, config_version, score_milli, margin_milli
"""


# Users' verdicts only: shadow checks' are counted apart (source 'shadow', migration 0007), see
# dashboard.control.sql_verdicts. Every estimate that reads feedback_agg or feedback_raw rests on users' verdicts.
# Rows from before 0007 have source '' (users').
_FEEDBACK_FILTER = _WINDOW_FILTER + "  AND source <> 'shadow'\n"


FALSE_HITS_SQL = f"""
SELECT arm, variant, sum(correct) AS correct, sum(wrong) AS wrong
FROM feedback_agg FINAL
{_FEEDBACK_FILTER}
GROUP BY arm, variant
ORDER BY arm, variant
"""


FALSE_HITS_TIMESERIES_SQL = f"""
SELECT arm,
       toStartOfInterval(window_start, toIntervalSecond({{bucket_s:UInt32}}), 'UTC') AS bucket,
       sum(correct) AS correct,
       sum(wrong) AS wrong
FROM feedback_agg FINAL
{_FEEDBACK_FILTER}
GROUP BY arm, bucket
ORDER BY bucket, arm
"""


VARIANT_SUMMARY_SQL = f"""
SELECT arm, variant, sum(requests) AS requests, sum(hits) AS hits
FROM window_agg FINAL
{_WINDOW_FILTER}
GROUP BY arm, variant
ORDER BY arm, variant
"""


# A canary vs its arm's base units since the canary started, by decision time,
# from the raw tables so an earlier canary of the same arm never leaks in.
CANARY_SQL = """
SELECT e.variant AS variant,
       count() AS decisions,
       countIf(e.hit) AS hits,
       countIf(f.verdict = 'correct') AS correct,
       countIf(f.verdict = 'wrong') AS wrong
FROM (
    SELECT request_id, variant, hit FROM events_raw FINAL
    WHERE event_type = 'decision' AND decision IN ('hit', 'miss')
      AND experiment_id = {experiment_id:String} AND arm = {arm:String}
      AND ts_ms >= {since_ms:Int64}
) AS e
LEFT JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS f USING (request_id)
GROUP BY variant
ORDER BY variant
"""


LAST_CHANGES_SQL = """
SELECT arm, max(ts) AS last_change, argMax(new_version, ts) AS version
FROM threshold_changes
WHERE experiment_id = {experiment_id:String}
GROUP BY arm
ORDER BY arm
"""


AUDITED_VERSIONS_SQL = """
SELECT DISTINCT new_version
FROM threshold_changes
WHERE experiment_id = {experiment_id:String}
"""


TOPIC_AUDIT_NOTE = "[audited from the control topic]"
"""Ends the reason of audit rows written from the control topic (publishing.sync_audit)."""


# One row per version and arm: a sync racing the pusher's own audit write may have written
# both; the pusher's row (not marked TOPIC_AUDIT_NOTE) is kept.
CHANGE_HISTORY_SQL = f"""
SELECT ts, arm, actor, old_threshold, new_threshold, old_version, new_version,
       reason, canary_share, config_json
FROM threshold_changes
WHERE experiment_id = {{experiment_id:String}}
ORDER BY new_version DESC, ts DESC, arm, endsWith(reason, '{TOPIC_AUDIT_NOTE}')
LIMIT 1 BY new_version, arm
LIMIT {{limit:UInt32}}
"""


LATE_EVENTS_SQL = """
SELECT arm, sum(late_count) AS late_events
FROM late_events
WHERE experiment_id = {experiment_id:String}
  AND window_start >= fromUnixTimestamp64Milli({start_ms:Int64}, 'UTC')
  AND window_start < fromUnixTimestamp64Milli({end_ms:Int64}, 'UTC')
GROUP BY arm
ORDER BY arm
"""


THRESHOLD_CHANGES_SQL = """
SELECT ts, experiment_id, arm, old_threshold, new_threshold,
       old_version, new_version, actor, reason
FROM threshold_changes
WHERE experiment_id = {experiment_id:String}
  AND ts >= fromUnixTimestamp64Milli({start_ms:Int64}, 'UTC')
  AND ts < fromUnixTimestamp64Milli({end_ms:Int64}, 'UTC')
ORDER BY ts
"""


# Experiments known to the warehouse: defined ones (latest version) and any that
# only appear in the aggregates (e.g. defined before the table existed).
EXPERIMENTS_SQL = """
SELECT experiment_id, max(v) AS version, argMax(cfg, v) AS config_json
FROM (
    SELECT experiment_id, version AS v, config_json AS cfg FROM experiments FINAL
    UNION ALL
    SELECT DISTINCT toString(experiment_id), toInt64(0) AS v, '' AS cfg FROM window_agg
)
WHERE experiment_id != ''
GROUP BY experiment_id
ORDER BY experiment_id
"""


# What an intent cluster is about, in words: its most frequent query texts in the range
# (topK counts approximately; good enough for examples), shortened. Only decisions whose
# text the cache emitted (SCACHE_CACHE__EMIT_QUERY_TEXT, off by default) have one; without
# them the result is empty and the dashboard shows bare cluster ids. No FINAL: a decision
# sent twice only weighs twice among examples, and this scan reads every text in the range.
EXAMPLES_PER_CLUSTER = 3


EXAMPLE_CHARS = 160


CLUSTER_EXAMPLES_SQL = f"""
SELECT intent_cluster,
       topK({EXAMPLES_PER_CLUSTER})(substringUTF8(assumeNotNull(query_text), 1, {EXAMPLE_CHARS})) AS examples,
       count() AS texts
FROM events_raw
{_DECISIONS_FILTER}
  AND query_text IS NOT NULL AND query_text != ''
GROUP BY intent_cluster
ORDER BY intent_cluster
"""


COLUMNS: dict[str, list[str]] = {
    ARM_SUMMARY_SQL: ["arm", *_SUMS, "guard_blocks", "latency_sum_ms"],
    LATENCY_HIST_SQL: ["arm", "requests", "latency_hist"],
    TIER_HITS_SQL: ["arm", "requests", "hits_memory", "hits_disk"],
    TIMESERIES_SQL: ["arm", "bucket", "requests", "hits", "latency_sum_ms", "latency_hist"],
    **{sql: ["arm", dim, *_SUMS] for dim, sql in BREAKDOWN_SQL.items()},
    SIMILARITY_HIST_SQL: ["arm", "intent_cluster", "similarity_milli", "decisions", "hits", "guard_blocks",
                          "multi_blocks", "multi_min_threshold"],
    LABELLED_SIMILARITY_SQL: ["arm", "intent_cluster", "similarity_milli", "threshold_milli", "correct", "wrong"],
    CLUSTER_EXAMPLES_SQL: ["intent_cluster", "examples", "texts"],
    MULTI_MARGIN_SQL: ["arm", "margin_milli", "decisions", "correct", "wrong"],
    MULTI_SCORE_SQL: ["arm", "config_version", "score_milli", "margin_milli", "decisions", "servable", "correct",
                      "wrong"],
    FALSE_HITS_SQL: ["arm", "variant", "correct", "wrong"],
    FALSE_HITS_TIMESERIES_SQL: ["arm", "bucket", "correct", "wrong"],
    VARIANT_SUMMARY_SQL: ["arm", "variant", "requests", "hits"],
    CANARY_SQL: ["variant", "decisions", "hits", "correct", "wrong"],
    LAST_CHANGES_SQL: ["arm", "last_change", "version"],
    CHANGE_HISTORY_SQL: ["ts", "arm", "actor", "old_threshold", "new_threshold", "old_version",
                         "new_version", "reason", "canary_share", "config_json"],
    LATE_EVENTS_SQL: ["arm", "late_events"],
    THRESHOLD_CHANGES_SQL: ["ts", "experiment_id", "arm", "old_threshold", "new_threshold",
                            "old_version", "new_version", "actor", "reason"],
    EXPERIMENTS_SQL: ["experiment_id", "version", "config_json"],
}
"""Output columns of each query: an empty result carries no column names."""
