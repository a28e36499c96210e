"""Cache replicas sharing entries through the entries topic (a script, not a test).

Starts a Kafka broker and runs in-process replicas (cache_core.state.replication) on the real
model, then measures:

- hit rate behind a round-robin load balancer: banking77 train questions are stored, then
  test questions looked up, spread over ``--replicas`` replicas, with entry sharing on and
  off (threshold ``--threshold``; a hit counts as correct when the cached intent matches);
- replication lag: for ``--lag-stores`` stores on one replica, the time until another
  replica has applied the entry (store returned -> applied), p50 / p95 / max;
- warm-up: a new replica replaying ``--warmup`` entries from the topic, entries per second.

    python bench/replication.py [--replicas 2] [--stores 3000] [--lookups 1000]
Prints a JSON summary and saves bench/results/replication.json and replication.png.
Embeddings are computed once, in batches, and served from a table to every replica, so
the figures are those of the cache and the topic, not of the encoder.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cache_core.cache import SemanticCache  # noqa: E402
from cache_core.embedding.load import load_embedder  # noqa: E402
from cache_core.experiments import ArmConfig, ExperimentConfig  # noqa: E402
from cache_core.publish.publisher import EventPublisher  # noqa: E402
from cache_core.registry import ExperimentRegistry  # noqa: E402
from cache_core.state.replication import EntryFollower, share  # noqa: E402
from cache_core.settings import CacheSettings, KafkaSettings  # noqa: E402
from infra.kafka.broker import start_broker  # noqa: E402
from infra.kafka.topics import ensure_topics  # noqa: E402
from infra.runtime import REPO_ROOT  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results"
DATA = REPO_ROOT / "data" / "banking77"
MODEL = CacheSettings().model


class TableEncoder:
    """Precomputed embeddings (the real model's, batch-encoded once) by text."""

    def __init__(self, texts: list[str]):
        model = load_embedder(CacheSettings())
        self.dim = model.dim
        vecs, norms = model.encode_with_norms(texts)
        self.table = {t: (v, n) for t, v, n in zip(texts, vecs, norms)}

    def encode_with_norms(self, texts):
        rows = [self.table[t] for t in texts]
        return np.vstack([r[0] for r in rows]), np.array([r[1] for r in rows], dtype=np.float32)

    def encode(self, texts):
        return self.encode_with_norms(texts)[0]


class Replica:
    def __init__(self, name: str, kafka: KafkaSettings, encoder, experiment: ExperimentConfig, tmp: Path,
                 shared: bool):
        self.cache = SemanticCache(encoder, ExperimentRegistry({experiment.experiment_id: experiment}),
                                   instance_id=name)
        self.publisher = EventPublisher(kafka, spool_dir=tmp / f"spool-{name}-{uuid.uuid4().hex[:6]}",
                                        instance_id=name)
        self.applied_at: dict[str, float] = {}
        self.follower = None
        if shared:
            share(self.cache, self.publisher, name, MODEL)
            self.follower = _TimedFollower(kafka, self.cache, name, MODEL, self.applied_at).start()
            self.follower.wait_caught_up(600)

    def entries(self) -> int:
        return sum(len(p) for p in self.cache.partitions())

    def stop(self) -> None:
        if self.follower is not None:
            self.follower.stop()
        self.publisher.close()


class _TimedFollower(EntryFollower):
    def __init__(self, kafka, cache, name, model, applied_at: dict[str, float]):
        super().__init__(kafka, cache, name, model)
        self._applied_at = applied_at

    def _apply_put(self, message) -> str:
        outcome = super()._apply_put(message)
        self._applied_at[message.entry["entry_id"]] = time.perf_counter()
        return outcome


def _topic(bootstrap: str) -> KafkaSettings:
    kafka = KafkaSettings(bootstrap_servers=bootstrap, entries_topic=f"bench.entries.{uuid.uuid4().hex[:8]}")
    ensure_topics(kafka)
    return kafka


def hit_rates(bootstrap: str, encoder, experiment, stores, lookups, replicas: int, tmp: Path) -> dict:
    out = {}
    for shared in (False, True):
        kafka = _topic(bootstrap)
        group = [Replica(f"r{i}", kafka, encoder, experiment, tmp, shared) for i in range(replicas)]
        try:
            for i, (text, intent) in enumerate(stores):
                group[i % replicas].cache.store(text, intent, unit_id=f"u{i}")
            if shared:  # let replication settle before the traffic
                deadline = time.monotonic() + 120
                while min(r.entries() for r in group) < max(r.entries() for r in group) \
                        and time.monotonic() < deadline:
                    time.sleep(0.1)
            hits = correct = 0
            for i, (text, intent) in enumerate(lookups):
                result = group[i % replicas].cache.lookup(text, unit_id=f"u{i}")
                hits += result.hit
                correct += result.hit and result.answer == intent
            out["shared" if shared else "own"] = {
                "entries_per_replica": [r.entries() for r in group], "hit_rate": hits / len(lookups),
                "correct_hit_rate": correct / len(lookups), "false_hits": hits - correct}
            print(f"  entries {'shared' if shared else 'own   '}: {out['shared' if shared else 'own']}", flush=True)
        finally:
            for replica in group:
                replica.stop()
    return out


def lag(bootstrap: str, encoder, experiment, stores, n: int, tmp: Path) -> dict:
    kafka = _topic(bootstrap)
    origin = Replica("origin", kafka, encoder, experiment, tmp, shared=True)
    other = Replica("other", kafka, encoder, experiment, tmp, shared=True)
    try:
        stored_at: dict[str, float] = {}
        for i, (text, intent) in enumerate(stores[:n]):
            result = origin.cache.store(text, intent, unit_id=f"u{i}")
            if result.stored:
                stored_at[result.entry_id] = time.perf_counter()
            time.sleep(0.01)  # a paced stream, not one burst
        deadline = time.monotonic() + 60
        while not stored_at.keys() <= other.applied_at.keys() and time.monotonic() < deadline:
            time.sleep(0.05)
        lags_ms = np.array([(other.applied_at[e] - t) * 1000 for e, t in stored_at.items() if e in other.applied_at])
        applied = lags_ms
        return {"stores": len(stored_at), "applied": len(applied), "p50_ms": float(np.percentile(lags_ms, 50)),
                "p95_ms": float(np.percentile(lags_ms, 95)), "max_ms": float(lags_ms.max()),
                "lags_ms": lags_ms.round(2).tolist()}
    finally:
        origin.stop()
        other.stop()


def warmup(bootstrap: str, encoder, experiment, stores, n: int, tmp: Path) -> dict:
    kafka = _topic(bootstrap)
    origin = Replica("origin", kafka, encoder, experiment, tmp, shared=True)
    try:
        for i in range(n):  # past the stored questions, the same ones again in further namespaces
            text, intent = stores[i % len(stores)]
            origin.cache.store(text, intent, unit_id=f"u{i}", namespace=f"ns{i // len(stores)}")
        origin.publisher.flush(120)
    finally:
        origin.stop()
    started = time.perf_counter()
    late = Replica("late", kafka, encoder, experiment, tmp, shared=True)
    seconds = time.perf_counter() - started
    try:
        stats = late.follower.stats()
        return {"messages": stats["received"], "entries": late.entries(), "seconds": round(seconds, 2),
                "entries_per_s": round(stats["received"] / seconds, 1)}
    finally:
        late.stop()


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    rates = result["hit_rates"]
    names = ["own entries", "shared entries"]
    correct = [rates["own"]["correct_hit_rate"], rates["shared"]["correct_hit_rate"]]
    false = [(rates[k]["hit_rate"] - rates[k]["correct_hit_rate"]) for k in ("own", "shared")]
    left.bar(names, correct, label="correct hits")
    left.bar(names, false, bottom=correct, label="false hits")
    left.set_ylabel("share of lookups")
    left.set_title(f"{result['replicas']} replicas, round-robin, threshold {result['threshold']}")
    left.legend()
    lags = np.sort(result["lag"]["lags_ms"])
    right.plot(lags, np.arange(1, len(lags) + 1) / len(lags))
    right.set_xlabel("store -> applied on another replica (ms)")
    right.set_ylabel("fraction of entries")
    right.set_title(f"replication lag, p50 {result['lag']['p50_ms']:.0f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--stores", type=int, default=3000)
    parser.add_argument("--lookups", type=int, default=1000)
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--lag-stores", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.replicas < 2 or min(args.stores, args.lookups, args.lag_stores, args.warmup) < 1:
        parser.error("need at least 2 replicas and positive counts")
    train = pd.read_csv(DATA / "train.csv").sample(frac=1.0, random_state=7)
    test = pd.read_csv(DATA / "test.csv").sample(frac=1.0, random_state=7)
    stores = list(zip(train.text, train.category))[: args.stores]
    lookups = list(zip(test.text, test.category))[: args.lookups]
    experiment = ExperimentConfig(experiment_id="bench", salt="bench", arms=[
        ArmConfig(name="only", threshold=args.threshold, capacity_entries=max(args.stores, args.warmup) * 2)])
    texts = sorted({t for t, _ in stores + lookups})
    print(f"encoding {len(texts)} texts once ...", flush=True)
    encoder = TableEncoder(texts)
    with tempfile.TemporaryDirectory(prefix="scache-bench-repl-") as tmp_name:
        tmp = Path(tmp_name)
        broker = start_broker(tmp / "kafka")
        try:
            bootstrap = broker.info["bootstrap"]
            print("hit rate behind a round-robin balancer ...", flush=True)
            result = {"replicas": args.replicas, "threshold": args.threshold, "stores": len(stores),
                      "lookups": len(lookups),
                      "hit_rates": hit_rates(bootstrap, encoder, experiment, stores, lookups, args.replicas, tmp)}
            print("replication lag ...", flush=True)
            result["lag"] = lag(bootstrap, encoder, experiment, stores, args.lag_stores, tmp)
            print("warm-up of a new replica ...", flush=True)
            result["warmup"] = warmup(bootstrap, encoder, experiment, stores, args.warmup, tmp)
        finally:
            broker.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "replication.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / "replication.png")
    summary = {k: v for k, v in result.items() if k != "lag"}
    summary["lag"] = {k: v for k, v in result["lag"].items() if k != "lags_ms"}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
