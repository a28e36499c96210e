"""Per-user reads (the unit of randomisation, ``dashboard.control.ratio``): the delta method's sums
per arm (or canary variant) over a per-user subquery, so the dashboard never pulls raw events. Same
conventions as ``sql`` (server-side parameters, FINAL on replacing tables, ``COLUMNS``).

A user is ``unit_id`` (events written without one count as a user each, by request id, as the cache
hashes them). Every decision event counts as a request (the holdout's bypasses too, so SRM sees every
arm); hits are its hits. Per arm: users and the sums of the delta method over users (x: requests,
y: hits). events_raw keeps 14 days (its TTL).
"""
from __future__ import annotations

from dashboard.control.ratio import FOURTH_MOMENTS

_UNIT = "if(unit_id = '', request_id, unit_id)"
_UNIT_DECISIONS = """
WHERE event_type = 'decision'
  AND experiment_id = {experiment_id:String}
  AND ts_ms >= {start_ms:Int64} AND ts_ms < {end_ms:Int64}
  AND ({namespace:String} = '' OR namespace = {namespace:String})
"""
# The delta method's five sums, and the fourth-moment sums of ratio.FOURTH_MOMENTS (in Float64:
# a user's x^4 overflows Int64 past ~55,000 requests) that give the variance its degrees of freedom.
_UNIT_SUMS = """count() AS units, sum(x) AS sum_x, sum(y) AS sum_y, sum(x * x) AS sum_x2,
       sum(y * y) AS sum_y2, sum(x * y) AS sum_xy,
       sum(pow(x, 4)) AS sum_x4, sum(pow(x, 3) * y) AS sum_x3y, sum(pow(x, 2) * pow(y, 2)) AS sum_x2y2,
       sum(x * pow(y, 3)) AS sum_xy3, sum(pow(y, 4)) AS sum_y4"""

UNIT_STATS_SQL = f"""
SELECT arm, {_UNIT_SUMS}
FROM (
    SELECT arm, {_UNIT} AS unit, count() AS x, countIf(hit) AS y
    FROM events_raw FINAL
    {_UNIT_DECISIONS}
    GROUP BY arm, unit
)
GROUP BY arm
ORDER BY arm
"""

def _unit_false_hits_sql(weight: str, which_hits: str) -> str:
    """Per user: the verdicts on ``which_hits``, each weighing ``weight`` (x), and the wrong
    ones (y), by decision time; the latest verdict wins."""
    return f"""
SELECT arm, {_UNIT_SUMS}
FROM (
    SELECT e.arm AS arm, e.unit AS unit, sum(e.w) AS x, sumIf(e.w, f.verdict = 'wrong') AS y
    FROM (
        SELECT request_id, arm, {_UNIT} AS unit, {weight} AS w FROM events_raw FINAL
        {_UNIT_DECISIONS}
          AND {which_hits}
    ) AS e
    INNER JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS f USING (request_id)
    GROUP BY arm, unit
)
GROUP BY arm
ORDER BY arm
"""


# Every labelled hit, each counting once.
UNIT_FALSE_HITS_SQL = _unit_false_hits_sql("toFloat64(1)", "hit")

# Solicited verdicts (docs/solicited_feedback.md): hits the service asked about (feedback_requested,
# a random draw at feedback_prob), each weighing 1 / feedback_prob: sum y / sum x is the Hajek
# estimate of the false-hit rate, its variance the delta method over users as for any other ratio.
UNIT_SOLICITED_FALSE_HITS_SQL = _unit_false_hits_sql(
    "1 / assumeNotNull(feedback_prob)", "hit AND feedback_requested AND feedback_prob > 0")

