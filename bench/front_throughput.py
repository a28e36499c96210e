"""Lookups per second and latency of one cache replica under concurrent clients, two builds side by side.

    python -m bench.front_throughput [--before REF] [--gptcache] [--entries 10000] [--backend onnx-int8]
                                     [--concurrency 1 32 256] [--seconds 8] [--rounds 3] [--rate R] [--tag NAME]

Each build (the working tree as ``after``; with ``--before REF`` also that git commit, exported with
``git archive`` into a temporary directory, as ``before``) runs as its own process, the way
``python -m cache_core.service`` runs it: uvicorn, logging configured from the settings (INFO, one
access line per request, to a file), open access, a null publisher, ``--entries`` banking77-shaped
entries (``bench.lookup_latency``'s corpus) in one HNSW partition. A separate driver process (this one)
keeps N keep-alive connections busy with ``POST /v1/lookup`` (raw HTTP/1.1 on asyncio, so the driver
itself costs little) for ``--seconds`` per level: closed loop by default (each connection sends its next
lookup when the last is answered), or with ``--rate R`` open loop (lookup i due at i / R s over the
shared connections, its latency counted from then: p99 at an offered load, not at saturation). Every query is a banking77 test question with a
suffix of digits naming the round, the level, the build and the request (``driven_query``), so no request
is answered from the embedding cache, and every build's queries are the same number of word pieces.
Before the fifth round the suffix named the round, the build and the request but not the level, so a
level re-sent the texts of the level before it in the same round, and those (all but the first
requests' worth of the level before) were answered from the embedding cache without an encode (quiet-4:
43 % of c32's lookups, 69 % of c256's); and it named the build as a word (``0before`` is a word piece
longer than ``0after``).

``--gptcache`` adds GPTCache's own server (``gptcache_server``, ``POST /get``; its venv from
bench/setup_gptcache.sh, bench/gptcache_server_side.py) with the same MiniLM weights (its SBERT
encoder: torch) and the same entries' questions and answers, driven alike in the same rounds.

The builds take turns within each round (order flipped every round), so both see the same machine
load; the after/before ratios are computed per round and their median printed (a 2-core machine
shared with other work: compare the ratios, not the absolute figures across runs). A bare encode of
one query (the model alone, in this process) is timed between levels for the "p50 at concurrency 1
vs one encode" figure, twice: ``bare_encode_ms`` on the plain questions (as in every run before the
fifth round) and ``bare_encode_driven_ms`` on questions with the same suffix as the driven ones (~24
word pieces vs ~14.6: that encode costs ~2.6-2.7 ms, not ~2.0, on the quiet machine). Each level reports
the service's CPU per lookup, all threads and the event loop's (main) thread alone (the rest is the encoder's), and under ``stalls`` where a request's time can
stop inside the service: the event loop's worst lag, garbage-collector pauses, the slowest encode call
(``StallRecorder``); and ``switches_per_lookup``: the event loop thread's voluntary and involuntary
context switches and the other threads' voluntary ones (their wake-ups; the stall probe's ~100 a second among them), per lookup.

Writes bench/results/front_throughput[-TAG].json and a PNG of the same name (lookups/s and p99 per
round and level, each build a colour; ``--plot-only JSON`` redraws one from a saved result).

Over 500 lines because it is three tools that must agree on one measurement: the load driver
(closed loop and offered rate), the builds it drives side by side (paired commits, GPTCache's
server), and the in-service probes.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


class StallRecorder:
    """Where a request's time can stop in the service, every 250 ms into ``path`` (JSON lines with
    ``time.monotonic()``, the driver's clock too): the event loop's lag (a probe thread schedules a
    callback on the loop every 10 ms and times how late it runs), garbage-collector pauses
    (``gc.callbacks``; the loop thread stops for them) and the model's encode calls (``TimedModel``)."""

    def __init__(self, path: Path | None):
        self.path = path
        # reentrant: a collection can start in a thread that holds it (the probe, while it allocates), and
        # the gc callback then takes it again in that thread (a plain Lock hung a service process that way)
        self._lock = threading.RLock()
        self._reset()
        self._gc_started = 0.0
        if path is not None:
            gc.callbacks.append(self._gc)

    def _reset(self) -> None:
        self.window = {"lag_max_ms": 0.0, "gc_ms": 0.0, "gc_max_ms": 0.0, "gc_full": 0,
                       "encodes": 0, "encode_max_ms": 0.0}

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        ms = (time.perf_counter() - self._gc_started) * 1000
        with self._lock:
            self.window["gc_ms"] += ms
            self.window["gc_max_ms"] = max(self.window["gc_max_ms"], ms)
            self.window["gc_full"] += info["generation"] == 2

    def encoded(self, ms: float) -> None:
        with self._lock:
            self.window["encodes"] += 1
            self.window["encode_max_ms"] = max(self.window["encode_max_ms"], ms)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.path is not None:
            threading.Thread(target=self._probe, args=(loop,), name="stall-probe", daemon=True).start()

    def _probe(self, loop: asyncio.AbstractEventLoop) -> None:
        ran = threading.Event()
        flushed = time.monotonic()
        with open(self.path, "a") as out:
            while not loop.is_closed():
                ran.clear()
                asked = time.perf_counter()
                try:
                    loop.call_soon_threadsafe(ran.set)
                except RuntimeError:  # the loop closed meanwhile
                    return
                ran.wait(5)
                lag = (time.perf_counter() - asked) * 1000
                with self._lock:
                    self.window["lag_max_ms"] = max(self.window["lag_max_ms"], lag)
                    if time.monotonic() - flushed >= 0.25:
                        flushed = time.monotonic()
                        out.write(json.dumps({"t": flushed, **{k: round(v, 2) for k, v in self.window.items()}}) + "\n")
                        out.flush()
                        self._reset()
                time.sleep(0.01)


