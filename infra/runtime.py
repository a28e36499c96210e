"""Helpers shared by every service launcher: paths, free ports, child processes."""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """The project's shared labelled data (``../shared/data`` beside the clone)."""
    return Path(os.environ.get("SCACHE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


# banking77 is CC BY 4.0 and ships with the repo (data/banking77, attributed).
BANKING77_DIR = REPO_ROOT / "data" / "banking77"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25,
               proc: subprocess.Popen | None = None, log_path: Path | None = None) -> None:
    """Poll ``check`` until true; fail early if ``proc`` dies, with its log tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}\n{tail(log_path)}")
        try:
            if check():
                return
        except Exception:  # readiness probes fail in many ways while starting
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not ready after {timeout_s:.0f}s\n{tail(log_path)}")


def tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Service:
    """A child process in its own process group, with its output in a log file."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    info: dict = field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc.poll() is not None:
            return
        log.info("stopping %s", self.name, extra={"pid": self.proc.pid})
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """Hard kill (crash simulation)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still running (a service's JVMs, workers)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def spawn(name: str, cmd: list[str], log_path: Path, env: dict | None = None,
          cwd: Path | None = None) -> Service:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out = open(log_path, "ab")
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONPATH", str(REPO_ROOT))
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=full_env, cwd=cwd or REPO_ROOT, start_new_session=True,
    )
    out.close()
    log.info("started %s", name, extra={"pid": proc.pid, "log": str(log_path)})
    return Service(name=name, proc=proc, log_path=log_path)
