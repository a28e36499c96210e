"""Traffic through the cache service as an application sends it: the demo's banking77 stream, and the
request path (look up, store on a miss, feedback on a judged hit) that ``infra.replay`` drives with a
user's own log.

In the demo the "model" is banking77's labels: the answer to a query is its intent's canned
reply, so every served answer can be judged. A hit whose answer belongs to another
intent is a false hit, and it is reported back through ``/v1/feedback`` exactly as a
user's thumbs-down would be.
"""
from __future__ import annotations

import csv
import itertools
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cache_core.experiments import HOLDOUT_ARM, assign, load_experiments
from cache_core.service.schemas import MAX_STORE_BATCH
from infra.runtime import REPO_ROOT

log = logging.getLogger("scache.traffic")
DATA_DIR = REPO_ROOT / "data" / "banking77"


def load_queries(name: str) -> list[tuple[str, str]]:
    """(text, intent) rows of data/banking77/<name>.csv."""
    with open(DATA_DIR / f"{name}.csv", newline="") as f:
        return [(row["text"], row["category"]) for row in csv.DictReader(f)]


def answer_for(intent: str) -> str:
    return f"[{intent}] Here is how we handle {intent.replace('_', ' ')}."


@dataclass(frozen=True)
class Query:
    """One request of a traffic stream: the demo's banking77 rows, or a line of a user's log (infra.replay)."""

    text: str
    unit_id: str
    answer: str | None = None
    """What the model answers (stored on a miss); None: the label's canned answer, else a placeholder."""
    label: str | None = None
    """The answer's class: a hit serving another label's answer is a false hit."""
    namespace: str | None = None
    at_s: float | None = None
    """When it was asked (seconds since the epoch), for a replay at the recorded pace."""

    def model_answer(self) -> str:
        if self.answer is not None:
            return self.answer
        if self.label is not None:
            return answer_for(self.label)
        return f"(replay) the answer to: {self.text}"


class Judge:
    """Whether a served answer was right for a query: by label, when the served answer's label is known
    (answers stored by this traffic, or a label's canned answer, ``answer_for``, also one stored by an
    earlier run), else by equality with the expected answer; neither known: no verdict."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}

    def learn(self, answer: str, label: str | None) -> None:
        if label is not None:
            self.labels[answer] = label

    def label_of(self, served: str | None) -> str | None:
        if served is None:
            return None
        if served in self.labels:
            return self.labels[served]
        canned = re.fullmatch(r"\[(.+?)\] Here is how we handle .*\.", served, re.S)
        return canned.group(1) if canned and served == answer_for(canned.group(1)) else None

    def verdict(self, served: str | None, query: Query) -> str | None:
        label = self.label_of(served) if query.label is not None else None
        if label is not None:
            return "correct" if label == query.label else "wrong"
        if query.answer is not None and served is not None:
            return "correct" if " ".join(served.split()) == " ".join(query.answer.split()) else "wrong"
        return None


@dataclass
class Tally:
    requests: Counter = field(default_factory=Counter)
    hits: Counter = field(default_factory=Counter)
    false_hits: Counter = field(default_factory=Counter)
    unjudged: Counter = field(default_factory=Counter)
    """Hits with no verdict (no label or expected answer to judge them by)."""

    def line(self) -> str:
        parts = []
        for arm in sorted(self.requests):
            n, h = self.requests[arm], self.hits[arm]
            unjudged = f" ({self.unjudged[arm]} unjudged)" if self.unjudged[arm] else ""
            parts.append(f"{arm}: {n} req, hit {h / n:.1%}, false {self.false_hits[arm]}{unjudged}")
        return " | ".join(parts)


def units_per_arm(experiments_file: Path, experiment_id: str, per_arm: int = 1) -> dict[str, list[str]]:
    """Find unit ids that land in each arm, so warm-up can fill every arm's partition."""
    experiment = load_experiments(experiments_file)[experiment_id]
    found: dict[str, list[str]] = {a.name: [] for a in experiment.arms}
    i = 0
    while any(len(v) < per_arm for v in found.values()):
        unit = f"warm-{i}"
        arm = assign(experiment, unit).arm
        if arm != HOLDOUT_ARM and len(found[arm]) < per_arm:
            found[arm].append(unit)
        i += 1
    return found


