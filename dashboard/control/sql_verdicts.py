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


COLUMNS: dict[str, list[str]] = {
    SHADOW_VERDICTS_SQL: ["arm", "decision", "similarity_milli", "correct", "wrong"],
}
"""Output columns of each query (merged into the lookup of ``queries._frame``)."""