class TimedModel:
    """The bare model with each ``encode_with_norms`` call timed into a ``StallRecorder``."""

    def __init__(self, inner, stalls: StallRecorder):
        self._inner, self._stalls = inner, stalls

    def encode_with_norms(self, texts, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self._inner.encode_with_norms(texts, *args, **kwargs)
        finally:
            self._stalls.encoded((time.perf_counter() - started) * 1000)

    def encode(self, texts):
        return self.encode_with_norms(texts)[0]

    def __getattr__(self, name):
        return getattr(self._inner, name)


def stall_summary(path: Path, since: float, until: float) -> dict:
    """The worst of the recorder's windows that ended between ``since`` and ``until``."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return {}
    rows = [r for r in rows if since < r["t"] <= until + 0.25]
    if not rows:
        return {}
    return {"loop_lag_max_ms": max(r["lag_max_ms"] for r in rows), "gc_pause_max_ms": max(r["gc_max_ms"] for r in rows),
            "gc_ms_per_s": round(sum(r["gc_ms"] for r in rows) / max(until - since, 1e-9), 1),
            "gc_full": sum(r["gc_full"] for r in rows), "encode_call_max_ms": max(r["encode_max_ms"] for r in rows),
            "encode_calls": sum(r["encodes"] for r in rows)}


def serve(port: int, entries: int, backend: str, profile: Path | None, stalls_to: Path | None = None) -> None:
    """The service under test (run in a child process, ``PYTHONPATH`` at the build's source)."""
    import uvicorn

    from bench.lookup_latency import NullPublisher, corpus_vectors, fill, registry_for
    from cache_core.embedding.load import load_embedder
    from cache_core.logs import configure_logging
    from cache_core.service.app import create_app
    from cache_core.service.wiring import build_components
    from cache_core.settings import CacheSettings, Settings
    from cache_core.store.faiss import set_search_threads

    settings = Settings(service={"open_access": True})
    # as python -m cache_core.service sets it up (a build from before background logging takes no argument)
    if "background" in inspect.signature(configure_logging).parameters:
        configure_logging(settings.log_level, settings.log_format, background=True)
    else:
        configure_logging(settings.log_level, settings.log_format)
    embedder = load_embedder(CacheSettings(encoder_backend=backend))
    texts, answers, vectors = corpus_vectors(embedder, entries)
    stalls = StallRecorder(stalls_to)
    # the bare model: each build wraps it in its own encoder front (batching, workers) from its settings
    components = build_components(settings, NullPublisher(), TimedModel(embedder, stalls),
                                  registry=registry_for("hnsw", entries, 0.1))
    # as python -m cache_core.service builds it (a build from before the heap freeze takes no argument)
    app = create_app(components, freeze=True) if "freeze" in inspect.signature(create_app).parameters \
        else create_app(components)
    set_search_threads(2)
    fill(app.state.components.cache, texts, answers, vectors)
    set_search_threads(1)
    profiler = None
    if profile is not None:
        from pyinstrument import Profiler
        profiler = Profiler(interval=0.0005, async_mode="disabled")
        profiler.start()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, log_config=None))

    async def run() -> None:
        stalls.start(asyncio.get_running_loop())
        await server.serve()

    try:
        # uvicorn.run's loop (uvloop when installed) and parser (httptools when installed), plus the stall
        # recorder on the loop
        with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
            runner.run(run())
    finally:
        if profiler is not None:
            profiler.stop()
            profile.write_text(flat_profile(profiler.last_session.root_frame()) + "\n\n"
                               + profiler.output_text(unicode=True, color=False, show_all=False))


