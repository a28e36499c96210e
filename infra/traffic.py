"""Replay banking77 through the cache service as live traffic with known answers.

The "model" is banking77's labels: the answer to a query is its intent's canned
reply, so every served answer can be judged. A hit whose answer belongs to another
intent is a false hit, and it is reported back through ``/v1/feedback`` exactly as a
user's thumbs-down would be.
"""
from __future__ import annotations

import csv
import logging
import random
import time
from collections import Counter
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


def intent_of(answer: str | None) -> str | None:
    if not answer or not answer.startswith("["):
        return None
    return answer[1:answer.index("]")]


@dataclass
class Tally:
    requests: Counter = field(default_factory=Counter)
    hits: Counter = field(default_factory=Counter)
    false_hits: Counter = field(default_factory=Counter)

    def line(self) -> str:
        parts = []
        for arm in sorted(self.requests):
            n, h = self.requests[arm], self.hits[arm]
            parts.append(f"{arm}: {n} req, hit {h / n:.1%}, false {self.false_hits[arm]}")
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


def warm(client: httpx.Client, experiment_id: str, per_intent: int = 2) -> int:
    """Store a few training queries per intent into every arm's store, in one batch (so that
    no arm starts warmer than another). Returns the entries stored."""
    by_intent: dict[str, list[str]] = {}
    for text, intent in load_queries("train"):
        by_intent.setdefault(intent, []).append(text)
    items = [{"query": text, "answer": answer_for(intent), "unit_id": "warm-up", "experiment_id": experiment_id,
              "provenance": {"source": "banking77-train", "version": "1"}}
             for intent, texts in by_intent.items() for text in texts[:per_intent]]
    stored = 0
    for start in range(0, len(items), MAX_STORE_BATCH):
        resp = client.post("/v1/store/batch", json={"items": items[start:start + MAX_STORE_BATCH], "every_arm": True})
        resp.raise_for_status()
        stored += resp.json()["stored"]
    return stored


def serve_one(client: httpx.Client, text: str, intent: str, unit_id: str, experiment_id: str,
              tally: Tally) -> dict:
    """One request as an application would make it: look up, on a miss call the model and store."""
    resp = client.post("/v1/lookup", json={"query": text, "unit_id": unit_id, "experiment_id": experiment_id})
    resp.raise_for_status()
    body = resp.json()
    arm = body.get("arm", "?")
    tally.requests[arm] += 1
    if body.get("hit"):
        tally.hits[arm] += 1
        correct = intent_of(body.get("answer")) == intent
        if not correct:
            tally.false_hits[arm] += 1
        client.post("/v1/feedback", json={"request_id": body["request_id"],
                                          "verdict": "correct" if correct else "wrong"})
    elif arm != HOLDOUT_ARM:
        client.post("/v1/store", json={"query": text, "answer": answer_for(intent), "unit_id": unit_id,
                                       "experiment_id": experiment_id,
                                       "provenance": {"source": "upstream-model", "version": "1"}})
    return body


def replay_forever(cache_url: str, rate_per_s: float, experiments_file: Path,
                   experiment_id: str = "threshold-ab", users: int = 500,
                   max_requests: int | None = None, report_every_s: float = 10.0) -> Tally:
    """Warm the cache, then send test queries at a steady rate until interrupted: each once, in a
    seeded shuffle, then drawn at random (repeats, as popular questions come back)."""
    rng = random.Random(7)
    tally = Tally()
    with httpx.Client(base_url=cache_url, timeout=30) as client:
        stored = warm(client, experiment_id)
        log.info("warmed the cache", extra={"entries": stored})
        traffic = load_queries("test")
        rng.shuffle(traffic)  # the file is grouped by intent: a live stream mixes them
        sent, next_report = 0, time.monotonic() + report_every_s
        interval = 1.0 / rate_per_s
        next_send = time.monotonic()
        while max_requests is None or sent < max_requests:
            text, intent = traffic[sent % len(traffic)] if sent < len(traffic) else rng.choice(traffic)
            serve_one(client, text, intent, f"user-{rng.randrange(users)}", experiment_id, tally)
            sent += 1
            if time.monotonic() >= next_report:
                log.info("traffic: %s", tally.line(), extra={"sent": sent})
                next_report += report_every_s
            next_send += interval
            time.sleep(max(0.0, next_send - time.monotonic()))
    return tally
