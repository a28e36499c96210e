"""What the sampled ANN-vs-exact checks cost: single exact scans vs batched ones.

    python -m bench.ann_check_cost [--entries 100000] [--index hnsw] [--rate 0.1]
                                   [--lookups 3000] [--concurrency 4] [--rounds 2]
                                   [--batch-size 64] [--batch-wait-ms 50]
                                   [--modes none,single,single-blas2,batched,batched:200,budget:0.05]

One partition of ``--entries`` 384-d vectors (banking77 train encoded for real plus
noisy copies, as bench/lookup_latency.py), one HNSW index shared by every phase. Each
phase sends ``--lookups`` banking77 test queries from ``--concurrency`` threads through
``SemanticCache.lookup`` with the service's pieces (BatchingEncoder, EventWorker) and
checks sampled at ``--rate``:

* ``none``: no checks (the baseline for the process CPU);
* ``single``: each check scans alone in the event worker (the path before batching);
* ``single-blas2``: the same with numpy's BLAS on 2 threads (the service's setting
  before ``set_search_threads`` also limited BLAS);
* ``batched``: checks batched per partition by an ``AnnChecker`` (``--batch-size``,
  ``--batch-wait-ms``); ``batched:<ms>`` the same with another wait (how full batches
  get depends on the check arrival rate: about rate x lookups/s x wait, plus one).
* ``budget:<share>``: batched, with the checker's CPU budget (``cpu_share``, of one core;
  the service's ``SCACHE_CACHE__ANN_CHECK_CPU_SHARE``): past it the cache skips sampled
  checks, so the process CPU per lookup should approach ``none``'s plus the share.

Phases are interleaved over ``--rounds`` rounds, so load drift on a shared machine
hits them alike. Figures per mode: CPU seconds per 1000 checks, measured in the threads
that run the scans (thread CPU time around every check / batch) and, as a cross-check,
from the process CPU over the phase minus the ``none`` baseline; lookup p50/p99 (wall
time of ``lookup`` in the client thread, encode included); checks run and skipped
(sampled while the event backlog was long, or dropped by the checker); mean batch size.

Prints one JSON object; writes bench/results/ann_check_cost.json and .png.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from bench.lookup_latency import BANKING77, corpus_vectors, fill, pct, registry_for
from cache_core.cache import SemanticCache
from cache_core.embedding.batching import BatchingEncoder
from cache_core.embedding.load import load_embedder
from cache_core.publish.event_worker import EventWorker
from cache_core.settings import CacheSettings
from cache_core.store.ann_check import AnnChecker
from cache_core.store.faiss import set_search_threads
from cache_core.store.partition import Partition

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("none", "single", "single-blas2", "batched")


class CheckCpu:
    """Thread CPU time spent inside the exact scans (single and batched), wrapped at the
    class so the cache code runs unchanged."""

    def __init__(self):
        self.seconds = 0.0
        self.lock = threading.Lock()
        for name in ("ann_check", "ann_check_many"):
            setattr(Partition, name, self._timed(getattr(Partition, name)))

    def _timed(self, method):
        def timed(*args, **kwargs):
            started = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds += time.thread_time() - started
        return timed


class Recorder:
    """The event sink: counts checked events."""

    def __init__(self):
        self.events = self.checked = 0
        self.lock = threading.Lock()

    def __call__(self, event) -> None:
        with self.lock:
            self.events += 1
            self.checked += bool(event.ann_checked)


def _valid_mode(mode: str) -> bool:
    """One of MODES, ``batched:<wait ms>`` or ``budget:<share>`` (a number >= 0)."""
    kind, _, value = mode.partition(":")
    if not value:
        return kind in MODES
    try:
        return kind in ("batched", "budget") and float(value) >= 0
    except ValueError:
        return False


def run_phase(cache: SemanticCache, recorder: Recorder, check_cpu: CheckCpu, mode: str,
              queries: list[str], concurrency: int, rate: float, args) -> dict:
    checker = None
    kind, _, value = mode.partition(":")
    if kind in ("batched", "budget"):
        wait_ms = float(value) if kind == "batched" and value else args.batch_wait_ms
        checker = AnnChecker(batch_size=args.batch_size, max_wait_ms=wait_ms,
                             cpu_share=float(value) if kind == "budget" else 0.0)
    cache.ann_checker = cache.emitter.ann_checker = checker  # the cache submits, its emitter waits
    set_search_threads(1)
    if mode == "single-blas2":
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=2, user_api="blas")
    sampled = [0]
    real_sample = SemanticCache._sample

    def sample(self, _rate: float) -> bool:
        hit = mode != "none" and real_sample(self, rate)
        sampled[0] += hit
        return hit

    cache._sample = sample.__get__(cache)
    recorder.events = recorder.checked = 0
    cpu_before, scan_before = time.process_time(), check_cpu.seconds
    latencies: list[float] = []
    lock = threading.Lock()

    def ask(i: int) -> None:
        started = time.perf_counter()
        cache.lookup(queries[i % len(queries)], unit_id=f"u{i}", experiment_id="bench")
        elapsed = (time.perf_counter() - started) * 1000
        with lock:
            latencies.append(elapsed)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(ask, range(len(queries))))
    wall = time.perf_counter() - started
    if checker is not None:
        checker.close()  # runs what is pending, so every event below is final
    assert cache.flush_events(120.0)
    cpu = time.process_time() - cpu_before
    scan_cpu = check_cpu.seconds - scan_before
    stats = checker.stats() if checker is not None else None
    cache.ann_checker = cache.emitter.ann_checker = None
    del cache._sample
    set_search_threads(1)
    return {
        "mode": mode, "lookups": len(latencies), "lookups_per_s": round(len(latencies) / wall, 1),
        "lookup_p50_ms": round(float(np.median(latencies)), 3),
        "lookup_p99_ms": round(pct(latencies, 99), 3),
        "sampled": sampled[0], "checked": recorder.checked,
        "skipped_or_dropped": sampled[0] - recorder.checked,
        "scan_cpu_s": round(scan_cpu, 3), "process_cpu_s": round(cpu, 3),
        "scan_cores": round(scan_cpu / wall, 3),
        "batches": stats["batches"] if stats else None,
        "checker_dropped": {k: v for k, v in stats["dropped"].items() if v} if stats else None,
        "hurried": stats["hurried"] if stats else None,
        "mean_batch": round(stats["checked"] / stats["batches"], 2) if stats and stats["batches"] else None,
    }


def aggregate(phases: list[dict]) -> dict:
    """Per mode over the rounds: sums for counts/CPU, medians of the latency figures."""
    base = [p for p in phases if p["mode"] == "none"]
    base_cpu_per_lookup = sum(p["process_cpu_s"] for p in base) / max(1, sum(p["lookups"] for p in base))
    out = {}
    for mode in dict.fromkeys(p["mode"] for p in phases):
        runs = [p for p in phases if p["mode"] == mode]
        checked = sum(p["checked"] for p in runs)
        lookups = sum(p["lookups"] for p in runs)
        scan = sum(p["scan_cpu_s"] for p in runs)
        extra = sum(p["process_cpu_s"] for p in runs) - base_cpu_per_lookup * lookups
        batches = sum(p["batches"] or 0 for p in runs)
        out[mode] = {
            "lookups": lookups, "sampled": sum(p["sampled"] for p in runs), "checked": checked,
            "skipped_or_dropped": sum(p["skipped_or_dropped"] for p in runs),
            "scan_cpu_s_per_1000_checks": round(1000 * scan / checked, 2) if checked else None,
            "process_cpu_s_per_1000_checks": round(1000 * extra / checked, 2) if checked else None,
            "process_cpu_ms_per_lookup": round(1000 * sum(p["process_cpu_s"] for p in runs) / lookups, 3),
            "lookup_p50_ms": round(float(np.median([p["lookup_p50_ms"] for p in runs])), 3),
            "lookup_p99_ms": round(float(np.median([p["lookup_p99_ms"] for p in runs])), 3),
            "lookups_per_s": round(float(np.median([p["lookups_per_s"] for p in runs])), 1),
            "scan_cores": round(float(np.median([p["scan_cores"] for p in runs])), 3),
            "mean_batch": round(checked / batches, 2) if batches else None,
        }
    return out


def plot(summary: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    checked = [m for m in summary if summary[m]["checked"]]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    xs = np.arange(len(checked))
    scan = [summary[m]["scan_cpu_s_per_1000_checks"] for m in checked]
    proc = [summary[m]["process_cpu_s_per_1000_checks"] for m in checked]
    left.bar(xs - 0.2, scan, 0.4, label="in the scanning thread")
    left.bar(xs + 0.2, proc, 0.4, label="process CPU minus no-check baseline")
    left.set_xticks(xs, checked)
    left.set_ylabel("CPU seconds per 1000 checks")
    left.legend(fontsize=8)
    left.set_title("check cost")
    modes = list(summary)
    xs = np.arange(len(modes))
    middle.bar(xs, [summary[m]["scan_cores"] for m in modes], 0.6)
    for x, mode in zip(xs, modes):
        middle.annotate(f'{summary[mode]["checked"]} of {summary[mode]["sampled"]} run', (x, summary[mode]["scan_cores"]),
                        ha="center", va="bottom", fontsize=8)
        if mode.startswith("budget:"):
            share = float(mode.split(":")[1])
            middle.hlines(share, x - 0.4, x + 0.4, colors="k", linestyles="dashed")
    middle.set_xticks(xs, modes)
    middle.set_ylabel("cores spent scanning (dashed: the budget)")
    middle.set_title("what the checks cost the replica")
    right.bar(xs - 0.2, [summary[m]["lookup_p50_ms"] for m in modes], 0.4, label="p50")
    right.bar(xs + 0.2, [summary[m]["lookup_p99_ms"] for m in modes], 0.4, label="p99")
    right.set_xticks(xs, modes)
    right.set_ylabel("lookup latency, ms (encode included)")
    right.legend(fontsize=8)
    right.set_title("concurrent lookups")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="onnx-int8", choices=["torch", "onnx", "onnx-int8"])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--index", default="hnsw", choices=["flat", "hnsw", "ivf"])
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--lookups", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batch-wait-ms", type=float, default=50.0)
    parser.add_argument("--modes", default=",".join(MODES) + ",batched:200,budget:0.05")
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if not _valid_mode(mode):
            parser.error(f"unknown mode {mode!r}: none, single, single-blas2, batched[:<wait ms>] or budget:<share>")
    set_search_threads(1)
    embedder = load_embedder(CacheSettings(encoder_backend=args.backend, encoder_threads=1))
    test = pd.read_csv(BANKING77 / "test.csv")
    queries = list(test.sample(min(args.lookups, len(test)), random_state=0).text)
    while len(queries) < args.lookups:
        queries += queries[: args.lookups - len(queries)]
    texts, answers, vectors = corpus_vectors(embedder, args.entries)
    encoder = BatchingEncoder(embedder)
    recorder, worker = Recorder(), EventWorker()
    cache = SemanticCache(encoder, registry_for(args.index, args.entries, args.rate),
                          event_sink=recorder, event_executor=worker, seed=0)
    set_search_threads(2)  # build in parallel
    build_s = fill(cache, texts, answers, vectors)
    set_search_threads(1)
    check_cpu = CheckCpu()
    warm = run_phase(cache, recorder, check_cpu, "none", queries[:200], args.concurrency, args.rate, args)
    phases = []
    for round_no in range(args.rounds):
        for mode in modes:
            phase = run_phase(cache, recorder, check_cpu, mode, queries, args.concurrency, args.rate, args)
            phase["round"] = round_no
            phases.append(phase)
            print(json.dumps(phase), flush=True)
    summary = aggregate(phases)
    result = {"backend": args.backend, "entries": args.entries, "dim": int(vectors.shape[1]),
              "index": args.index, "rate": args.rate, "concurrency": args.concurrency,
              "lookups_per_phase": args.lookups, "rounds": args.rounds,
              "batch_size": args.batch_size, "batch_wait_ms": args.batch_wait_ms,
              "index_build_s": round(build_s, 1), "warmup_lookups_per_s": warm["lookups_per_s"],
              "summary": summary, "phases": phases}
    print(json.dumps(result["summary"], indent=1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    (RESULTS / f"ann_check_cost{tag}.json").write_text(json.dumps(result, indent=1))
    plot(summary, RESULTS / f"ann_check_cost{tag}.png",
         f"{args.entries} x {vectors.shape[1]} {args.index}, checks at rate {args.rate}, "
         f"{args.concurrency} concurrent clients, batch {args.batch_size} / {args.batch_wait_ms:g} ms")
    worker.close()
    encoder.close()


if __name__ == "__main__":
    main()
