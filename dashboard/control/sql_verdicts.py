"""Warehouse reads about verdicts by who gave them and by judge version (issue 25): shadow checks'
verdicts (``shadow_feedback_raw``, apart from the users' ``feedback_raw``) and the judge's hit rate,
false-hit rate and added latency per arm x judge version. Same conventions as ``sql``."""
from __future__ import annotations

from dashboard.control.sql import _DECISIONS_FILTER

# Shadow checks' verdicts (cache_core.shadow) per arm x decision x similarity bin (0.01): on hits an
# estimate of the false-hit rate; on misses (near-misses, verdicts on the nearest candidate's answer)
# the false-hit curve below the threshold. shadow_feedback_raw holds only shadow verdicts.
SHADOW_VERDICTS_SQL = f"""
SELECT e.arm AS arm,
       e.decision AS decision,
       toInt64(floor(e.similarity * 100 + 1e-9)) * 10 AS similarity_milli,
       countIf(f.verdict = 'correct') AS correct,
       countIf(f.verdict = 'wrong') AS wrong
FROM (
    SELECT request_id, arm, decision, similarity FROM events_raw FINAL
    {_DECISIONS_FILTER}
      AND similarity IS NOT NULL
) AS e
INNER JOIN (SELECT request_id, verdict FROM shadow_feedback_raw FINAL) AS f USING (request_id)
GROUP BY arm, decision, similarity_milli
ORDER BY arm, decision, similarity_milli
"""


# Shadow verdicts as the what-if reads them (dashboard.control.shadow_estimates): per arm x intent
# cluster x decision x similarity bin at 0.001 (the bins of sql.SIMILARITY_HIST_SQL). decision 'hit':
# a served answer re-asked upstream; 'miss': a near-miss, the nearest candidate's answer judged.
SHADOW_LABELLED_SQL = f"""
SELECT e.arm AS arm,
       e.intent_cluster AS intent_cluster,
       e.decision AS decision,
       toInt64(floor(e.similarity * 1000 + 1e-9)) AS similarity_milli,
       countIf(f.verdict = 'correct') AS correct,
       countIf(f.verdict = 'wrong') AS wrong
FROM (
    SELECT request_id, arm, intent_cluster, decision, similarity FROM events_raw FINAL
    {_DECISIONS_FILTER}
      AND similarity IS NOT NULL AND guard IS NULL
) AS e
INNER JOIN (SELECT request_id, verdict FROM shadow_feedback_raw FINAL) AS f USING (request_id)
GROUP BY arm, intent_cluster, decision, similarity_milli
ORDER BY arm, intent_cluster, decision, similarity_milli
"""


# A canary's hits as shadow checks judged them (per variant), beside sql.CANARY_SQL's users' verdicts.
CANARY_SHADOW_SQL = """
SELECT e.variant AS variant,
       countIf(f.verdict = 'correct') AS correct,
       countIf(f.verdict = 'wrong') AS wrong
FROM (
    SELECT request_id, variant FROM events_raw FINAL
    WHERE event_type = 'decision' AND decision = 'hit'
      AND experiment_id = {experiment_id:String} AND arm = {arm:String}
      AND ts_ms >= {since_ms:Int64}
) AS e
INNER JOIN (SELECT request_id, verdict FROM shadow_feedback_raw FINAL) AS f USING (request_id)
GROUP BY variant
ORDER BY variant
"""


# Judged decisions per arm x judge version x judge probability bin (0.001) for auto-tuning a judged
# arm's operating point (dashboard.control.tuning_judge): a decision with probability p is served at
# any cut <= p (the cosine floor and the candidates as logged). Hits and judge vetoes only (another
# guard's veto is not the judge's). Users' verdicts on the hits; shadow checks' on the hits and on
# the vetoes (near-miss checks of the answer the judge refused), apart.
JUDGE_PROBABILITY_SQL = f"""
SELECT e.arm AS arm,
       e.judge_version AS judge_version,
       toInt64(floor(e.judge_probability * 1000 + 1e-9)) AS probability_milli,
       count() AS decisions,
       countIf(e.hit) AS hits,
       countIf(e.hit AND u.verdict = 'correct') AS user_correct,
       countIf(e.hit AND u.verdict = 'wrong') AS user_wrong,
       countIf(e.hit AND s.verdict = 'correct') AS shadow_hit_correct,
       countIf(e.hit AND s.verdict = 'wrong') AS shadow_hit_wrong,
       countIf(NOT e.hit AND s.verdict = 'correct') AS shadow_miss_correct,
       countIf(NOT e.hit AND s.verdict = 'wrong') AS shadow_miss_wrong
FROM (
    SELECT request_id, arm, assumeNotNull(judge_version) AS judge_version, assumeNotNull(judge_probability)
           AS judge_probability, hit FROM events_raw FINAL
    {_DECISIONS_FILTER}
      AND ifNull(judge_version, '') != '' AND judge_probability IS NOT NULL
      AND (hit OR guard = 'judge')
) AS e
LEFT JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS u USING (request_id)
LEFT JOIN (SELECT request_id, verdict FROM shadow_feedback_raw FINAL) AS s USING (request_id)
GROUP BY arm, judge_version, probability_milli
ORDER BY arm, judge_version, probability_milli
"""