def flat_profile(root, top: int = 40) -> str:
    """Self time by function over the whole tree (seconds, the event-loop thread), largest first."""
    totals: dict[str, float] = {}
    stack = [(root, None)]
    while stack:
        frame, parent = stack.pop()
        if frame.identifier.startswith("[self]") and parent is not None:
            name = parent
        else:
            name = f"{frame.function} {frame.file_path_short}:{frame.line_no}"
        children = list(frame.children)
        totals[name] = totals.get(name, 0.0) + frame.time - sum(c.time for c in children)
        stack.extend((child, name) for child in children)
    rows = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return "\n".join(f"{seconds:8.3f}  {name}" for name, seconds in rows)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Build:
    """One build's service process (``command`` None: a scache build from ``source``)."""

    def __init__(self, name: str, source: Path, args, log_dir: Path, command: list[str] | None = None):
        self.name, self.port = name, free_port()
        self.stalls: Path | None = None
        self.path, self.field = ("/get", "prompt") if command else ("/v1/lookup", "query")
        extra = os.environ.get(f"FRONT_{name.upper()}_PYTHONPATH")  # e.g. a scratch dir of candidate packages
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(source), extra])),
               "SCACHE_SERVICE__OPEN_ACCESS": "true"}
        if command is None:
            command = [sys.executable, str(Path(__file__).resolve()), "--serve", str(self.port),
                       "--entries", str(args.entries), "--backend", args.backend]
            if args.profile:
                command += ["--profile-to", str(RESULTS / f"front_throughput-profile-{name}.txt")]
            if name not in args.no_stalls_for:  # the recorder's probe wakes the loop 100 times a second
                self.stalls = log_dir / f"{name}-stalls.jsonl"
                command += ["--stalls-to", str(self.stalls)]
        else:
            command = [*command[:2], str(self.port), *command[2:]]
            env.pop("PYTHONPATH")
        self.log = open(log_dir / f"{name}.log", "w")
        self.process = subprocess.Popen(command, env=env, cwd=source, stdout=self.log, stderr=subprocess.STDOUT)

    async def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.process.returncode}; see {self.log.name}")
            try:
                path = b"/healthz" if self.path == "/v1/lookup" else b"/"
                status, _ = await one_shot(self.port, b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path)
                if status == 200:
                    return
            except OSError:
                pass
            await asyncio.sleep(1)
        raise TimeoutError(f"{self.name} not ready in {timeout_s} s")

    def cpu_s(self) -> tuple[float, float]:
        """User + system CPU seconds the service process has used so far: all its threads, and its
        main thread alone (the event loop's: HTTP, routing, validation, search, logging; the others
        are the encoder's and the background workers')."""
        def seconds(stat: Path) -> float:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        pid = self.process.pid
        return seconds(Path(f"/proc/{pid}/stat")), seconds(Path(f"/proc/{pid}/task/{pid}/stat"))

    def switches(self) -> dict[str, int]:
        """Context switches so far: the main (event loop) thread's voluntary ones (it slept: on epoll or
        for the GIL) and involuntary ones (the scheduler took its core), and the other threads' voluntary
        ones together (each wake-up of the encoder, event, log and ANN-check threads is at least one)."""
        out = {"loop_voluntary": 0, "loop_involuntary": 0, "others_voluntary": 0}
        pid = self.process.pid
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                status = (task / "status").read_text()
            except OSError:  # the thread ended meanwhile
                continue
            counts = dict(line.split(":\t") for line in status.splitlines() if line.endswith(tuple("0123456789"))
                          and "ctxt_switches" in line)
            if task.name == str(pid):
                out["loop_voluntary"] += int(counts["voluntary_ctxt_switches"])
                out["loop_involuntary"] += int(counts["nonvoluntary_ctxt_switches"])
            else:
                out["others_voluntary"] += int(counts["voluntary_ctxt_switches"])
        return out

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)  # uvicorn re-raises it: KeyboardInterrupt, so the profile is written
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = next(int(line.split(b":", 1)[1]) for line in lines[1:] if line.lower().startswith(b"content-length:"))
    return status, await reader.readexactly(length)


