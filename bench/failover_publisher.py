"""What the cache's publisher does while a Kafka broker fails over (a script, not a test).

Starts the production Kafka shape on loopback (infra.kafka.cluster: 3 KRaft brokers, RF 3,
min.insync.replicas 2, broker.session.timeout.ms 4 s as in infra/deploy and the cluster e2e
test) and, for each ``--rates`` value, on fresh topics:

1. an EventPublisher (cache_core.publish.publisher, its defaults: queue 20,000, 10 s delivery timeout,
   batches of 500, 256 MiB spool) gets decisions at that rate from one thread (absolute
   schedule; events are built and serialised on the fly, as a request thread would);
2. after ``--before-s`` the broker leading an events partition is SIGKILLed (the active
   controller when it leads one, the worst case: an election comes before the fencing);
3. the stream goes on for ``--after-s``, then the publisher is flushed and closed;
4. a read_committed consumer reads the events topic to its end offsets and counts every
   request id: missing, duplicated, or exactly once;
5. the killed broker is restarted and waited for in every ISR before the next rate.

Sampled every 50 ms: the publisher's queue depth, spool bytes, published / spooled / dropped
counts, and the backlog (offered - published - dropped: queue + in flight + spool). Reported per
rate: the achieved rate, max queue depth, events spooled / replayed / dropped, the failover (a new
leader for the victim's partitions), the ack stall, the time until the backlog is back to its
pre-kill level, and the read-back. The machine's load is recorded with each run (CPU of the
whole machine, of this process and of the three JVMs, over the run; load average; whether a soak
is running), since the 2 cores are shared.

    python bench/failover_publisher.py [--rates 500,1500,3000,6000] [--before-s 5] [--after-s 20]
Prints a table and saves bench/results/failover_publisher.json and .png (``--out`` names them).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka import KafkaConsumer, TopicPartition  # noqa: E402

from cache_core.events import CacheEvent  # noqa: E402
from cache_core.logs import configure_logging  # noqa: E402
from cache_core.publish.publisher import EventPublisher  # noqa: E402
from cache_core.settings import KafkaSettings  # noqa: E402
from infra.kafka.cluster import KafkaCluster, start_cluster  # noqa: E402
from infra.kafka.topics import ensure_topics  # noqa: E402
from infra.runtime import REPO_ROOT  # noqa: E402
from tests.e2e.test_kafka_cluster import BROKER_OVERRIDES  # noqa: E402  (the deployed 4 s session)

RESULTS = REPO_ROOT / "bench" / "results"
KEYS = 12
SAMPLE_S = 0.05
WARMUP_ID = "warmup"


class LogCounter(logging.Handler):
    """Counts log records by message (the publisher logs every queue-full drop)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.counts: Counter = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.msg] += 1


class Stream(threading.Thread):
    """Offers decisions at ``rate`` per second on an absolute schedule (a slow moment is caught up)."""

    def __init__(self, publisher: EventPublisher, rate: float):
        super().__init__(name="stream", daemon=True)
        self.publisher, self.rate = publisher, rate
        self.sent = 0
        self.started = self.ended = 0.0
        self.max_lag_s = 0.0  # how far the offering fell behind its schedule
        self._halt = threading.Event()

    def run(self) -> None:
        self.started = time.monotonic()
        publish = self.publisher.publish_event
        while not self._halt.is_set():
            now = time.monotonic()
            due = int((now - self.started) * self.rate)
            self.max_lag_s = max(self.max_lag_s, (due - self.sent) / self.rate)
            for _ in range(min(due - self.sent, 2000)):
                n = self.sent
                publish(CacheEvent(request_id=f"r{n:09d}", unit_id=f"u{n % KEYS}", experiment_id="bench",
                                   arm="control", decision="miss", instance_id="bench-failover"))
                self.sent = n + 1
            self._halt.wait(0.002)
        self.ended = time.monotonic()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class Sampler(threading.Thread):
    def __init__(self, publisher: EventPublisher, stream: Stream, t0: float):
        super().__init__(name="sampler", daemon=True)
        self.publisher, self.stream, self.t0 = publisher, stream, t0
        self.rows: list[dict] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_S):
            sent = self.stream.sent
            s = self.publisher.stats()
            self.rows.append({"t": round(time.monotonic() - self.t0, 3), "sent": sent,
                              "queue": s["queue_depth"], "spool_bytes": s["spool_bytes"],
                              "published": s["published"], "spooled": s["spooled"], "dropped": s["dropped"],
                              "backlog": sent - s["published"] - s["dropped"], "healthy": s["broker_healthy"]})

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


