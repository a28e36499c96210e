"""Sustained throughput and freshness of the attribution pipeline (a script, not a test).

Starts a Kafka broker, the embedded warehouse and the Flink job (as tests/fixtures/flink.py
does), produces decisions to the events topic at ``--rate`` events/s (stamped with the
current time) for ``--duration`` s, and samples ClickHouse every ``--poll-s``:

- throughput: rows in events_raw per second over the steady part of the run;
- freshness: poll time minus the newest visible event's ts_ms (events_raw), i.e. how old
  the freshest visible event is (an upper bound of event -> ClickHouse latency, +poll-s);
- window_agg lag: poll time minus the newest visible window_end;
- per Flink vertex (operator chain): busy / backpressured / idle ms per second from the
  mini-cluster's REST API, averaged over the steady part (where the time goes);
- the machine's load average at start and end (the machine is shared).

    python bench/pipeline_throughput.py --rate 5000 --duration 60
Prints a JSON summary and saves bench/results/pipeline_throughput.png (+ .json).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import urllib.request
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cache_core.chclient import connect  # noqa: E402
from cache_core.settings import ClickHouseSettings, KafkaSettings  # noqa: E402
from infra.clickhouse.migrate import apply_migrations  # noqa: E402
from infra.clickhouse.warehouse import start_warehouse  # noqa: E402
from infra.flink.resolve import connector_jar  # noqa: E402
from infra.kafka.broker import start_broker  # noqa: E402
from infra.kafka.topics import ensure_topics  # noqa: E402
from infra.runtime import REPO_ROOT, spawn, wait_until  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results"
RUNNING_MARKER = "attribution job running"


FLINK_METRICS = ("busyTimeMsPerSecond", "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond")


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _cpu_ticks(stat_path: Path) -> tuple[str, int]:
    text = stat_path.read_text()
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return name, int(fields[11]) + int(fields[12])  # utime + stime


def cpu_by_thread(job_pid: int) -> dict[str, float]:
    """CPU seconds so far of the job's processes: JVM threads by name (Flink names task
    threads after their operator chain), Python processes by their role."""
    out: dict[str, float] = {}
    for pid in _descendants(job_pid) | {job_pid}:
        try:
            name, ticks = _cpu_ticks(Path(f"/proc/{pid}/stat"))
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if name == "java":
                for task in Path(f"/proc/{pid}/task").iterdir():
                    thread, ticks = _cpu_ticks(task / "stat")
                    key = f"jvm:{re.sub(r'[-#0-9 ]+$', '', thread)}"
                    out[key] = out.get(key, 0.0) + ticks * TICK_S
                continue
        except OSError:
            continue
        role = "python:job client" if pid == job_pid else (
            "python:udf/sink worker" if "pyflink" in cmdline or "beam" in cmdline else f"other:{name}")
        out[role] = out.get(role, 0.0) + ticks * TICK_S
    return out


def cpu_per_kevent(before: dict[str, float], after: dict[str, float], events: int) -> dict[str, float]:
    """CPU ms per 1,000 events stored, per thread group, largest first (groups under 1 ms left out)."""
    per = {k: (after.get(k, 0.0) - before.get(k, 0.0)) * 1000 / max(1, events) * 1000 for k in after}
    return {k: round(v, 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 1.0}


def flink_rest_url(job_pid: int) -> str | None:
    """The mini-cluster's REST address: a port the job's JVM listens on that answers /jobs/overview."""
    pids = _descendants(job_pid) | {job_pid}
    listing = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if not owners & pids:
            continue
        port = line.split()[3].rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}"
        try:
            _get_json(f"{url}/jobs/overview", timeout=1.0)
            return url
        except Exception:  # noqa: BLE001 - another protocol on that port (RPC, Python workers)
            continue
    return None


def vertex_metrics(url: str) -> dict[str, dict[str, float]]:
    """Per vertex name: FLINK_METRICS averaged over its subtasks, plus records in/out per second."""
    job = _get_json(f"{url}/jobs/overview")["jobs"][0]["jid"]
    out = {}
    for vertex in _get_json(f"{url}/jobs/{job}")["vertices"]:
        names = ",".join(FLINK_METRICS + ("numRecordsInPerSecond", "numRecordsOutPerSecond"))
        rows = _get_json(f"{url}/jobs/{job}/vertices/{vertex['id']}/subtasks/metrics?get={names}")
        out[vertex["name"][:120]] = {r["id"]: round(float(r.get("avg", 0.0)), 1) for r in rows}
    return out


def mean_metrics(snapshots: list[dict]) -> dict[str, dict[str, float]]:
    merged: dict[str, dict[str, list[float]]] = {}
    for snapshot in snapshots:
        for vertex, metrics in snapshot.items():
            for name, value in metrics.items():
                merged.setdefault(vertex, {}).setdefault(name, []).append(value)
    return {v: {n: round(sum(x) / len(x), 1) for n, x in m.items()} for v, m in merged.items()}


def event_template(rng: random.Random, experiment: str) -> str:
    """One decision as JSON text with ``{rid}`` and ``{ts}`` slots (filled per send)."""
    hit = rng.random() < 0.5
    age = rng.choice((None, 10.0, 900.0, 2500.0))
    body = json.dumps({
        "event_type": "decision", "request_id": "RID", "ts_ms": 0,
        "instance_id": "bench", "namespace": "default", "experiment_id": experiment,
        "arm": rng.choice(("control", "treatment")), "unit_id": f"u{rng.randrange(1000)}",
        "config_version": 1, "variant": "canary" if rng.random() < 0.1 else "base",
        "decision": "hit" if hit else "miss", "hit": hit, "threshold": 0.85,
        "similarity": round(rng.uniform(0.5, 1.0), 4), "intent_cluster": rng.randrange(8),
        "entry_id": None if age is None else "e1", "entry_age_s": age,
        "entry_ttl_s": None if age is None else 3600.0, "index_kind": "flat",
        "ann_checked": False, "latency_ms": round(rng.uniform(0.5, 30.0), 2),
    })
    body = body.replace("{", "{{").replace("}", "}}")
    return body.replace('"RID"', '"{rid}"').replace('"ts_ms": 0', '"ts_ms": {ts}')


def produce(kafka: KafkaSettings, experiment: str, rate: int, duration_s: float) -> int:
    """Send ``rate`` events/s in 50 ms ticks, plus a heartbeat per partition every second."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks=1, linger_ms=20,
                             batch_size=256 * 1024, compression_type=None)
    rng = random.Random(1)
    # The producer shares the 2 cores with the job: per event only a string format.
    templates = [event_template(rng, experiment) for _ in range(997)]
    run = uuid.uuid4().hex[:16]
    sent, started, next_beat = 0, time.monotonic(), 0.0
    try:
        while (elapsed := time.monotonic() - started) < duration_s:
            due = int(rate * elapsed)
            now_ms = int(time.time() * 1000)
            for i in range(sent, due):
                body = templates[i % len(templates)].format(rid=f"{run}{i:016x}", ts=now_ms)
                producer.send(kafka.events_topic, body.encode())
            sent = max(sent, due)
            if elapsed >= next_beat:
                beat = json.dumps({"event_type": "heartbeat", "ts_ms": now_ms, "instance_id": "bench"}).encode()
                for p in range(kafka.events_partitions):
                    producer.send(kafka.events_topic, beat, partition=p)
                next_beat += 1.0
            time.sleep(0.05)
        producer.flush(60)
    finally:
        producer.close()
    return sent