# Per arm: the requested hits and how many got an answer (plain and weighted): the response rate,
# and the worst case that counts every unanswered request as wrong.
SOLICITED_RESPONSE_SQL = f"""
SELECT e.arm AS arm, count() AS requested, countIf(f.verdict IN ('correct', 'wrong')) AS answered,
       sum(e.w) AS requested_weight, sumIf(e.w, f.verdict IN ('correct', 'wrong')) AS answered_weight,
       sumIf(e.w, f.verdict = 'wrong') AS wrong_weight
FROM (
    SELECT request_id, arm, 1 / assumeNotNull(feedback_prob) AS w FROM events_raw FINAL
    {_UNIT_DECISIONS}
      AND hit AND feedback_requested AND feedback_prob > 0
) AS e
LEFT JOIN (SELECT request_id, verdict FROM feedback_raw FINAL) AS f USING (request_id)
GROUP BY arm
ORDER BY arm
"""

# A canary's measured hit rate per variant of one arm since it started, per user (the canary
# hash splits users): promotion of a loosening waits until it confirms the what-if's gain.
CANARY_UNITS_SQL = f"""
SELECT variant, {_UNIT_SUMS}
FROM (
    SELECT variant, {_UNIT} AS unit, count() AS x, countIf(hit) AS y
    FROM events_raw FINAL
    WHERE event_type = 'decision' AND decision IN ('hit', 'miss')
      AND experiment_id = {{experiment_id:String}} AND arm = {{arm:String}} AND ts_ms >= {{since_ms:Int64}}
    GROUP BY variant, unit
)
GROUP BY variant
ORDER BY variant
"""

# The sequential test's looks: per arm and time bucket, what the bucket adds to the
# cumulative per-user sums (a user's running x and y: its square grows by x_now^2 - x_before^2),
# so a cumulative sum over buckets gives the per-user statistics at every look. Second moments
# only: the mSPRT's normal mixture reads no degrees of freedom.
UNIT_PATH_SQL = f"""
SELECT arm, bucket, sum(first) AS units, sum(cx - px) AS sum_x, sum(cy - py) AS sum_y,
       sum(cx * cx - px * px) AS sum_x2, sum(cy * cy - py * py) AS sum_y2, sum(cx * cy - px * py) AS sum_xy
FROM (
    SELECT arm, bucket, cx, cy, cx - x AS px, cy - y AS py, toInt64(n = 1) AS first
    FROM (
        SELECT arm, unit, bucket, x, y,
               sum(x) OVER w AS cx, sum(y) OVER w AS cy, row_number() OVER w AS n
        FROM (
            SELECT arm, {_UNIT} AS unit,
                   toStartOfInterval(fromUnixTimestamp64Milli(ts_ms, 'UTC'), toIntervalSecond({{bucket_s:UInt32}}), 'UTC') AS bucket,
                   count() AS x, countIf(hit) AS y
            FROM events_raw FINAL
            {_UNIT_DECISIONS}
            GROUP BY arm, unit, bucket
        )
        WINDOW w AS (PARTITION BY arm, unit ORDER BY bucket ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    )
)
GROUP BY arm, bucket
ORDER BY bucket, arm
"""


_UNIT_COLUMNS = ["units", "sum_x", "sum_y", "sum_x2", "sum_y2", "sum_xy"]
_FOURTH_COLUMNS = list(FOURTH_MOMENTS)


COLUMNS: dict[str, list[str]] = {
    UNIT_STATS_SQL: ["arm", *_UNIT_COLUMNS, *_FOURTH_COLUMNS],
    UNIT_FALSE_HITS_SQL: ["arm", *_UNIT_COLUMNS, *_FOURTH_COLUMNS],
    UNIT_PATH_SQL: ["arm", "bucket", *_UNIT_COLUMNS],
    CANARY_UNITS_SQL: ["variant", *_UNIT_COLUMNS, *_FOURTH_COLUMNS],
    UNIT_SOLICITED_FALSE_HITS_SQL: ["arm", *_UNIT_COLUMNS, *_FOURTH_COLUMNS],
    SOLICITED_RESPONSE_SQL: ["arm", "requested", "answered", "requested_weight", "answered_weight", "wrong_weight"],
}
"""Output columns of each query: an empty result carries no column names."""