async def one_shot(port: int, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await read_response(reader)
    finally:
        writer.close()


def driven_query(queries: list[str], i: int, tag: str) -> str:
    """The ``i``-th query a level sends: a banking77 question and ``(tag-i)``, ``tag`` digits only
    (round and build), so no two requests share a text and every build's texts are equally long."""
    return f"{queries[i % len(queries)]} ({tag}-{i})"


def lookup_request(build: Build, query: str, unit: str) -> bytes:
    body = json.dumps({build.field: query, "unit_id": unit}).encode()
    return (b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (build.path.encode(), len(body), body))


async def drive(build: Build, queries: list[str], tag: str, concurrency: int, seconds: float,
                rate: float | None = None) -> dict:
    """``concurrency`` connections, each sending its next lookup as soon as the last is answered
    (closed loop: the service's pace sets the rate, and latency is concurrency / throughput).
    With ``rate``: lookup i is due at i / rate seconds (open loop, the connections shared), and its
    latency counts from when it was due, so a lookup that waited for a free connection because the
    service fell behind is charged for the wait (no coordinated omission)."""
    latencies: list[float] = []
    errors = {"status": 0, "connection": 0}
    counter = iter(range(10**9))
    begun = time.perf_counter()
    stop_at = begun + seconds

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", build.port)
        try:
            while time.perf_counter() < stop_at:
                i = next(counter)
                request = lookup_request(build, driven_query(queries, i, tag), f"u{i}")
                if rate is None:
                    started = time.perf_counter()
                else:
                    started = begun + i / rate  # when it was due
                    if started >= stop_at:
                        break
                    await asyncio.sleep(max(0.0, started - time.perf_counter()))
                writer.write(request)
                status, _ = await read_response(reader)
                latencies.append((time.perf_counter() - started) * 1000)
                if status != 200:
                    errors["status"] += 1
        except (OSError, asyncio.IncompleteReadError):
            errors["connection"] += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(concurrency)])
    wall = time.perf_counter() - started
    return {"requests": len(latencies), "lookups_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(float(np.percentile(latencies, 50)), 2) if latencies else None,
            "p99_ms": round(float(np.percentile(latencies, 99)), 2) if latencies else None,
            "max_ms": round(max(latencies), 1) if latencies else None, "errors": errors}


