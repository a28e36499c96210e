"""The hit rule, whole: when a lookup is served from the cache, and from which entry.

Hit iff a *live* candidate's cosine similarity is >= the arm's threshold for the query's
intent cluster and variant (``thresholds``: canary units of an arm use the canary's
threshold, and on a multi arm its score floor / answer margin, but read the arm's
partition: a canary tests a decision rule, not a cache). Arms with ``similarity="multi"``
re-rank the candidates above the threshold by a mixed token / phrase / intent score and
serve only a clear winner (``rerank``). The arm's lexical guards (``guards``) may veto a
candidate; the next eligible one is then tried, and if none passes the lookup is a miss
naming the guard that blocked the first. A second-stage judge (``judge``) may veto a
candidate after the guards. ``rule.HitRule.decide`` is the one entry point: the cache
calls it with the candidates its search found (best first) and gets a ``Decision``.

Holdout units never reach the rule: they bypass the cache (cache_core.cache).
"""
