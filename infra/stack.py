"""Start the whole embedded stack on one machine, in dependency order.

Kafka broker -> warehouse (chdb over ClickHouse HTTP) + migrations -> topics ->
Flink attribution job -> cache service -> dashboard. Every service binds to
loopback on a free port; children get their endpoints through SCACHE_* variables,
exactly as they would in production.

    python -m infra.stack demo [--rate 10] [--window-s 10] [--state-dir DIR]
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cache_core.logs import configure_logging
from cache_core.settings import Settings
from infra.runtime import REPO_ROOT, Service, free_port, scache_home, spawn, wait_until

log = logging.getLogger("scache.stack")


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
    def start_kafka(self) -> Service:
        from infra.kafka.broker import start_broker

        broker = start_broker(self.state_dir / "kafka")
        self.services.append(broker)
        self.env["SCACHE_KAFKA__BOOTSTRAP_SERVERS"] = broker.info["bootstrap"]
        from infra.kafka.topics import ensure_topics

        ensure_topics(self.settings().kafka)
        return broker

    def start_warehouse(self) -> Service:
        from cache_core.chclient import connect
        from infra.clickhouse.migrate import apply_migrations
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

    def start_cache(self) -> Service:
        port = free_port()
        self.env.update({
            "SCACHE_SERVICE__PORT": str(port),
            "SCACHE_CACHE__SNAPSHOT_DIR": str(self.state_dir / "snapshots"),
        })
        # Ready, not just alive: traffic waits until the control and entries topics are replayed.
        return self._start_http("cache-service", [sys.executable, "-m", "cache_core.service"],
                                port, health_path="/readyz", timeout_s=180)

    def start_dashboard(self) -> Service:
        port = free_port()
        cmd = [sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / "dashboard" / "app.py"),
               "--server.address", "127.0.0.1", "--server.port", str(port),
               "--server.headless", "true", "--browser.gatherUsageStats", "false"]
        return self._start_http("dashboard", cmd, port, health_path="/_stcore/health", timeout_s=120)

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

    def start_all(self) -> None:
        self.start_kafka()
        self.start_warehouse()
        self.start_flink_job()
        if not os.environ.get("SCACHE_SERVICE__UPSTREAM_URL"):  # a real model given: no stand-in
            self.start_demo_model()
        self.start_cache()
        self.start_dashboard()

    def stop(self) -> None:
        for service in reversed(self.services):
            try:
                service.stop()
            except Exception:
                log.exception("could not stop %s", service.name)
        self.services.clear()


def _demo(args: argparse.Namespace) -> int:
    from infra.traffic import replay_forever

    state_dir = Path(args.state_dir) if args.state_dir else scache_home() / "demo"
    # Each demo starts from empty services, so its dashboard shows this run only.
    shutil.rmtree(state_dir, ignore_errors=True)
    stack = Stack(state_dir=state_dir, window_s=args.window_s)
    # The demo replays public banking77 questions: with their text in the events the
    # dashboard can say what each intent cluster is about. Off by default elsewhere.
    stack.env["SCACHE_CACHE__EMIT_QUERY_TEXT"] = os.environ.get("SCACHE_CACHE__EMIT_QUERY_TEXT", "true")
    stopping = {"flag": False}

    def _stop(signum, _frame):
        stopping["flag"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    # A shell starting the demo in the background leaves SIGINT ignored; Ctrl-C / kill -INT must still stop it.
    signal.signal(signal.SIGINT, _stop)
    started = time.monotonic()
    try:
        log.info("starting the embedded stack", extra={"state_dir": str(state_dir)})
        stack.start_all()
        cache_url = stack.service("cache-service").info["url"]
        dash_url = stack.service("dashboard").info["url"]
        log.info("stack up in %.0fs", time.monotonic() - started)
        print(f"\n  scache demo is running.\n  Dashboard:     {dash_url}\n"
              f"  Cache API:     {cache_url}/docs\n  ClickHouse:    {stack.env['SCACHE_CLICKHOUSE__URL']}\n"
              f"  Kafka:         {stack.env['SCACHE_KAFKA__BOOTSTRAP_SERVERS']}\n"
              f"  Model:         {os.environ.get('SCACHE_SERVICE__UPSTREAM_URL') or _stand_in(stack)}\n"
              f"  Logs:          {state_dir / 'logs'}\n  Ctrl-C stops everything.\n\n"
              f"  Ask through the cache (OpenAI-compatible; ask twice, or a paraphrase, to see a hit):\n"
              f"    curl -si {cache_url}/v1/chat/completions -H 'content-type: application/json' \\\n"
              f"      -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"How do I reset my card PIN?\"}}],"
              f"\"user\":\"me\"}}'\n", flush=True)
        replay_forever(cache_url, rate_per_s=args.rate, experiments_file=stack.settings().experiments_file)
    except KeyboardInterrupt:
        log.info("stopping")
    finally:
        stack.stop()
    return 0


def _stand_in(stack: Stack) -> str:
    return stack.service("demo-model").info["url"] + "/v1/chat/completions (a stand-in: infra/demo_model.py)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start everything and replay banking77 traffic live")
    demo.add_argument("--rate", type=float, default=10.0, help="requests per second (default 10)")
    demo.add_argument("--window-s", type=int, default=10, help="attribution window in seconds (default 10)")
    demo.add_argument("--state-dir", help="where service data and logs go (default $SCACHE_HOME/demo)")
    args = parser.parse_args(argv)
    if not 0 < args.rate < float("inf"):  # also refuses nan, which started everything to replay at no rate
        parser.error("--rate must be a positive number")
    if args.window_s < 1:
        parser.error("--window-s must be at least 1")
    configure_logging()
    return _demo(args)


if __name__ == "__main__":
    sys.exit(main())
