"""Verdicts that teach error-bounded arms their thresholds (cache_core.decision.error_bound).

A verdict names a request, not an entry or a similarity. So for its lookups on arms with an
``error_bounded`` threshold policy the cache remembers which entry was served or, on a miss,
found nearest, of which intent cluster and at what similarity (``LookupsToLearnFrom``,
bounded; other arms cost nothing). The first verdict on such a request, user or shadow (a
shadow check of a hit or of a near-miss), becomes a ``Judged`` change applied through
``SemanticCache.apply`` with origin "local": the replica that made the lookup records it,
logs it (write-ahead log, snapshot) and sends it on the entries topic, where the other
replicas apply it as "replica". Later verdicts on the same request are not counted again
(a shadow check and a user's word on one lookup are one observation, not two). A shadow check
that samples one of these lookups says at what rate it did (``checked``), so the verdict weighs
1 / that rate (``Judged.check_prob``). A hit whose user was asked for a verdict (the arm's
``feedback_sample_rate``) was sampled at that rate; asked and shadow-checked, at the chance that
either drew it. A lookup nothing sampled keeps 1.0: a user's unsolicited word is no designed
sample, and its weight cannot be known.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace

from cache_core.decision.error_bound import Judged


class LookupsToLearnFrom:
    """The last ``capacity`` lookups of error-bounded arms by request id, as verdict-less
    ``Judged`` changes (oldest forgotten first); thread-safe."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._lookups: OrderedDict[str, tuple[Judged, float]] = OrderedDict()
        """request id -> (the lookup, the rate its user was asked for a verdict at; 0: not asked)."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._lookups)

    def remember(self, request_id: str, lookup: Judged, asked_at: float = 0.0) -> None:
        """``asked_at``: the sample rate at which this hit's user was asked for a verdict (0: not asked)."""
        if self.capacity <= 0:
            return
        if asked_at > 0:
            lookup = replace(lookup, check_prob=asked_at)
        with self._lock:
            self._lookups[request_id] = (lookup, asked_at)
            if len(self._lookups) > self.capacity:
                self._lookups.popitem(last=False)

    def checked(self, request_id: str, check_prob: float) -> None:
        """A shadow check sampled lookup ``request_id`` at rate ``check_prob`` (ignored if unknown)."""
        with self._lock:
            found = self._lookups.get(request_id)
            if found is not None:
                lookup, asked_at = found
                # Two independent draws: the verdict exists if either sampled the lookup.
                either = 1.0 - (1.0 - asked_at) * (1.0 - check_prob)
                self._lookups[request_id] = (replace(lookup, check_prob=either), asked_at)

    def judged(self, request_id: str, wrong: bool) -> Judged | None:
        """The lookup ``request_id`` was, with the verdict, forgotten at once; None if unknown."""
        with self._lock:
            found = self._lookups.pop(request_id, None)
        if found is None:
            return None
        return replace(found[0], wrong=wrong)