class CpuMeter:
    """CPU over an interval, in cores: the whole machine, this process, the cluster's JVMs, the rest."""

    def __init__(self, cluster: KafkaCluster):
        self.cluster = cluster
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.cores = os.cpu_count() or 1
        self.jvm_first: dict[int, int] = {}
        self.jvm_last: dict[int, int] = {}

    def _machine(self) -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields) - fields[3] - fields[4], sum(fields)  # busy, total (idle and iowait out)

    def mark(self) -> None:
        """Read the JVMs' CPU; call before killing one, so its share up to the kill counts."""
        for service in self.cluster.services.values():
            try:
                with open(f"/proc/{service.proc.pid}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
                ticks = int(parts[11]) + int(parts[12])  # utime + stime
            except (OSError, IndexError, ValueError):
                continue
            self.jvm_first.setdefault(service.proc.pid, ticks)
            self.jvm_last[service.proc.pid] = ticks

    def start(self) -> None:
        self.mark()
        self.wall, self.machine, self.self_cpu = time.monotonic(), self._machine(), sum(os.times()[:2])
        self.load_begin, self.soak_begin = os.getloadavg(), soak_running()

    def stop(self) -> dict:
        self.mark()
        wall = time.monotonic() - self.wall
        busy, total = self._machine()
        machine = (busy - self.machine[0]) / max(1, total - self.machine[1]) * self.cores
        me = (sum(os.times()[:2]) - self.self_cpu) / wall
        jvm = sum(self.jvm_last[p] - self.jvm_first[p] for p in self.jvm_first) / self.ticks / wall
        return {"machine_cores_busy": round(machine, 2), "bench_process_cores": round(me, 2),
                "kafka_jvms_cores": round(jvm, 2), "others_cores": round(max(0.0, machine - me - jvm), 2),
                "cores": self.cores, "loadavg_begin": [round(x, 2) for x in self.load_begin],
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                "soak_running": self.soak_begin or soak_running()}


def soak_running() -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"bench/soak.py" in cmdline.read_bytes():
                return True
        except OSError:
            pass
    return False


def settings(cluster: KafkaCluster, rate: int) -> KafkaSettings:
    suffix = f"{rate}-{uuid.uuid4().hex[:6]}"
    return KafkaSettings(bootstrap_servers=cluster.bootstrap, replication_factor=3,
                         events_topic=f"scache.events.fo{suffix}", control_topic=f"scache.control.fo{suffix}",
                         feedback_topic=f"scache.feedback.fo{suffix}", entries_topic=f"scache.entries.fo{suffix}",
                         client_id=f"scache-failover-{suffix}")


def wait_for(check, timeout_s: float, interval_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = check()
            if found:
                return found
        except Exception:  # metadata requests fail while a node goes away
            pass
        time.sleep(interval_s)
    return None


def read_back(kafka: KafkaSettings, timeout_s: float = 120.0) -> Counter:
    """request id -> how many times it is on the events topic (read_committed, to the end offsets)."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=None, enable_auto_commit=False,
                             isolation_level="read_committed", auto_offset_reset="earliest",
                             request_timeout_ms=15_000, max_partition_fetch_bytes=4 * 1024 * 1024)
    try:
        tps = [TopicPartition(kafka.events_topic, p) for p in range(kafka.events_partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        counts: Counter = Counter()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=500, max_records=5000).values():
                for record in records:
                    counts[json.loads(record.value)["request_id"]] += 1
        if any(consumer.position(tp) < ends[tp] for tp in tps):
            raise RuntimeError(f"read-back did not reach the end offsets in {timeout_s}s")
        return counts
    finally:
        consumer.close()


def stall_and_recovery(rows: list[dict], kill_t: float, stream_end_t: float) -> dict:
    """From the samples: the longest ack stall around the kill and when the backlog was back to normal."""
    before = [r for r in rows if r["t"] < kill_t]
    normal = max([r["backlog"] for r in before[len(before) // 2:]] or [0])
    longest, stall_end, since, last = 0.0, None, None, -1
    for r in rows:
        if r["t"] < kill_t - 1.0:
            continue
        if r["published"] != last:
            if since is not None and r["t"] - since > longest:
                longest, stall_end = r["t"] - since, r["t"]
            since, last = r["t"], r["published"]
    after = [r for r in rows if r["t"] > kill_t]
    peak_i = max(range(len(after)), key=lambda i: after[i]["backlog"]) if after else 0
    recovered = next((r["t"] for r in after[peak_i:]
                      if r["backlog"] <= max(normal, 500) and r["spool_bytes"] == 0), None)
    return {"ack_stall_s": round(longest, 2),
            "acks_resumed_after_kill_s": round(stall_end - kill_t, 2) if stall_end else None,
            "backlog_normal": normal,
            "backlog_peak": after[peak_i]["backlog"] if after else None,
            "recovered_after_kill_s": round(recovered - kill_t, 2) if recovered is not None else None,
            "recovered_before_stream_end": recovered is not None and recovered <= stream_end_t}


def throughput(rows: list[dict], kill_t: float, window_s: float = 2.0) -> dict:
    """Acknowledged events per second: over the healthy seconds before the kill, and the best
    ``window_s`` window of the run (with a backlog waiting, that is what the publisher can drain)."""
    def rate(a: dict, b: dict) -> float:
        return (b["published"] - a["published"]) / max(1e-9, b["t"] - a["t"])
    before = [r for r in rows if 1.0 <= r["t"] <= kill_t]
    best, j = 0.0, 0
    for i, r in enumerate(rows):
        while rows[j]["t"] < r["t"] - window_s:
            j += 1
        if r["t"] - rows[j]["t"] >= window_s * 0.9:
            best = max(best, rate(rows[j], r))
    return {"acked_per_s_before_kill": round(rate(before[0], before[-1]), 1) if len(before) > 1 else None,
            "acked_per_s_best_2s": round(best, 1)}


def run_rate(cluster: KafkaCluster, rate: int, args, tmp: Path, logs: LogCounter) -> dict:
    kafka = settings(cluster, rate)
    ensure_topics(kafka)
    wait_for(lambda: all(len(p["isr"]) == 3 for p in cluster.partitions(kafka.events_topic).values()), 60)
    parts = cluster.partitions(kafka.events_topic)
    controller = cluster.active_controller()
    leaders = {info["leader"] for info in parts.values()}
    victim = controller if controller in leaders else parts[0]["leader"]
    led = sorted(p for p, info in parts.items() if info["leader"] == victim)
    logs.counts.clear()
    cpu = CpuMeter(cluster)
    cpu.start()
    publisher = EventPublisher(kafka, tmp / f"spool-{rate}", instance_id=f"bench-{rate}",
                               queue_size=args.queue_size, max_batch=args.max_batch)
    # A new producer spends a second or two on its connections and metadata: not part of the run.
    publisher.publish_event(CacheEvent(request_id=WARMUP_ID, unit_id="u0", instance_id="bench-failover"))
    if not publisher.flush(30):
        raise RuntimeError("the warm-up event was not acknowledged in 30 s")
    warm = publisher.stats()
    t0 = time.monotonic()
    stream = Stream(publisher, rate)
    sampler = Sampler(publisher, stream, t0)
    sampler.start()
    stream.start()
    try:
        time.sleep(args.before_s)
        cpu.mark()
        kill_t = time.monotonic() - t0
        cluster.kill_node(victim)
        new_leader = wait_for(lambda: all(cluster.partitions(kafka.events_topic)[p]["leader"] not in (victim, -1)
                                          for p in led), 60)
        failover_s = round(time.monotonic() - t0 - kill_t, 2) if new_leader else None
        time.sleep(max(0.0, t0 + kill_t + args.after_s - time.monotonic()))
        stream.stop()
        stream_end_t = time.monotonic() - t0
        at_stop = publisher.stats()
        flushed = publisher.flush(timeout_s=args.flush_timeout_s)
        flush_s = round(time.monotonic() - t0 - stream_end_t, 2)
        time.sleep(0.2)
        stats = publisher.stats()
    finally:
        stream.stop()
        sampler.stop()
        publisher.close()
    load = cpu.stop()
    counts = read_back(kafka)
    sent = stream.sent
    ids = {f"r{n:09d}" for n in range(sent)}
    counts.pop(WARMUP_ID, None)
    missing = len(ids - counts.keys())
    dups = sum(c - 1 for c in counts.values() if c > 1)
    extra = len(counts.keys() - ids)
    duration = stream.ended - stream.started
    rows = sampler.rows
    result = {
        "rate_target": rate, "rate_achieved": round(sent / duration, 1), "offer_max_lag_s": round(stream.max_lag_s, 2),
        "sent": sent, "victim": victim, "victim_was_controller": victim == controller, "victim_led": led,
        "failover_s": failover_s, "max_queue_depth": max(r["queue"] for r in rows),
        "queue_size": args.queue_size,
        "max_spool_bytes": max(r["spool_bytes"] for r in rows),
        "spooled": stats["spooled"], "replayed": stats["replayed"], "dropped": stats["dropped"],
        "dropped_before_kill": max((r["dropped"] for r in rows if r["t"] <= kill_t), default=0),
        "send_failures": stats["send_failures"], "published": stats["published"] - warm["published"],
        **throughput(rows, kill_t),
        "queue_full_logs": logs.counts.get("publish queue full, message dropped", 0),
        "spool_full_logs": logs.counts.get("spool full, messages dropped", 0),
        "at_stream_stop": {k: at_stop[k] for k in ("queue_depth", "spool_bytes", "published")},
        "flushed": flushed, "flush_s": flush_s,
        "read_back": {"distinct": len(counts.keys() & ids), "missing": missing, "duplicates": dups,
                      "unknown": extra, "exactly_once": missing == 0 and dups == 0 and extra == 0},
        "missing_equals_dropped": missing == stats["dropped"],
        **stall_and_recovery(rows, kill_t, stream_end_t),
        "kill_t": round(kill_t, 3), "stream_end_t": round(stream_end_t, 3),
        "load": load, "samples": rows,
    }
    restarted = time.monotonic()
    cluster.start_node(victim)
    back = wait_for(lambda: all(len(p["isr"]) == 3 for p in cluster.partitions(kafka.events_topic).values()),
                    120, interval_s=0.5)
    result["victim_rejoined_isr_s"] = round(time.monotonic() - restarted, 1) if back else None
    return result


COLUMNS = [("rate_target", "target/s"), ("rate_achieved", "offered/s"), ("acked_per_s_before_kill", "acked/s pre-kill"),
           ("acked_per_s_best_2s", "acked/s best 2s"), ("failover_s", "failover s"),
           ("ack_stall_s", "ack stall s"), ("max_queue_depth", "max queue"), ("spooled", "spooled"),
           ("replayed", "replayed"), ("dropped_before_kill", "dropped pre-kill"), ("dropped", "dropped"), ("recovered_after_kill_s", "recovered s"),
           ("missing", "missing"), ("duplicates", "dups"), ("exactly_once", "exactly once"),
           ("others_cores", "others' cores"), ("loadavg", "load 1m")]


def table(results: list[dict]) -> str:
    rows = []
    for r in results:
        flat = {**r, **r["read_back"], **r["load"], "loadavg": r["load"]["loadavg_begin"][0]}
        rows.append([str(flat.get(key)) for key, _ in COLUMNS])
    heads = [h for _, h in COLUMNS]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(row) for row in rows])


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for r in results:
        t = [s["t"] - r["kill_t"] for s in r["samples"]]
        label = f"{r['rate_target']}/s (offered {r['rate_achieved']:.0f}/s)"
        line, = axes[0].plot(t, [s["queue"] for s in r["samples"]], label=label)
        axes[1].plot(t, [s["spool_bytes"] / 1e6 for s in r["samples"]], color=line.get_color())
        axes[2].plot(t, [s["dropped"] for s in r["samples"]], color=line.get_color())
        if r["failover_s"]:
            for ax in axes:
                ax.axvline(r["failover_s"], color=line.get_color(), linestyle=":", linewidth=1)
    axes[0].axhline(results[0]["queue_size"], color="grey", linestyle="--", linewidth=1, label="queue size")
    for ax in axes:
        ax.axvline(0, color="black", linewidth=1)
    axes[0].set_ylabel("publisher queue depth")
    axes[0].set_title("EventPublisher during a broker SIGKILL at t=0 (3 brokers, RF 3; dotted: new leader)")
    axes[0].legend(fontsize=8)
    axes[1].set_ylabel("spool pending (MB)")
    axes[2].set_ylabel("dropped (cumulative)")
    axes[2].set_xlabel("seconds since the kill")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,1500,3000,6000", help="events/s, comma-separated")
    parser.add_argument("--before-s", type=float, default=5.0, help="stream this long before the kill")
    parser.add_argument("--after-s", type=float, default=20.0, help="and this long after it")
    parser.add_argument("--flush-timeout-s", type=float, default=180.0)
    parser.add_argument("--queue-size", type=int, default=20_000, help="EventPublisher queue_size (its default)")
    parser.add_argument("--max-batch", type=int, default=500, help="EventPublisher max_batch (its default 500)")
    parser.add_argument("--out", default="failover_publisher")
    args = parser.parse_args(argv)
    try:
        rates = [int(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        parser.error("--rates takes integers, e.g. 500,1500")
    if not rates or min(rates) < 1 or args.before_s <= 0 or args.after_s <= 0:
        parser.error("need positive rates and durations")
    configure_logging("WARNING")
    # Every queue-full drop is an error line: count them instead of printing thousands.
    logs = LogCounter()
    logging.getLogger().handlers[:] = [logs]
    started = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="scache-bench-failover-") as tmp_name:
        tmp = Path(tmp_name)
        print("starting a 3-broker cluster ...", flush=True)
        cluster = start_cluster(tmp / "cluster", 3, overrides=BROKER_OVERRIDES)
        try:
            for rate in rates:
                print(f"rate {rate}/s ...", flush=True)
                r = run_rate(cluster, rate, args, tmp, logs)
                results.append(r)
                print(f"  achieved {r['rate_achieved']}/s, max queue {r['max_queue_depth']}, spooled {r['spooled']}, "
                      f"dropped {r['dropped']}, failover {r['failover_s']} s, read back: {r['read_back']}, "
                      f"victim rejoined ISR in {r['victim_rejoined_isr_s']} s", flush=True)
        finally:
            cluster.stop()
    out = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           "cluster": {"nodes": 3, "replication": 3, "overrides": BROKER_OVERRIDES},
           "publisher": {"queue_size": args.queue_size, "send_timeout_s": 10.0, "max_batch": args.max_batch, "max_spool_mib": 256},
           "before_s": args.before_s, "after_s": args.after_s,
           "cpu_count": os.cpu_count(), "results": results}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    plot(results, RESULTS / f"{args.out}.png")
    print(table(results))
    print(f"saved {RESULTS / (args.out + '.json')} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