def sample(client, experiment: str) -> dict:
    rows, newest_ms = client.query(
        "SELECT count(), max(ts_ms) FROM events_raw WHERE experiment_id = {e:String}",
        parameters={"e": experiment}).result_rows[0]
    window_end = client.query(
        "SELECT toUnixTimestamp64Milli(max(window_end)), sum(requests) FROM window_agg FINAL"
        " WHERE experiment_id = {e:String}", parameters={"e": experiment}).result_rows[0]
    return {"t": time.time(), "rows": int(rows), "newest_ms": int(newest_ms or 0),
            "window_end_ms": int(window_end[0] or 0), "agg_requests": int(window_end[1] or 0)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarize(samples: list[dict], produced: int, started: float, duration_s: float) -> dict:
    steady = [s for s in samples if started + 0.25 * duration_s <= s["t"] <= started + duration_s]
    fresh = [s["t"] - s["newest_ms"] / 1000 for s in steady if s["newest_ms"]]
    window_lag = [s["t"] - s["window_end_ms"] / 1000 for s in steady if s["window_end_ms"]]
    rate = ((steady[-1]["rows"] - steady[0]["rows"]) / (steady[-1]["t"] - steady[0]["t"])
            if len(steady) > 1 else 0.0)
    return {"produced": produced, "stored": samples[-1]["rows"] if samples else 0,
            "agg_requests": samples[-1]["agg_requests"] if samples else 0,
            "sustained_events_per_s": round(rate, 1),
            "freshness_p50_s": round(percentile(fresh, 0.5), 2),
            "freshness_p95_s": round(percentile(fresh, 0.95), 2),
            "window_agg_lag_p50_s": round(percentile(window_lag, 0.5), 2),
            "window_agg_lag_p95_s": round(percentile(window_lag, 0.95), 2)}


def plot(samples: list[dict], started: float, summary: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] - started for s in samples]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    rates = [0.0] + [(samples[i]["rows"] - samples[i - 1]["rows"]) / max(1e-3, samples[i]["t"] - samples[i - 1]["t"])
                     for i in range(1, len(samples))]
    a.plot(t, rates, label="events_raw rows/s")
    a.axhline(summary["sustained_events_per_s"], ls="--", c="gray", label="sustained")
    a.set_ylabel("rows/s")
    a.legend()
    a.set_title(title)
    b.plot(t, [s["t"] - s["newest_ms"] / 1000 if s["newest_ms"] else None for s in samples], label="raw freshness")
    b.plot(t, [s["t"] - s["window_end_ms"] / 1000 if s["window_end_ms"] else None for s in samples],
           label="window_agg lag")
    b.set_ylabel("seconds")
    b.set_xlabel("seconds since produce start")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def warm_up(kafka: KafkaSettings, client, experiment: str, timeout_s: float = 180.0) -> None:
    """Wait until a first event reaches ClickHouse: RUNNING comes before the Python workers
    are up, and the startup backlog would otherwise count against steady-state freshness."""
    produce(kafka, f"{experiment}-warmup", rate=100, duration_s=1.0)
    wait_until(lambda: sample(client, f"{experiment}-warmup")["rows"] > 0, timeout_s,
               "first event in events_raw", interval_s=0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--drain", type=float, default=30.0, help="extra polling after producing stops")
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--window-s", type=int, default=5)
    parser.add_argument("--name", default="pipeline_throughput")
    parser.add_argument("--job-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the job (A/B experiments)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="scache-bench-"))
    services = []
    try:
        broker = start_broker(root / "kafka")
        services.append(broker)
        kafka = KafkaSettings(bootstrap_servers=broker.info["bootstrap"])
        ensure_topics(kafka)
        warehouse = start_warehouse(root / "warehouse")
        services.append(warehouse)
        ch = ClickHouseSettings(url=warehouse.info["url"])
        apply_migrations(connect(ch, database="default"), ch.database)
        env = {"SCACHE_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "SCACHE_CLICKHOUSE__URL": ch.url,
               "SCACHE_FLINK__CONNECTOR_JAR": str(connector_jar()),
               "SCACHE_FLINK__CHECKPOINT_DIR": str(root / "checkpoints"),
               "SCACHE_FLINK__PARALLELISM": str(args.parallelism), "SCACHE_FLINK__WINDOW_S": str(args.window_s),
               "SCACHE_FLINK__WATERMARK_DELAY_S": "2", "SCACHE_FLINK__ALLOWED_LATENESS_S": "2",
               **dict(kv.split("=", 1) for kv in args.job_env)}
        experiment = f"bench-{uuid.uuid4().hex[:6]}"
        log_path = root / "job.log"
        t0 = time.monotonic()
        job = spawn("flink-job", [sys.executable, str(REPO_ROOT / "jobs" / "attribution_job.py")], log_path, env=env)
        services.append(job)
        wait_until(lambda: RUNNING_MARKER in log_path.read_text(errors="replace"), 300, "flink job",
                   interval_s=0.5, proc=job.proc, log_path=log_path)
        startup_s = time.monotonic() - t0
        client = connect(ch)
        rest = None
        for _ in range(20):  # the REST endpoint may answer a little after RUNNING
            if (rest := flink_rest_url(job.proc.pid)) is not None:
                break
            time.sleep(0.5)
        print(f"flink rest: {rest}", flush=True)
        warm_up(kafka, client, experiment)
        import threading

        produced: list[int] = []
        started = time.time()
        producer = threading.Thread(target=lambda: produced.append(produce(kafka, experiment, args.rate,
                                                                         args.duration)))
        producer.start()
        samples, snapshots = [], []
        cpu_start = cpu_end = None
        while time.time() < started + args.duration + args.drain:
            samples.append(sample(client, experiment))
            steady = started + 0.25 * args.duration <= time.time() <= started + args.duration
            if steady and cpu_start is None:
                cpu_start = (cpu_by_thread(job.proc.pid), samples[-1]["rows"])
            if not steady and cpu_start is not None and cpu_end is None and time.time() > started:
                cpu_end = (cpu_by_thread(job.proc.pid), samples[-1]["rows"])
            if rest and steady and len(samples) % 4 == 0:
                snapshots.append(vertex_metrics(rest))
            if not producer.is_alive() and samples[-1]["rows"] >= (produced or [0])[0] > 0:
                break
            time.sleep(args.poll_s)
        producer.join()
        summary = {"rate_target": args.rate, "duration_s": args.duration, "parallelism": args.parallelism,
                   "window_s": args.window_s, "job_env": args.job_env,
                   "job_startup_s": round(startup_s, 1),
                   "load_avg_1m_start": round(load_start[0], 2),
                   "load_avg_1m_end": round(os.getloadavg()[0], 2),
                   **summarize(samples, produced[0], started, args.duration),
                   "cpu_ms_per_1000_events": (cpu_per_kevent(cpu_start[0], cpu_end[0], cpu_end[1] - cpu_start[1])
                                              if cpu_start and cpu_end else {}),
                   "vertices": mean_metrics(snapshots)}
        RESULTS.mkdir(parents=True, exist_ok=True)
        plot(samples, started, summary, RESULTS / f"{args.name}.png",
             f"target {args.rate}/s, p={args.parallelism}: sustained {summary['sustained_events_per_s']}/s, "
             f"freshness p95 {summary['freshness_p95_s']} s")
        (RESULTS / f"{args.name}.json").write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary, indent=2))
        return 0
    finally:
        for service in reversed(services):
            service.stop()


if __name__ == "__main__":
    sys.exit(main())