def warm(client: httpx.Client, experiment_id: str, judge: Judge, per_intent: int = 2) -> int:
    """Store a few training queries per intent into every arm's store, in one batch (so that
    no arm starts warmer than another). Returns the entries stored."""
    by_intent: dict[str, list[str]] = {}
    for text, intent in load_queries("train"):
        by_intent.setdefault(intent, []).append(text)
    items = [{"query": text, "answer": answer_for(intent), "unit_id": "warm-up", "experiment_id": experiment_id,
              "provenance": {"source": "banking77-train", "version": "1"}}
             for intent, texts in by_intent.items() for text in texts[:per_intent]]
    for intent in by_intent:
        judge.learn(answer_for(intent), intent)
    stored = 0
    for start in range(0, len(items), MAX_STORE_BATCH):
        resp = client.post("/v1/store/batch", json={"items": items[start:start + MAX_STORE_BATCH], "every_arm": True})
        resp.raise_for_status()
        stored += resp.json()["stored"]
    return stored


def serve_one(client: httpx.Client, query: Query, experiment_id: str | None, tally: Tally,
              judge: Judge) -> dict:
    """One request as an application would make it: look up, on a miss call the model and store.
    A judged hit is reported through ``/v1/feedback`` as the user's verdict."""
    lookup = {"query": query.text, "unit_id": query.unit_id}
    if experiment_id is not None:
        lookup["experiment_id"] = experiment_id
    if query.namespace is not None:
        lookup["namespace"] = query.namespace
    resp = client.post("/v1/lookup", json=lookup)
    resp.raise_for_status()
    body = resp.json()
    arm = body.get("arm", "?")
    tally.requests[arm] += 1
    if body.get("hit"):
        tally.hits[arm] += 1
        verdict = judge.verdict(body.get("answer"), query)
        if verdict is None:
            tally.unjudged[arm] += 1
        else:
            tally.false_hits[arm] += verdict == "wrong"
            client.post("/v1/feedback", json={"request_id": body["request_id"], "verdict": verdict})
    elif arm != HOLDOUT_ARM:
        answer = query.model_answer()
        judge.learn(answer, query.label)
        client.post("/v1/store", json={**lookup, "answer": answer,
                                       "provenance": {"source": "upstream-model", "version": "1"}})
    return body


def drive(client: httpx.Client, stream: Iterable[tuple[float, Query]], experiment_id: str | None,
          tally: Tally, judge: Judge, report_every_s: float = 10.0) -> int:
    """Send each query of ``stream`` at its offset (seconds after the start; late ones go at once),
    logging the per-arm tally every ``report_every_s``. Returns the number sent."""
    started = time.monotonic()
    sent, next_report = 0, started + report_every_s
    for offset, query in stream:
        time.sleep(max(0.0, started + offset - time.monotonic()))
        serve_one(client, query, experiment_id, tally, judge)
        sent += 1
        if time.monotonic() >= next_report:
            log.info("traffic: %s", tally.line(), extra={"sent": sent})
            next_report += report_every_s
    return sent


def replay_forever(cache_url: str, rate_per_s: float, experiments_file: Path,
                   experiment_id: str = "threshold-ab", users: int = 500,
                   max_requests: int | None = None, report_every_s: float = 10.0) -> Tally:
    """Warm the cache, then send test queries at a steady rate until interrupted: each once, in a
    seeded shuffle, then drawn at random (repeats, as popular questions come back)."""
    rng = random.Random(7)
    tally, judge = Tally(), Judge()
    traffic = load_queries("test")
    rng.shuffle(traffic)  # the file is grouped by intent: a live stream mixes them

    def stream() -> Iterator[tuple[float, Query]]:
        for sent in itertools.count() if max_requests is None else range(max_requests):
            text, intent = traffic[sent] if sent < len(traffic) else rng.choice(traffic)
            yield sent / rate_per_s, Query(text, f"user-{rng.randrange(users)}", answer_for(intent), intent)

    with httpx.Client(base_url=cache_url, timeout=30) as client:
        stored = warm(client, experiment_id, judge)
        log.info("warmed the cache", extra={"entries": stored})
        drive(client, stream(), experiment_id, tally, judge, report_every_s)
    return tally