# Per arm x judge version ('' = no judge) from the decisions: requests, hits, the judge stage's
# latency (judge_ms, NULL where no judge ran: avg / quantile skip NULLs), and the hits' verdicts from
# users and from shadow checks, apart.
JUDGE_VERSIONS_SQL = f"""
SELECT e.arm AS arm,
       ifNull(e.judge_version, '') AS judge_version,
       count() AS requests,
       countIf(e.decision = 'hit') AS hits,
       countIf(e.judge_ms IS NOT NULL) AS judged,
       avg(e.judge_ms) AS judge_ms_mean,
       quantile(0.95)(e.judge_ms) AS judge_ms_p95,
       countIf(e.decision = 'hit' AND u.verdict = 'correct') AS user_correct,
       countIf(e.decision = 'hit' AND u.verdict = 'wrong') AS user_wrong,
       countIf(e.decision = 'hit' AND s.verdict = 'correct') AS shadow_correct,
       countIf(e.decision = 'hit' AND s.verdict = 'wrong') AS shadow_wrong
FROM (
    SELECT request_id, arm, decision, judge_version, judge_ms FROM events_raw FINAL
    {_DECISIONS_FILTER}
) AS e
LEFT JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS u USING (request_id)
LEFT JOIN (SELECT request_id, verdict FROM shadow_feedback_raw FINAL) AS s USING (request_id)
GROUP BY arm, judge_version
ORDER BY arm, judge_version
"""


# Per arm x hour: hits, and how many of them shadow checks judged (wrong): the strata of the
# inclusion-weighted shadow estimate (dashboard.control.shadow_estimate).
SHADOW_STRATA_SQL = f"""
SELECT e.arm AS arm,
       intDiv(e.ts_ms, 3600000) AS epoch_hour,
       count() AS hits,
       countIf(s.verdict != '') AS checked,
       countIf(s.verdict = 'wrong') AS wrong
FROM (
    SELECT request_id, arm, ts_ms FROM events_raw FINAL
    {_DECISIONS_FILTER}
      AND decision = 'hit'
) AS e
LEFT JOIN (SELECT request_id, verdict FROM shadow_feedback_raw FINAL) AS s USING (request_id)
GROUP BY arm, epoch_hour
ORDER BY arm, epoch_hour
"""


HIT_TIERS_SQL = f"""
SELECT e.arm AS arm,
       ifNull(e.tier, '') AS tier,
       count() AS hits,
       avg(e.search_ms) AS search_ms_mean,
       quantile(0.95)(e.search_ms) AS search_ms_p95,
       avg(e.latency_ms) AS latency_ms_mean,
       countIf(u.verdict = 'correct') AS user_correct,
       countIf(u.verdict = 'wrong') AS user_wrong
FROM (
    SELECT request_id, arm, decision, tier, search_ms, latency_ms FROM events_raw FINAL
    {_DECISIONS_FILTER}
) AS e
LEFT JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS u USING (request_id)
WHERE e.decision = 'hit'
GROUP BY arm, tier
ORDER BY arm, tier
"""
"""Hits per arm x the store tier that served them ("memory" / "disk"; "" before the tier was
logged): how much the disk tier serves, what it costs in search time, and users' verdicts."""


# Error-bounded arms (cache_core.decision.error_bound): per arm x the level that set each lookup's
# threshold (threshold_source: entry / cluster / arm, or static = the arm's configured start before it
# holds enough verdicts; NULL on other arms, left out): lookups, hits, and the hits' verdicts from
# users and from shadow checks, apart.
THRESHOLD_SOURCES_SQL = f"""
SELECT e.arm AS arm,
       e.level AS threshold_source,
       count() AS requests,
       countIf(e.decision = 'hit') AS hits,
       countIf(e.decision = 'hit' AND u.verdict = 'correct') AS user_correct,
       countIf(e.decision = 'hit' AND u.verdict = 'wrong') AS user_wrong,
       countIf(e.decision = 'hit' AND s.verdict = 'correct') AS shadow_correct,
       countIf(e.decision = 'hit' AND s.verdict = 'wrong') AS shadow_wrong
FROM (
    SELECT request_id, arm, decision, assumeNotNull(threshold_source) AS level FROM events_raw FINAL
    {_DECISIONS_FILTER}
      AND threshold_source IS NOT NULL
) AS e
LEFT JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS u USING (request_id)
LEFT JOIN (SELECT request_id, verdict FROM shadow_feedback_raw FINAL) AS s USING (request_id)
GROUP BY arm, threshold_source
ORDER BY arm, threshold_source
"""


COLUMNS: dict[str, list[str]] = {
    JUDGE_PROBABILITY_SQL: ["arm", "judge_version", "probability_milli", "decisions", "hits", "user_correct",
                            "user_wrong", "shadow_hit_correct", "shadow_hit_wrong", "shadow_miss_correct",
                            "shadow_miss_wrong"],
    SHADOW_LABELLED_SQL: ["arm", "intent_cluster", "decision", "similarity_milli", "correct", "wrong"],
    CANARY_SHADOW_SQL: ["variant", "correct", "wrong"],
    SHADOW_STRATA_SQL: ["arm", "epoch_hour", "hits", "checked", "wrong"],
    SHADOW_VERDICTS_SQL: ["arm", "decision", "similarity_milli", "correct", "wrong"],
    JUDGE_VERSIONS_SQL: ["arm", "judge_version", "requests", "hits", "judged", "judge_ms_mean", "judge_ms_p95",
                         "user_correct", "user_wrong", "shadow_correct", "shadow_wrong"],
    THRESHOLD_SOURCES_SQL: ["arm", "threshold_source", "requests", "hits", "user_correct", "user_wrong",
                            "shadow_correct", "shadow_wrong"],
    HIT_TIERS_SQL: ["arm", "tier", "hits", "search_ms_mean", "search_ms_p95", "latency_ms_mean",
                    "user_correct", "user_wrong"],
}
"""Output columns of each query (merged into the lookup of ``queries._frame``)."""
