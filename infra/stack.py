"""Start the whole embedded stack on one machine, in dependency order.

Kafka broker -> warehouse (chdb over ClickHouse HTTP) + migrations -> topics ->
Flink attribution job -> cache service -> dashboard (-> auto-tune on its schedule). Every
service binds to loopback on a free port; children get their endpoints through SCACHE_*
variables, exactly as they would in production.

    python -m infra.stack demo [--rate 10] [--window-s 10] [--state-dir DIR]
    python -m infra.stack serve [--port 8000] [--dashboard-port 8501] [--state-dir DIR]

``demo`` starts from empty services and replays banking77 traffic. ``serve`` starts the same
stack for your own application, with no traffic of its own, keeping its state across restarts;
a service whose address is set in the environment (SCACHE_KAFKA__BOOTSTRAP_SERVERS,
SCACHE_CLICKHOUSE__URL, SCACHE_SERVICE__UPSTREAM_URL) is used as it is, not started (its topics
and tables are created if missing).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cache_core.logs import configure_logging
from cache_core.settings import Settings, settings_or_exit
from cache_core.runtime import port_open, scache_home
from infra.runtime import REPO_ROOT, Service, free_port, spawn, wait_until

log = logging.getLogger("scache.stack")


def configured(name: str) -> bool:
    """Whether the environment sets ``name`` (empty counts as unset, as in Settings)."""
    return bool(os.environ.get(name, "").strip())


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status == 200


@dataclass
class Stack:
    """The running services and the environment that points children at them."""

    state_dir: Path
    window_s: int = 10
    services: list[Service] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def settings(self) -> Settings:
        """Settings as the children see them (for in-process clients)."""
        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            return Settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    # -- services ---------------------------------------------------------------------
    def start_kafka(self, external: bool = False) -> Service | None:
        """The embedded broker; ``external``: the cluster SCACHE_KAFKA__BOOTSTRAP_SERVERS names (topics only)."""
        from infra.kafka.topics import ensure_topics

        broker = None
        if not external:
            from infra.kafka.broker import start_broker

            broker = start_broker(self.state_dir / "kafka")
            self.services.append(broker)
            self.env["SCACHE_KAFKA__BOOTSTRAP_SERVERS"] = broker.info["bootstrap"]
        ensure_topics(self.settings().kafka)
        return broker

    def start_warehouse(self, external: bool = False) -> Service | None:
        """The embedded warehouse; ``external``: the server SCACHE_CLICKHOUSE__URL names (migrations only)."""
        from cache_core.chclient import connect
        from infra.clickhouse.migrate import apply_migrations

        warehouse = None
        if not external:
            from infra.clickhouse.warehouse import start_warehouse

            warehouse = start_warehouse(self.state_dir / "warehouse")
            self.services.append(warehouse)
            self.env["SCACHE_CLICKHOUSE__URL"] = warehouse.info["url"]
        settings = self.settings()
        apply_migrations(connect(settings.clickhouse, database="default"), settings.clickhouse.database)
        return warehouse

    def start_flink_job(self) -> Service:
        from infra.flink.resolve import connector_jar
        from jobs.attribution_job import RUNNING_MARKER

        self.env.update({
            "SCACHE_FLINK__CONNECTOR_JAR": str(connector_jar()),
            "SCACHE_FLINK__WINDOW_S": str(self.window_s),
            "SCACHE_FLINK__WATERMARK_DELAY_S": "2",
            "SCACHE_FLINK__IDLE_TIMEOUT_S": "30",  # heartbeats keep partitions advancing
            "SCACHE_FLINK__ALLOWED_LATENESS_S": "2",
            "SCACHE_FLINK__CHECKPOINT_DIR": str(self.state_dir / "checkpoints"),
            # PyFlink writes Flink's own log into its package dir unless told otherwise.
            "FLINK_LOG_DIR": str(self.state_dir / "logs" / "flink"),
        })
        log_path = self.state_dir / "logs" / "flink-job.log"
        job = spawn("flink-job", [sys.executable, str(REPO_ROOT / "jobs" / "attribution_job.py")],
                    log_path, env=self.env)
        self.services.append(job)
        wait_until(lambda: RUNNING_MARKER in log_path.read_text(errors="replace"),
                   timeout_s=240, what="flink job", proc=job.proc, log_path=log_path)
        return job

    def start_demo_model(self) -> Service:
        """The demo's stand-in for the model behind the cache (``infra.demo_model``): the
        chat completions the cache misses are forwarded there."""
        port = free_port()
        service = self._start_http("demo-model", [sys.executable, "-m", "infra.demo_model", "--port", str(port)],
                                   port, health_path="/healthz", timeout_s=60)
        self.env["SCACHE_SERVICE__UPSTREAM_URL"] = service.info["url"] + "/v1/chat/completions"
        return service

    def start_cache(self, port: int | None = None) -> Service:
        port = port or free_port()
        self.env.update({
            "SCACHE_SERVICE__PORT": str(port),
            "SCACHE_CACHE__SNAPSHOT_DIR": str(self.state_dir / "snapshots"),
            # Local, on loopback: no client keys (the service warns at start); set it false to try keys.
            "SCACHE_SERVICE__OPEN_ACCESS": os.environ.get("SCACHE_SERVICE__OPEN_ACCESS", "true"),
        })
        # Ready, not just alive: traffic waits until the control and entries topics are replayed.
        return self._start_http("cache-service", [sys.executable, "-m", "cache_core.service"],
                                port, health_path="/readyz", timeout_s=180)

    def start_dashboard(self, port: int | None = None) -> Service:
        port = port or free_port()
        cmd = [sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / "dashboard" / "Home.py"),
               "--server.address", "127.0.0.1", "--server.port", str(port),
               "--server.headless", "true", "--browser.gatherUsageStats", "false"]
        return self._start_http("dashboard", cmd, port, health_path="/_stcore/health", timeout_s=120)

    def start_autotune(self, every_s: float) -> Service:
        """``dashboard.control.autotune --every`` against this stack (it logs each pass's actions)."""
        service = spawn("autotune", [sys.executable, "-m", "dashboard.control.autotune", "--every", f"{every_s:g}"],
                        self.state_dir / "logs" / "autotune.log", env=self.env)
        self.services.append(service)
        return service

    def _start_http(self, name: str, cmd: list[str], port: int, health_path: str,
                    timeout_s: float) -> Service:
        """Spawn an HTTP service on ``port`` and wait until its health path answers 200."""
        log_path = self.state_dir / "logs" / f"{name}.log"
        service = spawn(name, cmd, log_path, env=self.env)
        service.info["url"] = f"http://127.0.0.1:{port}"
        self.services.append(service)
        wait_until(lambda: _http_ok(service.info["url"] + health_path), timeout_s=timeout_s,
                   what=name, proc=service.proc, log_path=log_path)
        return service

    def service(self, name: str) -> Service:
        """The running service called ``name`` (kafka, warehouse, flink-job, cache-service, dashboard)."""
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(f"no running service named {name!r}")

    def start_all(self, use_configured: bool = False, cache_port: int | None = None,
                  dashboard_port: int | None = None) -> None:
        """Every service in order. ``use_configured``: Kafka and ClickHouse whose address is set in the
        environment are used, not started (the demo always starts its own, to begin empty)."""
        self.start_kafka(external=use_configured and configured("SCACHE_KAFKA__BOOTSTRAP_SERVERS"))
        self.start_warehouse(external=use_configured and configured("SCACHE_CLICKHOUSE__URL"))
        self.start_flink_job()
        if not configured("SCACHE_SERVICE__UPSTREAM_URL"):  # a real model given: no stand-in
            self.start_demo_model()
        self.start_cache(cache_port)
        self.start_dashboard(dashboard_port)
        every_s = self.settings().dashboard.autotune_every_s
        if every_s is not None:
            self.start_autotune(every_s)

    def failed(self) -> Service | None:
        """A service that exited on its own, if any."""
        return next((service for service in self.services if not service.alive()), None)

    def stop(self) -> None:
        for service in reversed(self.services):
            try:
                service.stop()
            except Exception:
                log.exception("could not stop %s", service.name)
        self.services.clear()


def _stop_on_signals() -> None:
    """SIGTERM, and SIGINT even when a shell started us in the background with SIGINT ignored
    (Ctrl-C / kill -INT must still stop everything), raise KeyboardInterrupt in the main thread."""
    def _stop(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


def _keep_stopping_on_signals() -> None:
    """While the stack stops, another Ctrl-C or SIGTERM is answered, not raised: raising there would end
    the stop half way, leaving the services not yet stopped running (and print a traceback)."""
    def _noted(signum, _frame):
        print("scache: still stopping the services (each gets 20 s, then SIGKILL)", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, _noted)
    signal.signal(signal.SIGINT, _noted)


def _run(stack: Stack, start: Callable[[], None], banner: Callable[[], str], body: Callable[[], None]) -> int:
    """Start the stack, print the banner, run ``body`` until Ctrl-C (or a service dies: exit 1),
    then stop every service that was started."""
    _stop_on_signals()
    started = time.monotonic()
    try:
        log.info("starting the embedded stack", extra={"state_dir": str(stack.state_dir)})
        start()
        log.info("stack up in %.0fs", time.monotonic() - started)
        print(banner(), flush=True)
        body()
    except KeyboardInterrupt:
        log.info("stopping")
    except (RuntimeError, TimeoutError) as exc:  # a service that would not start, with its log tail
        log.error("%s", exc)
        return 1
    finally:
        _keep_stopping_on_signals()
        stack.stop()
    return 0


DEMO_SHADOW = {
    "SCACHE_SHADOW__HIT_RATE": "0.25",
    "SCACHE_SHADOW__NEAR_MISS_BAND": "0.10",
    "SCACHE_SHADOW__NEAR_MISS_RATE": "0.5",
    "SCACHE_SHADOW__CALLS_PER_MINUTE": "60",
    "SCACHE_SHADOW__EQUIVALENCE": "exact",
}
"""The demo runs shadow checks (each variable may be set to override): a quarter of the hits and half
the near-misses within 0.10 below the threshold are asked again of the stand-in model, at most 60 calls
a minute per arm; exact match, since the stand-in gives one answer per intent (``infra.demo_model``)."""


def _demo(args: argparse.Namespace) -> int:
    from infra.traffic import replay_forever

    state_dir = Path(args.state_dir) if args.state_dir else scache_home() / "demo"
    # Each demo starts from empty services, so its dashboard shows this run only.
    shutil.rmtree(state_dir, ignore_errors=True)
    stack = Stack(state_dir=state_dir, window_s=args.window_s)
    # The demo replays public banking77 questions: with their text in the events the
    # dashboard can say what each intent cluster is about. Off by default elsewhere.
    stack.env["SCACHE_CACHE__EMIT_QUERY_TEXT"] = os.environ.get("SCACHE_CACHE__EMIT_QUERY_TEXT", "true")
    stack.env.update({name: os.environ.get(name, value) for name, value in DEMO_SHADOW.items()})
    demo_experiments(stack)

    def banner() -> str:
        cache_url = stack.service("cache-service").info["url"]
        write_stack_file(stack)
        return (f"\n  scache demo is running.\n  Dashboard:     {stack.service('dashboard').info['url']}\n"
                f"  Cache API:     {cache_url}/docs\n  ClickHouse:    {stack.env['SCACHE_CLICKHOUSE__URL']}\n"
                f"  Kafka:         {stack.env['SCACHE_KAFKA__BOOTSTRAP_SERVERS']}\n"
                f"  Model:         {os.environ.get('SCACHE_SERVICE__UPSTREAM_URL') or _stand_in(stack)}\n"
                f"  Logs:          {state_dir / 'logs'}\n  Ctrl-C stops everything.\n\n"
                f"  Ask through the cache (OpenAI-compatible; ask twice, or a paraphrase, to see a hit):\n"
                f"    curl -si {cache_url}/v1/chat/completions -H 'content-type: application/json' \\\n"
                f"      -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"How do I reset my card PIN?\"}}],"
                f"\"user\":\"me\"}}'\n")

    def traffic() -> None:
        replay_forever(stack.service("cache-service").info["url"], rate_per_s=args.rate,
                       experiments_file=stack.settings().experiments_file)

    return _run(stack, stack.start_all, banner, traffic)


SERVE_EXPERIMENTS = Path(__file__).resolve().parent / "serve-experiments.yaml"
"""What ``serve`` (and the cache started any other way) starts with unless SCACHE_EXPERIMENTS_FILE names a
file: arms meant for real traffic (the settings' default)."""
DEMO_EXPERIMENTS = Path(__file__).resolve().parent / "experiments.yaml"
"""What the demo starts with unless SCACHE_EXPERIMENTS_FILE names a file: arms that show off the attribution
views, one at cosine 0.80."""


def _experiments(stack: Stack, ours: Path) -> Path:
    """The experiments file the stack gives its services: the user's (SCACHE_EXPERIMENTS_FILE), else ``ours``."""
    if not configured("SCACHE_EXPERIMENTS_FILE"):
        stack.env["SCACHE_EXPERIMENTS_FILE"] = str(ours)
    return stack.settings().experiments_file


def demo_experiments(stack: Stack) -> Path:
    """The demo's: the showcase unless the user names a file (not the settings' default, which is serve's)."""
    return _experiments(stack, DEMO_EXPERIMENTS)


def serve_experiments(stack: Stack) -> Path:
    """``serve``'s: arms meant for real traffic unless the user names a file."""
    return _experiments(stack, SERVE_EXPERIMENTS)


def _serve(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir) if args.state_dir else scache_home() / "serve"
    stack = Stack(state_dir=state_dir, window_s=args.window_s)  # kept: the cache and its history survive a restart
    experiments = serve_experiments(stack)
    cache_port = args.port or _preferred_port(os.environ.get("SCACHE_SERVICE__PORT") or 8000)
    dashboard_port = args.dashboard_port or _preferred_port(8501)

    def start() -> None:
        stack.start_all(use_configured=True, cache_port=cache_port, dashboard_port=dashboard_port)

    def banner() -> str:
        cache_url = stack.service("cache-service").info["url"]
        write_stack_file(stack)
        every_s = stack.settings().dashboard.autotune_every_s
        model = os.environ.get("SCACHE_SERVICE__UPSTREAM_URL") or (
            _stand_in(stack) + "\n                   set SCACHE_SERVICE__UPSTREAM_URL to your model's chat completions URL")
        autotune = f"every {every_s:g} s" if every_s else "off (SCACHE_DASHBOARD__AUTOTUNE_EVERY_S=N turns it on)"
        return (f"\n  scache is serving.\n"
                f"  OpenAI base URL: {cache_url}/v1   (OpenAI(base_url=\"{cache_url}/v1\", api_key=\"-\"))\n"
                f"  Dashboard:       {stack.service('dashboard').info['url']}\n"
                f"  Cache API:       {cache_url}/docs\n"
                f"  Model:           {model}\n"
                f"  Kafka:           {_origin(stack, 'kafka', 'SCACHE_KAFKA__BOOTSTRAP_SERVERS')}\n"
                f"  ClickHouse:      {_origin(stack, 'warehouse', 'SCACHE_CLICKHOUSE__URL')}\n"
                f"  Experiments:     {experiments}"
                f"{'' if configured('SCACHE_EXPERIMENTS_FILE') else '   (SCACHE_EXPERIMENTS_FILE=FILE for yours)'}\n"
                f"  Auto-tune:       {autotune}\n"
                f"  State and logs:  {state_dir} (kept across restarts)\n"
                f"  Replay a log:    ./scache replay FILE [--rate N]\n  Ctrl-C stops everything.\n")

    def watch() -> None:
        while (dead := stack.failed()) is None:
            time.sleep(1)
        raise RuntimeError(f"{dead.name} exited with {dead.proc.returncode}; see {dead.log_path}")

    return _run(stack, start, banner, watch)


def _origin(stack: Stack, service: str, variable: str) -> str:
    value = stack.env.get(variable) or os.environ.get(variable, "")
    started = any(s.name == service for s in stack.services)
    return f"{value} ({'started here' if started else 'yours, from ' + variable})"


def _preferred_port(port) -> int:
    """``port`` when nothing listens there, else a free one."""
    port = int(port)
    return free_port() if port_open("127.0.0.1", port) else port


STACK_FILE = "stack.json"


def write_stack_file(stack: Stack) -> None:
    """Where the running stack's cache is, for ``infra.replay`` (removed by nothing: the pid tells a stale one)."""
    info = {"pid": os.getpid(), "cache_url": stack.service("cache-service").info["url"],
            "dashboard_url": stack.service("dashboard").info["url"]}
    (stack.state_dir / STACK_FILE).write_text(json.dumps(info))


def _stand_in(stack: Stack) -> str:
    return stack.service("demo-model").info["url"] + "/v1/chat/completions (a stand-in: infra/demo_model.py)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start everything and replay banking77 traffic live")
    demo.add_argument("--rate", type=float, default=10.0, help="requests per second (default 10)")
    serve = sub.add_parser("serve", help="start everything for your own application (no traffic of its own)")
    serve.add_argument("--port", type=int, help="cache API port (default: SCACHE_SERVICE__PORT, else 8000 if free)")
    serve.add_argument("--dashboard-port", type=int, help="dashboard port (default 8501 if free)")
    for command in (demo, serve):
        command.add_argument("--window-s", type=int, default=10,
                             help="attribution window in seconds (default 10)")
        command.add_argument("--state-dir", help=f"where service data and logs go (default $SCACHE_HOME/{command.prog.split()[-1]})")
    args = parser.parse_args(argv)
    if args.command == "demo" and not 0 < args.rate < float("inf"):  # also refuses nan
        parser.error("--rate must be a positive number")
    if args.window_s < 1:
        parser.error("--window-s must be at least 1")
    for flag in ("port", "dashboard_port"):
        value = getattr(args, flag, None)
        if value is not None and not 1 <= value <= 65535:
            parser.error(f"--{flag.replace('_', '-')} must be in 1-65535, got {value}")
    configure_logging()
    settings_or_exit("stack")
    return _demo(args) if args.command == "demo" else _serve(args)


if __name__ == "__main__":
    sys.exit(main())