def export(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    target = into / "before"
    target.mkdir()
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def gptcache_command(embedder, args, tmp: Path) -> list[str]:
    """GPTCache's server, with the questions and answers of the entries the scache builds hold."""
    from bench.lookup_latency import corpus_vectors
    from cache_core.embedding.embedder import resolve_model_path
    from cache_core.settings import CacheSettings

    texts, answers, vectors = corpus_vectors(embedder, args.entries)
    store = tmp / "gptcache-store.json"
    store.write_text(json.dumps([[t, str(a)] for t, a in zip(texts, answers)]))
    np.save(tmp / "gptcache-vectors.npy", vectors)
    python = subprocess.run(["bash", str(ROOT / "bench" / "setup_gptcache.sh")], check=True,
                            capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return [python, str(ROOT / "bench" / "gptcache_server_side.py"), str(store),
            resolve_model_path(CacheSettings().model), str(tmp / "gptcache-vectors.npy")]


def bare_encode_ms(embedder, queries: list[str]) -> float:
    out = []
    for q in queries:
        started = time.perf_counter()
        embedder.encode([q])
        out.append((time.perf_counter() - started) * 1000)
    return statistics.median(out)


def ratios(rounds: list[dict], level: str, metric: str, base: str = "before") -> float | None:
    values = [r["after"][level][metric] / r[base][level][metric] for r in rounds
              if r[base][level].get(metric) and r["after"][level].get(metric)]
    return round(statistics.median(values), 2) if values else None


async def run(args) -> dict:
    import pandas as pd

    from cache_core.embedding.load import load_embedder
    from cache_core.settings import CacheSettings
    from infra.runtime import BANKING77_DIR

    queries = list(pd.read_csv(BANKING77_DIR / "test.csv").text)
    embedder = load_embedder(CacheSettings(encoder_backend=args.backend))
    with tempfile.TemporaryDirectory(prefix="scache-front-") as tmp:
        sources = {"after": ROOT}
        if args.before:
            sources = {"before": export(args.before, Path(tmp)), **sources}
        builds = {name: Build(name, source, args, Path(tmp)) for name, source in sources.items()}
        if args.gptcache:
            builds["gptcache"] = Build("gptcache", ROOT, args, Path(tmp), gptcache_command(embedder, args, Path(tmp)))
        try:
            for build in builds.values():
                await build.wait_ready(1800)
            index = {name: k for k, name in enumerate(builds, 1)}  # in the queries' suffix: single digits
            for build in builds.values():  # warm-up
                await drive(build, queries, f"9-9-{index[build.name]}", 4, 2)
            rounds = []
            for r in range(args.rounds):
                order = list(builds) if r % 2 == 0 else list(reversed(builds))
                result = {name: {} for name in builds}
                for li, c in enumerate(args.concurrency):
                    result.setdefault("bare_encode_ms", {})[f"c{c}"] = round(bare_encode_ms(embedder, queries[:40]), 2)
                    driven = [driven_query(queries, i, f"{r % 10}-{li % 10}-0") for i in range(1000, 1040)]  # c1 sends ~1,500
                    result.setdefault("bare_encode_driven_ms", {})[f"c{c}"] = round(bare_encode_ms(embedder, driven), 2)
                    for name in order:
                        cpu, loop_cpu = builds[name].cpu_s()
                        switches = builds[name].switches() if builds[name].stalls is not None else None
                        since, driver_cpu = time.monotonic(), time.process_time()
                        level = await drive(builds[name], queries, f"{r % 10}-{li % 10}-{index[name]}", c, args.seconds,
                                            args.rate)
                        cpu_after, loop_after = builds[name].cpu_s()
                        if switches is not None:
                            switches = {k: v - switches[k] for k, v in builds[name].switches().items()}
                        driver_cpu = time.process_time() - driver_cpu
                        if builds[name].stalls is not None:
                            until = time.monotonic()
                            await asyncio.sleep(0.6)  # the recorder's last window of the level is written
                            level["stalls"] = stall_summary(builds[name].stalls, since, until)
                        per = 1000 / max(level["requests"], 1)
                        level["cpu_ms_per_lookup"] = round((cpu_after - cpu) * per, 2)
                        level["loop_cpu_ms_per_lookup"] = round((loop_after - loop_cpu) * per, 2)
                        level["driver_cpu_ms_per_lookup"] = round(driver_cpu * per, 2)  # this process, all threads
                        if switches is not None:  # per lookup
                            level["switches_per_lookup"] = {k: round(v * per / 1000, 2) for k, v in switches.items()}
                        result[name][f"c{c}"] = level
                        print(json.dumps({"round": r, "build": name, "concurrency": c, **result[name][f"c{c}"]}),
                              flush=True)
                rounds.append(result)
        finally:
            for build in builds.values():
                build.stop()
    out = {"entries": args.entries, "backend": args.backend, "seconds": args.seconds, "before": args.before,
           "rate": args.rate, "rounds": rounds}
    if any(c == 1 for c in args.concurrency):  # the "c1 p50 within 1.5x of one bare encode" goal, per round
        out["c1_p50_over_bare_encode"] = {
            name: {base: [round(r[name]["c1"]["p50_ms"] / r[base]["c1"], 2) for r in rounds if r[name]["c1"]["p50_ms"]]
                   for base in ("bare_encode_ms", "bare_encode_driven_ms")}
            for name in builds if name != "gptcache"}
    if "gptcache" in rounds[0]:
        out["after_over_gptcache_median"] = {
            f"c{c}": {m: ratios(rounds, f"c{c}", m, base="gptcache") for m in ("lookups_per_s", "p50_ms", "p99_ms")}
            for c in args.concurrency}
    if args.before:
        out["after_over_before_median"] = {
            f"c{c}": {m: ratios(rounds, f"c{c}", m) for m in ("lookups_per_s", "p50_ms", "p99_ms", "cpu_ms_per_lookup",
                                                     "loop_cpu_ms_per_lookup", "driver_cpu_ms_per_lookup")}
            for c in args.concurrency}
    return out


def plot(out: dict, path: Path, title: str) -> None:
    """Per concurrency level: lookups/s (top) and p99 (bottom) in each round, one line per build, and
    the bare encode's p50 under the c1 panel's p50 for the "within 1.5x" reading."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = out["rounds"]
    builds = [name for name in rounds[0] if not name.startswith("bare_encode")]
    levels = list(rounds[0][builds[0]])
    fig, axes = plt.subplots(2, len(levels), figsize=(4.2 * len(levels), 6.4), squeeze=False)
    xs = list(range(1, len(rounds) + 1))
    for col, level in enumerate(levels):
        top, bottom = axes[0][col], axes[1][col]
        for name in builds:
            top.plot(xs, [r[name][level]["lookups_per_s"] for r in rounds], marker="o", label=name)
            metric = "p50_ms" if level == "c1" else "p99_ms"
            bottom.plot(xs, [r[name][level][metric] for r in rounds], marker="o", label=f"{name} {metric[:3]}")
        if level == "c1":
            bottom.plot(xs, [1.5 * r["bare_encode_ms"][level] for r in rounds], "k--", label="1.5 x bare encode")
            if "bare_encode_driven_ms" in rounds[0]:
                bottom.plot(xs, [1.5 * r["bare_encode_driven_ms"][level] for r in rounds], "k:",
                            label="1.5 x bare encode, driven text")
        elif level == "c32":
            top.axhline(300, color="grey", linestyle=":", label="goal 300/s")
            bottom.axhline(100, color="grey", linestyle=":", label="goal p99 100 ms")
        top.set_title(f"{level}: lookups/s")
        bottom.set_title(f"{level}: {'p50' if level == 'c1' else 'p99'} ms")
        for ax in (top, bottom):
            ax.set_xlabel("round")
            ax.set_xticks(xs)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        top.set_ylim(bottom=0)
        bottom.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=None, help="a git commit to compare with the working tree")
    parser.add_argument("--gptcache", action="store_true", help="GPTCache's server side by side")
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--backend", default="onnx-int8", choices=["torch", "onnx", "onnx-int8"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=None,
                        help="offered lookups/s per level (open loop over the level's connections; latency from "
                             "when each lookup was due); default: closed loop, as fast as answers come back")
    parser.add_argument("--profile", action="store_true",
                        help="profile each service's event-loop thread (pyinstrument) into bench/results")
    parser.add_argument("--tag", default="")
    parser.add_argument("--no-stalls-for", nargs="*", default=[], choices=["before", "after"],
                        help="builds run without the stall recorder (its probe thread and gc callback): with "
                             "--before HEAD, what the instrumentation itself costs")
    parser.add_argument("--plot-only", type=Path, default=None, help="redraw the PNG of a saved result JSON")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stalls-to", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rate is not None and args.rate <= 0:
        parser.error(f"--rate must be a positive number of lookups per second, got {args.rate:g}")
    if args.serve is not None:
        serve(args.serve, args.entries, args.backend, args.profile_to, args.stalls_to)
        return
    if args.plot_only is not None:
        out = json.loads(args.plot_only.read_text())
        plot(out, args.plot_only.with_suffix(".png"), f"{args.plot_only.stem}: {out['entries']} entries, "
             f"{out['backend']}, {out['seconds']} s per level, before = {out['before']}")
        return
    out = asyncio.run(run(args))
    print(json.dumps({k: v for k, v in out.items() if k.endswith("_median") or k.startswith("c1_")}
                     or out["rounds"][-1], indent=1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    (RESULTS / f"front_throughput{tag}.json").write_text(json.dumps(out, indent=1))
    plot(out, RESULTS / f"front_throughput{tag}.png", f"front_throughput{tag}: {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
