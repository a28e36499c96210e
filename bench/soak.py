"""Soak: does a cache replica stay bounded over a long run? (a script, not a test).

Starts a real Kafka broker, the upstream-model stub of the tests (tests/unit/
test_service_chat_admin.Upstream) and the real service as subprocesses
(``python -m cache_core.service``) with persistence, replication and feedback on, plus (``--peer``)
a second replica on the same topics taking a share of the traffic, so the measured replica also
applies another's entries, clears, purges, drops and verdicts. The arms have a small capacity
(eviction runs all the time), a short TTL (expiry runs) and the snapshot interval is short
(snapshots and log rotation run many times). No warehouse: the service does not talk to it.

For ``--minutes`` a few client threads send mixed traffic at ``--rate`` requests/s: banking77
questions (train + test, popular ones repeating, paraphrases of the same intent) as lookups, a
miss followed by a store (the answer names the intent, with a provenance source per intent),
batch stores, feedback (correct / wrong, judged by the intent) on most hits, chat completions
(a third stream=true), purges of a provenance source and clears with the admin token. Steady
namespaces live the whole run; short-lived namespaces come and go (half cleared at the end of
their life, half simply abandoned); most units are new users that never come back.

Every ``--sample-s`` it samples the measured replica: RSS, threads, open fds (/proc), entries,
partitions, served-hits map, publisher queue and spool, replication and feedback counters
(/healthz, /metrics), the write-ahead log, snapshot, offsets and spool bytes on disk, and the
p50 / p99 of lookups in the interval (client round trip and the service's own latency_ms).

    python bench/soak.py [--minutes 20] [--sample-s 30] [--rate 12] [--clients 4] [--no-peer]
Prints one line per sample, then first vs last quarter and a growth verdict per series (slope
over the second half, per hour), and saves bench/results/soak.json and soak.png (``--out``
names them). Kept for comparison: soak-lazy-expiry.* (before the background expiry sweep and
the heap fixes: entries of abandoned namespaces and RSS grew) and soak-sweep-trim.* (sweep and
malloc_trim every minute, mmap threshold not pinned: RSS a sawtooth).
The machine is small and shared (2 cores): latency is noisy; memory, threads, fds and disk are
what the verdicts are for.

Over 500 lines because one run samples every resource a replica can leak (memory, threads,
fds, disk, latency) and gives each its own growth verdict; the samplers share the run's clock.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replication import DATA, RESULTS  # noqa: E402
from cache_core.settings import KafkaSettings  # noqa: E402
from infra.kafka.broker import start_broker  # noqa: E402
from infra.kafka.topics import ensure_topics  # noqa: E402
from infra.runtime import REPO_ROOT, Service, free_port, spawn, wait_until  # noqa: E402
from tests.unit.cache_core.service.test_service_chat_admin import Upstream  # noqa: E402

TOKEN = "soak-admin-token"
MAX_CLUSTERS = 1024  # cache_core.clusters.OnlineClusters' default, as the cache builds it
EXPERIMENT = "soak"

# Series sampled per interval: (key, label, unit). The verdict is computed for each.
SERIES = [
    ("rss_mb", "RSS", "MB"), ("threads", "threads", ""), ("fds", "open fds", ""),
    ("entries", "entries", ""), ("abandoned_entries", "in abandoned ns", ""), ("partitions", "partitions", ""),
    ("full_partitions", "full partitions", ""), ("intent_clusters", "intent clusters", ""),
    ("served_hits", "served-hits map", ""), ("queue_depth", "publisher queue", ""),
    ("spool_bytes", "spool (stats)", "B"), ("wal_bytes", "log segments", "B"), ("wal_files", "log files", ""),
    ("snap_bytes", "snapshots", "B"), ("snap_dirs", "snapshot dirs", ""), ("offsets_bytes", "offsets file", "B"),
    ("spool_dir_bytes", "spool dir", "B"), ("lookup_p50_ms", "lookup p50", "ms"),
    ("lookup_p99_ms", "lookup p99", "ms"), ("service_p50_ms", "service p50", "ms"),
    ("service_p99_ms", "service p99", "ms"), ("peer_rss_mb", "peer RSS", "MB"),
]
# Counters (cumulative): reported as totals and per-interval rates, not judged for growth.
COUNTERS = ["requests", "errors", "snapshots", "log_segment", "repl_received", "repl_applied",
            "repl_own", "feedback_follower_received", "published", "spooled", "dropped", "expiry_removed"]


# -- the services -------------------------------------------------------------------------

def experiments_file(path: Path, capacity: int, ttl_s: float) -> Path:
    """One experiment, two arms (flat and HNSW, so tombstones and rebuilds run too), both small."""
    arm = {"capacity_entries": capacity, "ttl_s": ttl_s, "invalidate_after_wrong": 1, "ann_check_rate": 0.1}
    path.write_text(yaml.safe_dump({"experiments": [{
        "experiment_id": EXPERIMENT, "salt": "soak", "traffic_share": 1.0, "partition_mode": "partitioned",
        "arms": [{"name": "control", "threshold": 0.9, "index_kind": "flat", **arm},
                 {"name": "treatment", "threshold": 0.8, "index_kind": "hnsw", **arm}]}]}))
    return path


def start_replica(name: str, workdir: Path, kafka: KafkaSettings, upstream_port: int, experiments: Path,
                  args: argparse.Namespace) -> Service:
    port = free_port()
    env = {"SCACHE_SERVICE__HOST": "127.0.0.1", "SCACHE_SERVICE__PORT": str(port), "SCACHE_LOG_FORMAT": "json",
           "SCACHE_LOG_LEVEL": "WARNING", "SCACHE_EXPERIMENTS_FILE": str(experiments),
           "SCACHE_SERVICE__ADMIN_TOKEN": TOKEN, "SCACHE_SERVICE__OPEN_ACCESS": "true",
           "SCACHE_SERVICE__UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}/v1",
           "SCACHE_CACHE__PERSIST": "true", "SCACHE_CACHE__REPLICATE": "true",
           "SCACHE_CACHE__SNAPSHOT_DIR": str(workdir / "snapshots"),
           "SCACHE_CACHE__SNAPSHOT_INTERVAL_S": str(args.snapshot_s),
           "SCACHE_CACHE__DEFAULT_TTL_S": str(args.ttl_s),
           "SCACHE_CACHE__FEEDBACK_MEMORY": str(args.feedback_memory),
           "SCACHE_CACHE__CLUSTER_REFRESH_S": "120",
           **{f"SCACHE_KAFKA__{k.upper()}": str(v) for k, v in kafka.model_dump().items()}}
    cmd = [sys.executable, "-m", "cache_core.service", "--spool-dir", str(workdir / "spool"),
           "--instance-id", f"soak-{name}"]
    service = spawn(name, cmd, workdir / "service.log", env=env, cwd=REPO_ROOT)
    service.info.update(url=f"http://127.0.0.1:{port}", workdir=workdir)
    wait_until(lambda: httpx.get(service.info["url"] + "/readyz", timeout=2).status_code == 200, 240,
               name, proc=service.proc, log_path=service.log_path)
    return service


# -- traffic ------------------------------------------------------------------------------

class Questions:
    """banking77 train + test: popular questions repeat (Zipf-like), paraphrases share an intent."""

    def __init__(self, seed: int):
        frames = [pd.read_csv(DATA / "train.csv"), pd.read_csv(DATA / "test.csv")]
        rows = pd.concat(frames).drop_duplicates("text").sample(frac=1.0, random_state=seed)
        self.rows = list(zip(rows.text, rows.category))
        self.intents = sorted({c for _, c in self.rows})
        weights = 1.0 / np.arange(1, len(self.rows) + 1) ** 0.8
        self.cum = np.cumsum(weights / weights.sum())

    def pick(self, rng: random.Random) -> tuple[str, str]:
        return self.rows[min(int(np.searchsorted(self.cum, rng.random())), len(self.rows) - 1)]


def answer_of(intent: str) -> str:
    return f"[{intent}] Here is how we handle {intent.replace('_', ' ')} requests."


def intent_of(answer: str | None) -> str | None:
    match = re.match(r"\[([a-z_]+)\]", answer or "")
    return match.group(1) if match else None


class Namespaces:
    """``steady`` namespaces for the whole run; short-lived ones opened every ``churn_s`` and
    retired after ``life_s`` (every other one cleared with the admin token, the others abandoned)."""

    def __init__(self, steady: int, churn_s: float, life_s: float):
        self.steady = [f"tenant-{i:02d}" for i in range(steady)]
        self.churn_s, self.life_s = churn_s, life_s
        self.started = time.monotonic()
        self.opened = 0
        self.live: list[tuple[str, float]] = []
        self.abandoned: set[str] = set()
        self.lock = threading.Lock()

    def tick(self) -> list[str]:
        """Open due namespaces; returns those retired now that should be cleared."""
        now, retired = time.monotonic(), []
        with self.lock:
            while self.started + self.opened * self.churn_s <= now:
                self.live.append((f"trial-{self.opened:04d}", now))
                self.opened += 1
            for name, since in list(self.live):
                if now - since >= self.life_s:
                    self.live.remove((name, since))
                    if int(name.split("-")[1]) % 2 == 0:
                        retired.append(name)
                    else:
                        self.abandoned.add(name)
        return retired

    def pick(self, rng: random.Random) -> str:
        with self.lock:
            if self.live and rng.random() < 0.25:
                return rng.choice(self.live)[0]
        return rng.choice(self.steady)


class Traffic:
    """Client threads at a shared target rate; lookup latencies per sampling interval."""

    def __init__(self, urls: list[str], weights: list[float], questions: Questions, namespaces: Namespaces,
                 rate: float, clients: int, seed: int):
        self.urls, self.weights = urls, weights
        self.questions, self.namespaces = questions, namespaces
        self.interval = clients / rate
        self.clients, self.seed = clients, seed
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.lat_ms: list[float] = []
        self.service_ms: list[float] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.errors: dict[str, int] = defaultdict(int)
        self.unit_counter = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True, name=f"soak-client-{i}")
                        for i in range(clients)]

    def start(self) -> "Traffic":
        for thread in self.threads:
            thread.start()
        return self

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def take_latencies(self) -> tuple[list[float], list[float]]:
        with self.lock:
            out = self.lat_ms, self.service_ms
            self.lat_ms, self.service_ms = [], []
        return out

    def _count(self, what: str, response: httpx.Response | None = None, error: str | None = None) -> None:
        with self.lock:
            self.counts[what] += 1
            if error is not None or (response is not None and response.status_code >= 400):
                self.errors[f"{what}:{error or response.status_code}"] += 1

    def _unit(self, rng: random.Random) -> str:
        """Mostly new users (each makes a few requests, then never returns), some regulars."""
        if rng.random() < 0.3:
            return f"regular-{rng.randrange(200)}"
        with self.lock:
            self.unit_counter += 1
            return f"user-{self.unit_counter // 3}"

    def _run(self, number: int) -> None:
        rng = random.Random(self.seed * 100 + number)
        clients = [httpx.Client(base_url=url, timeout=30) for url in self.urls]
        admin = {"authorization": f"Bearer {TOKEN}"}
        next_at = time.monotonic() + rng.random() * self.interval
        try:
            while not self.stop.is_set():
                delay = next_at - time.monotonic()
                if delay > 0:
                    self.stop.wait(delay)
                next_at = max(next_at + self.interval, time.monotonic() - self.interval)
                client = rng.choices(clients, self.weights)[0]
                try:
                    self._one(client, rng, admin)
                except httpx.HTTPError as exc:
                    self._count("transport", error=type(exc).__name__)
        finally:
            for client in clients:
                client.close()

    def _one(self, client: httpx.Client, rng: random.Random, admin: dict) -> None:
        text, intent = self.questions.pick(rng)
        namespace, unit = self.namespaces.pick(rng), self._unit(rng)
        roll = rng.random()
        if roll < 0.62:
            self._lookup(client, rng, text, intent, namespace, unit)
        elif roll < 0.84:
            self._chat(client, rng, text, namespace, unit)
        elif roll < 0.90:
            items = [self.questions.pick(rng) for _ in range(rng.randint(8, 48))]
            body = {"items": [self._store_body(t, i, namespace, unit, rng) for t, i in items],
                    "every_arm": rng.random() < 0.5}
            self._count("store_batch", client.post("/v1/store/batch", json=body))
        elif roll < 0.995:
            self._count("store", client.post("/v1/store", json=self._store_body(text, intent, namespace, unit, rng)))
        elif roll < 0.998:  # an intent's document changed: purge its answers
            body = {"provenance_source": f"doc-{rng.choice(self.questions.intents)}"}
            self._count("purge", client.post(f"/v1/admin/namespaces/{namespace}/purge", json=body, headers=admin))
        else:
            self._count("clear", client.delete(f"/v1/admin/namespaces/{rng.choice(self.namespaces.steady)}",
                                               headers=admin))

    def _store_body(self, text: str, intent: str, namespace: str, unit: str, rng: random.Random) -> dict:
        body = {"query": text, "answer": answer_of(intent), "unit_id": unit, "namespace": namespace,
                "experiment_id": EXPERIMENT,
                "provenance": {"source": f"doc-{intent}", "version": f"v{rng.randrange(3)}"}}
        if rng.random() < 0.2:
            body["ttl_s"] = rng.choice([30.0, 60.0, 600.0])
        return body

    def _lookup(self, client, rng, text, intent, namespace, unit) -> None:
        started = time.perf_counter()
        response = client.post("/v1/lookup", json={"query": text, "unit_id": unit, "namespace": namespace,
                                                   "experiment_id": EXPERIMENT})
        elapsed = (time.perf_counter() - started) * 1000
        self._count("lookup", response)
        if response.status_code != 200:
            return
        result = response.json()
        with self.lock:
            self.lat_ms.append(elapsed)
            self.service_ms.append(result["latency_ms"])
        if not result["hit"]:  # the model answered: store it
            self._count("store", client.post("/v1/store", json=self._store_body(text, intent, namespace, unit, rng)))
        elif rng.random() < 0.7:
            verdict = "correct" if intent_of(result["answer"]) == intent else "wrong"
            self._count(f"feedback_{verdict}", client.post(
                "/v1/feedback", json={"request_id": result["request_id"], "verdict": verdict}))

    def _chat(self, client, rng, text, namespace, unit) -> None:
        stream = rng.random() < 1 / 3
        headers = {"x-scache-unit-id": unit, "x-scache-namespace": namespace, "x-scache-experiment": EXPERIMENT}
        if rng.random() < 0.3:  # a conversation of its own: a scope (and scope index) that ends
            headers["x-scache-conversation-id"] = f"conv-{rng.randrange(10**9)}"
        body = {"model": "tiny", "stream": stream,
                "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]}
        if stream:
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                for _ in response.iter_bytes():
                    pass
            self._count("chat_stream", response)
        else:
            response = client.post("/v1/chat/completions", json=body, headers=headers)
            self._count("chat", response)
        if response.status_code == 200 and response.headers.get("x-scache-hit") == "1" and rng.random() < 0.5:
            self._count("feedback_correct", client.post(
                "/v1/feedback", json={"request_id": response.headers["x-scache-request-id"], "verdict": "correct"}))


# -- sampling -----------------------------------------------------------------------------

def proc_figures(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def dir_bytes(path: Path, pattern: str = "*") -> tuple[int, int]:
    """Bytes of the files under ``path`` matching ``pattern`` (recursively), and how many matched."""
    if not path.exists():
        return 0, 0
    total, count = 0, 0
    for item in path.glob(pattern):
        count += 1
        files = [item] if item.is_file() else [f for f in item.rglob("*") if f.is_file()]
        for f in files:
            try:
                total += f.stat().st_size
            except FileNotFoundError:  # a snapshot being replaced while we look
                pass
    return total, count


def parse_metrics(text: str) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        out[name].append((labels.rstrip("}"), float(value)))
    return out


def sample(service: Service, peer: Service | None, traffic: Traffic, started: float, capacity: int,
           abandoned: set[str]) -> dict:
    pid, workdir = service.proc.pid, service.info["workdir"]
    lat, service_ms = traffic.take_latencies()
    with httpx.Client(base_url=service.info["url"], timeout=30) as client:
        health = client.get("/healthz").json()
        metrics = parse_metrics(client.get("/metrics").text)
    snapdir = workdir / "snapshots"
    wal_bytes, wal_files = dir_bytes(snapdir, "wal-*.log")
    snap_bytes, snap_dirs = dir_bytes(snapdir, "snap-*")
    offsets_bytes = sum(f.stat().st_size for f in snapdir.glob("*offsets*") if f.is_file()) if snapdir.exists() else 0
    spool_dir_bytes, _ = dir_bytes(workdir / "spool", "**/*")
    publisher, repl = health["publisher"], health["replication"] or {}
    persistence = health["persistence"] or {}
    feedback = health["feedback"] or {}
    partitions = metrics.get("scache_cache_entries", [])
    with traffic.lock:
        requests = sum(traffic.counts.values())
        errors = sum(traffic.errors.values())
    row = {
        "t_s": round(time.monotonic() - started, 1), **proc_figures(pid),
        "entries": health["entries"], "partitions": len(partitions),
        "full_partitions": sum(1 for _, v in partitions if v >= capacity),
        # Entries of short-lived namespaces nobody cleared: no request reaches them any more.
        "abandoned_entries": sum(v for labels, v in partitions
                                 if re.search(r'namespace="([^"]+)"', labels).group(1) in abandoned),
        "intent_clusters": sum(v for _, v in metrics.get("scache_intent_clusters", [])),
        "served_hits": feedback.get("remembered_hits", 0),
        "queue_depth": publisher.get("queue_depth", 0), "spool_bytes": publisher.get("spool_bytes", 0),
        "wal_bytes": wal_bytes, "wal_files": wal_files, "snap_bytes": snap_bytes, "snap_dirs": snap_dirs,
        "offsets_bytes": offsets_bytes, "spool_dir_bytes": spool_dir_bytes,
        "lookups": len(lat),
        "lookup_p50_ms": float(np.percentile(lat, 50)) if lat else None,
        "lookup_p99_ms": float(np.percentile(lat, 99)) if lat else None,
        "service_p50_ms": float(np.percentile(service_ms, 50)) if service_ms else None,
        "service_p99_ms": float(np.percentile(service_ms, 99)) if service_ms else None,
        "peer_rss_mb": proc_figures(peer.proc.pid)["rss_mb"] if peer is not None and peer.alive() else None,
        "requests": requests, "errors": errors,
        "snapshots": persistence.get("snapshots", 0), "log_segment": persistence.get("log_segment", 0),
        "repl_received": repl.get("received", 0), "repl_applied": repl.get("applied", 0),
        "repl_own": repl.get("own", 0),
        "feedback_follower_received": (feedback.get("follower") or {}).get("received", 0),
        "published": publisher.get("published", 0), "spooled": publisher.get("spooled", 0),
        "dropped": publisher.get("dropped", 0),
        "expiry_removed": (health.get("expiry") or {}).get("removed", 0),  # the background sweep, if any
        "store_reasons": {labels: v for labels, v in metrics.get("scache_stores_total", [])},
        "feedback_outcomes": {labels: v for labels, v in metrics.get("scache_feedback_applied_total", [])},
        "replication": {k: v for k, v in repl.items() if isinstance(v, (int, float))},
    }
    return row


def line(row: dict) -> str:
    def ms(v):
        return "-" if v is None else f"{v:.0f}"
    return (f"[{row['t_s'] / 60:5.1f} min] rss {row['rss_mb']:6.1f} MB  thr {row['threads']:3d}  fds {row['fds']:3d}  "
            f"entries {row['entries']:5d} ({row['abandoned_entries']:.0f} abandoned)  parts {row['partitions']:3d} "
            f"({row['full_partitions']} full)  clusters {row['intent_clusters']:.0f}  served {row['served_hits']:5d}  "
            f"queue {row['queue_depth']:3d}  spool {row['spool_bytes']:6d}  wal {row['wal_bytes'] / 1e6:5.2f} MB/"
            f"{row['wal_files']}  snap {row['snap_bytes'] / 1e6:5.2f} MB/{row['snap_dirs']}  "
            f"offsets {row['offsets_bytes']:5d} B  lookup p50/p99 {ms(row['lookup_p50_ms'])}/{ms(row['lookup_p99_ms'])} ms "
            f"(service {ms(row['service_p50_ms'])}/{ms(row['service_p99_ms'])})  n {row['lookups']}  "
            f"req {row['requests']}  err {row['errors']}  snaps {row['snapshots']}"
            + (f"  peer rss {row['peer_rss_mb']:.0f} MB" if row["peer_rss_mb"] is not None else ""))


# -- the verdict --------------------------------------------------------------------------

def verdicts(rows: list[dict], caps: dict[str, float] | None = None) -> dict:
    """First vs last quarter (means) and the slope over the second half, per hour, per series.

    "grows": the second-half slope is clearly positive (r > 0.5) and would add more than half of the
    last quarter's level in a week; otherwise "flat". A growing series with a known bound (``caps``:
    the served-hits map's feedback_memory, the intent clusters' max_clusters) is "fills toward its
    cap", not a leak."""
    caps = caps or {}
    out = {}
    t = np.array([r["t_s"] for r in rows]) / 3600
    quarter = max(1, len(rows) // 4)
    for key, label, unit in SERIES:
        values = np.array([np.nan if r.get(key) is None else float(r[key]) for r in rows])
        if np.all(np.isnan(values)):
            continue
        first, last = np.nanmean(values[:quarter]), np.nanmean(values[-quarter:])
        half = slice(len(rows) // 2, None)
        th, vh = t[half], values[half]
        ok = ~np.isnan(vh)
        slope, r = 0.0, 0.0
        if ok.sum() >= 3 and np.ptp(vh[ok]) > 0:
            slope = float(np.polyfit(th[ok], vh[ok], 1)[0])
            r = float(np.corrcoef(th[ok], vh[ok])[0, 1])
        week = slope * 24 * 7
        grows = slope > 0 and r > 0.5 and week > 0.5 * max(abs(last), 1.0)
        if key.endswith("_ms"):
            verdict = "noisy (shared CPU)" if grows else "flat"
        elif grows and key in caps:
            verdict = f"fills toward its cap ({caps[key]:g})"
        else:
            verdict = "GROWS" if grows else "flat"
        out[key] = {"label": label, "unit": unit, "first_quarter": round(float(first), 2),
                    "last_quarter": round(float(last), 2), "slope_per_hour_2nd_half": round(slope, 2),
                    "r_2nd_half": round(r, 2), "verdict": verdict}
    return out


def plot(rows: list[dict], result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] / 60 for r in rows]
    panels = [("memory (MB)", ["rss_mb", "peer_rss_mb"]), ("threads / fds", ["threads", "fds"]),
              ("entries / partitions / served hits", ["entries", "abandoned_entries", "partitions", "full_partitions",
                                                  "served_hits", "intent_clusters"]),
              ("disk (MB)", ["wal_bytes", "snap_bytes", "spool_dir_bytes"]),
              ("offsets file (KB)", ["offsets_bytes"]),
              ("lookup latency (ms)", ["lookup_p50_ms", "lookup_p99_ms", "service_p50_ms", "service_p99_ms"])]
    scale = {"wal_bytes": 1e-6, "snap_bytes": 1e-6, "spool_dir_bytes": 1e-6, "offsets_bytes": 1e-3}
    labels = {k: lbl for k, lbl, _ in SERIES}
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    for ax, (title, keys) in zip(axes.flat, panels):
        # Entries are in the hundreds, partitions in the tens: the others on a second axis.
        twin = ax.twinx() if keys[0] == "entries" else None
        for n, key in enumerate(keys):  # on the twin: everything after the entries series
            values = [None if r.get(key) is None else r[key] * scale.get(key, 1) for r in rows]
            if any(v is not None for v in values):
                verdict = result["verdicts"].get(key, {}).get("verdict", "")
                target = twin if twin is not None and n > 1 else ax
                target.plot(t, [np.nan if v is None else v for v in values], marker=".", color=f"C{n}",
                            label=f"{labels[key]}: {verdict}")
        ax.set_title(title)
        ax.set_xlabel("minutes")
        handles = ax.get_legend_handles_labels()
        if twin is not None:
            extra = twin.get_legend_handles_labels()
            handles = (handles[0] + extra[0], handles[1] + extra[1])
            ax.set_ylabel("entries")
            twin.set_ylabel("partitions / served hits")
        ax.legend(*handles, fontsize=7)
        if "latency" in title:
            ax.set_yscale("log")
    fig.suptitle(f"soak: one replica for {result['minutes']:g} min at ~{result['rate']:g} req/s "
                 f"(capacity {result['capacity']}/store, TTL {result['ttl_s']:g} s, snapshots every "
                 f"{result['snapshot_s']:g} s); 2 shared cores: latency is noisy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# -- main ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=12.0, help="client requests per second, all replicas")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=25, help="entries per store (namespace x arm)")
    parser.add_argument("--ttl-s", type=float, default=180.0)
    parser.add_argument("--snapshot-s", type=float, default=20.0)
    parser.add_argument("--feedback-memory", type=int, default=2000, help="hits remembered for feedback")
    parser.add_argument("--steady-namespaces", type=int, default=16)
    parser.add_argument("--churn-s", type=float, default=20.0, help="a short-lived namespace opens this often")
    parser.add_argument("--life-s", type=float, default=120.0, help="and lives this long")
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help="a second replica on the same topics takes a share of the traffic")
    parser.add_argument("--peer-share", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="soak", help="name of the json/png under bench/results")
    args = parser.parse_args(argv)
    if min(args.minutes, args.sample_s, args.rate, args.capacity, args.ttl_s, args.snapshot_s) <= 0 \
            or args.clients < 1 or not 0 < args.peer_share < 1:
        parser.error("need positive durations, rate, capacity and clients, and a peer share in (0, 1)")
    questions = Questions(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="scache-soak-"))
    services: list[Service] = []
    rows: list[dict] = []
    try:
        broker = start_broker(tmp / "kafka", heap="384m")
        services.append(broker)
        kafka = KafkaSettings(bootstrap_servers=broker.info["bootstrap"], client_id="scache-soak")
        ensure_topics(kafka)
        experiments = experiments_file(tmp / "experiments.yaml", args.capacity, args.ttl_s)
        with Upstream() as upstream:
            print("starting the replica(s) ...", flush=True)
            main_replica = start_replica("replica-a", tmp / "a", kafka, upstream.port, experiments, args)
            services.append(main_replica)
            peer = None
            if args.peer:
                peer = start_replica("replica-b", tmp / "b", kafka, upstream.port, experiments, args)
                services.append(peer)
            urls = [main_replica.info["url"]] + ([peer.info["url"]] if peer else [])
            weights = [1 - args.peer_share, args.peer_share] if peer else [1.0]
            namespaces = Namespaces(args.steady_namespaces, args.churn_s, args.life_s)
            traffic = Traffic(urls, weights, questions, namespaces, args.rate, args.clients, args.seed).start()
            admin = httpx.Client(base_url=urls[0], timeout=30, headers={"authorization": f"Bearer {TOKEN}"})
            started = time.monotonic()
            deadline = started + args.minutes * 60
            next_sample = started + args.sample_s
            print(f"traffic for {args.minutes:g} min, a sample every {args.sample_s:g} s", flush=True)
            while time.monotonic() < deadline:
                for name in namespaces.tick():  # half the short-lived namespaces end with a clear
                    traffic._count("clear_retired", admin.delete(f"/v1/admin/namespaces/{name}"))
                upstream.calls.clear()  # the stub keeps every call; not ours to measure
                upstream.headers.clear()
                if time.monotonic() >= next_sample:
                    next_sample += args.sample_s
                    if not main_replica.alive():
                        raise RuntimeError("the replica died; see " + str(main_replica.log_path))
                    rows.append(sample(main_replica, peer, traffic, started, args.capacity, set(namespaces.abandoned)))
                    print(line(rows[-1]), flush=True)
                time.sleep(0.5)
            traffic.join()
            admin.close()
    finally:
        for service in reversed(services):
            service.stop()
    result = {"minutes": args.minutes, "sample_s": args.sample_s, "rate": args.rate, "clients": args.clients,
              "capacity": args.capacity, "ttl_s": args.ttl_s, "snapshot_s": args.snapshot_s,
              "feedback_memory": args.feedback_memory, "steady_namespaces": args.steady_namespaces,
              "short_lived_namespaces_opened": namespaces.opened, "peer": args.peer, "peer_share": args.peer_share,
              "requests": dict(traffic.counts), "errors": dict(traffic.errors),
              "note": "2 cores shared with other jobs: latency figures are noisy; memory, threads, fds and "
                      "disk are what the verdicts are for",
              "counters_at_end": {k: rows[-1][k] for k in COUNTERS} if rows else {},
              "verdicts": verdicts(rows, {"served_hits": args.feedback_memory, "intent_clusters": MAX_CLUSTERS}),
              "samples": rows}
    report(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=2))
    plot(rows, result, RESULTS / f"{args.out}.png")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(result: dict) -> None:
    print(f"\nrequests {sum(result['requests'].values())}: {dict(sorted(result['requests'].items()))}")
    print(f"errors: {result['errors'] or 'none'}")
    print(f"counters at the end: {result['counters_at_end']}")
    print(f"\n{'series':<18}{'first quarter':>15}{'last quarter':>15}{'slope/h (2nd half)':>20}{'r':>7}  verdict")
    for v in result["verdicts"].values():
        unit = f" {v['unit']}" if v["unit"] else ""
        print(f"{v['label'] + unit:<18}{v['first_quarter']:>15,.1f}{v['last_quarter']:>15,.1f}"
              f"{v['slope_per_hour_2nd_half']:>20,.1f}{v['r_2nd_half']:>7.2f}  {v['verdict']}")


if __name__ == "__main__":
    sys.exit(main())
