"""A standalone Flink session cluster on loopback, from the apache-flink wheel's own scripts.

One JobManager and one TaskManager (``bin/jobmanager.sh`` / ``bin/taskmanager.sh
start-foreground``, each in its own process group), a config dir of our own (the wheel's
log4j files plus a written ``config.yaml``), every port free and bound to 127.0.0.1, logs
and pid files under the run dir. Jobs go in with the documented ``bin/flink run -py`` line
(see infra/flink/README.md), so this is what a real cluster sees, not the in-process
mini-cluster of ``python jobs/attribution_job.py``.

    python -m infra.flink.cluster start [--run-dir DIR]    # prints the REST URL, leaves it running
    python -m infra.flink.cluster submit [--run-dir DIR]   # flink run the attribution job (SCACHE_* env)
    python -m infra.flink.cluster status [--run-dir DIR]
    python -m infra.flink.cluster stop [--run-dir DIR]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cache_core.logs import configure_logging
from cache_core.runtime import scache_home
from infra.runtime import REPO_ROOT, Service, free_port, spawn, tail

log = logging.getLogger("scache.flink.cluster")

HOST = "127.0.0.1"
JOB_FILE = REPO_ROOT / "jobs" / "attribution_job.py"
START_TIMEOUT_S = 180.0
SUBMIT_TIMEOUT_S = 300.0  # client JVM + Python main + planner on a shared 2-core machine
STOP_TIMEOUT_S = 30.0
STATE_FILE = "cluster.json"
_JOB_ID = re.compile(r"JobID ([0-9a-f]{32})")


def flink_home() -> Path:
    """The wheel's FLINK_HOME (``pyflink/`` holds bin/, lib/, opt/, conf/)."""
    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("apache-flink is not installed in this interpreter")
    home = Path(list(spec.submodule_search_locations)[0])
    if not (home / "bin" / "jobmanager.sh").exists():
        raise FileNotFoundError(f"{home}: no bin/jobmanager.sh (not a full PyFlink wheel?)")
    return home


def default_run_dir() -> Path:
    return scache_home() / "flink-cluster"


def _wheel_java_opts(home: Path) -> str:
    """``env.java.opts.all`` of the wheel's config.yaml: the --add-opens Flink needs on Java 17."""
    match = re.search(r"^\s*all:\s*(--add-.*)$", (home / "conf" / "config.yaml").read_text(), re.M)
    return match.group(1).strip() if match else ""


def cluster_config(run_dir: Path, ports: dict[str, int], python: str, slots: int,
                   jm_memory: str, tm_memory: str, home: Path) -> dict[str, str]:
    """Flat config.yaml keys (Flink reads flattened keys as well as nested ones)."""
    return {
        "jobmanager.rpc.address": HOST,
        "jobmanager.rpc.port": str(ports["jobmanager_rpc"]),
        "jobmanager.bind-host": HOST,
        "jobmanager.memory.process.size": jm_memory,
        "jobmanager.execution.failover-strategy": "region",
        "taskmanager.host": HOST,
        "taskmanager.bind-host": HOST,
        "taskmanager.rpc.port": str(ports["taskmanager_rpc"]),
        "taskmanager.data.port": str(ports["taskmanager_data"]),
        "taskmanager.numberOfTaskSlots": str(slots),
        "taskmanager.memory.process.size": tm_memory,
        "rest.address": HOST,
        "rest.bind-address": HOST,
        "rest.port": str(ports["rest"]),
        "blob.server.port": str(ports["blob"]),
        "parallelism.default": "1",
        # The TaskManager's Python workers and the `flink run` client's Python main.
        "python.executable": python,
        "python.client.executable": python,
        "env.log.dir": str(run_dir / "log"),
        "env.pid.dir": str(run_dir),  # not /tmp: other clusters on the machine keep theirs
        "io.tmp.dirs": str(run_dir / "tmp"),
        "env.java.opts.all": _wheel_java_opts(home),
    }


def write_lib_dir(lib_dir: Path, home: Path) -> Path:
    """The wheel's lib/ plus opt/flink-python: a cluster runs Python jobs only with it on its classpath.

    The wheel keeps flink-python in opt/; without it the
    JobManager cannot deserialize the job's Python operators (ClassNotFoundException
    ...ArrowPythonScalarFunctionOperator). Symlinks in a lib dir of our own, so the shared
    venv is never modified.
    """
    lib_dir.mkdir(parents=True, exist_ok=True)
    jars = sorted((home / "lib").glob("*.jar")) + sorted((home / "opt").glob("flink-python-*.jar"))
    for jar in jars:
        (lib_dir / jar.name).symlink_to(jar)
    return lib_dir


def write_conf_dir(conf_dir: Path, config: dict[str, str], home: Path) -> Path:
    """The wheel's log4j/logback files plus our config.yaml (values JSON-quoted: valid YAML)."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    for src in (home / "conf").iterdir():
        if src.suffix in (".properties", ".xml"):
            shutil.copy(src, conf_dir / src.name)
    lines = [f"{key}: {json.dumps(value)}" for key, value in config.items()]
    (conf_dir / "config.yaml").write_text("\n".join(lines) + "\n")
    return conf_dir


def _get_json(url: str, timeout_s: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def _group_alive(pgid: int, proc: subprocess.Popen | None = None) -> bool:
    """Any process left in the group? Reaps ``proc`` (our own child) first: a zombie
    leader would still count as a member."""
    if proc is not None:
        proc.poll()
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pgid: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group, SIGKILL whatever is left after ``timeout_s``.

    The group holds the script's JVM and, for the TaskManager, its Python workers.
    """
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _group_alive(pgid, proc):
                return
            time.sleep(0.2)
        if sig == signal.SIGTERM:
            log.warning("flink process group ignored SIGTERM, killing", extra={"pgid": pgid})
    if _group_alive(pgid, proc):
        raise RuntimeError(f"process group {pgid} survived SIGKILL")


@dataclass
class FlinkCluster:
    """A running (or remembered) standalone cluster; ``stop()`` ends every process it started."""

    run_dir: Path
    rest_port: int
    python: str
    pids: dict[str, int] = field(default_factory=dict)  # name -> process group leader
    services: list[Service] = field(default_factory=list)  # only in the process that started it
    submits: int = 0

    @property
    def rest_url(self) -> str:
        return f"http://{HOST}:{self.rest_port}"

    @property
    def conf_dir(self) -> Path:
        return self.run_dir / "conf"

    def log_paths(self) -> list[Path]:
        """Flink's own logs and the scripts' console output (JVM start errors land there)."""
        return sorted((self.run_dir / "log").glob("*.log")) + sorted((self.run_dir / "log").glob("*.out"))

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of every log, without the config echo (one line per key, printed
        after a failed memory check, so it would hide the error)."""
        parts = []
        for path in self.log_paths():
            if path.exists():
                kept = [line for line in path.read_text(errors="replace").splitlines()
                        if "Loading configuration property" not in line]
                parts.append(f"--- {path}\n" + "\n".join(kept[-lines:]))
        return "\n".join(parts)

    # -- REST ---------------------------------------------------------------------------
    def overview(self) -> dict:
        return _get_json(f"{self.rest_url}/overview")

    def job(self, job_id: str) -> dict:
        """/jobs/<id>: name, state, vertices (with their status and parallelism)."""
        return _get_json(f"{self.rest_url}/jobs/{job_id}")

    def job_status(self, job_id: str) -> str:
        return self.job(job_id)["state"]

    def job_exceptions(self, job_id: str, chars: int = 4000) -> str:
        """The newest failure's stack trace (why a job is RESTARTING / FAILED), shortened."""
        entries = _get_json(f"{self.rest_url}/jobs/{job_id}/exceptions").get("exceptionHistory", {})
        entries = entries.get("entries", [])
        return entries[0].get("stacktrace", "")[:chars] if entries else "(no exceptions recorded)"

    def jobs(self) -> list[dict]:
        return _get_json(f"{self.rest_url}/jobs")["jobs"]

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S, taskmanagers: int = 1) -> dict:
        """Until /overview shows ``taskmanagers`` registered with their slots; a clear error with
        the logs if not (a TaskManager is counted a moment before its slots are)."""
        deadline = time.monotonic() + timeout_s
        last: object = "no answer"
        while time.monotonic() < deadline:
            for service in self.services:
                if not service.alive():
                    raise RuntimeError(f"flink {service.name} exited with {service.proc.returncode}\n"
                                       f"{self.log_tail()}")
            try:
                overview = self.overview()
                if overview.get("taskmanagers", 0) >= taskmanagers and overview.get("slots-total", 0) > 0:
                    return overview
                last = overview
            except (OSError, ValueError) as exc:  # not listening yet / half-started
                last = exc
            time.sleep(0.5)
        raise TimeoutError(f"flink cluster: REST {self.rest_url}/overview not showing {taskmanagers} "
                           f"taskmanager(s) after {timeout_s:.0f}s (last: {last})\n{self.log_tail()}")

    def wait_job_status(self, job_id: str, wanted: str, timeout_s: float) -> str:
        """Poll until the job is ``wanted`` or terminal; returns the last status seen."""
        deadline = time.monotonic() + timeout_s
        status = ""
        while time.monotonic() < deadline:
            try:
                status = self.job_status(job_id)
            except (OSError, ValueError):
                status = "UNKNOWN"
            if status in (wanted, "FAILED", "CANCELED", "FINISHED"):
                break
            time.sleep(0.5)
        return status

    # -- jobs ---------------------------------------------------------------------------
    def submit_command(self, job_file: Path, connector_jar: Path) -> list[str]:
        """The README's ``flink run`` line, pointed at this cluster.

        No ``-pyfs``: the job ships udfs/, cache_core/ and jobs/ itself (``add_python_file``),
        and the same directory given twice makes the client fail compressing it
        (FileAlreadyExistsException .../jobs.zip).
        """
        return [str(flink_home() / "bin" / "flink"), "run", "-d", "-m", f"{HOST}:{self.rest_port}",
                "-py", str(job_file), "-pyexec", self.python, "-j", str(connector_jar)]

    def submit(self, job_file: Path = JOB_FILE, env: dict[str, str] | None = None,
               timeout_s: float = SUBMIT_TIMEOUT_S) -> str:
        """``flink run -d -py job_file`` with ``env`` (the SCACHE_* settings); returns the job id.

        The Python main runs in the client (``python.client.executable``); the SCACHE_*
        variables are read there and baked into the job graph.
        """
        from infra.flink.resolve import connector_jar

        env = dict(env or {})
        jar = Path(env.get("SCACHE_FLINK__CONNECTOR_JAR") or connector_jar())
        self.submits += 1
        log_path = self.run_dir / "log" / f"submit-{self.submits}.out"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.submit_command(Path(job_file), jar)
        full_env = {**os.environ, **env, "FLINK_CONF_DIR": str(self.conf_dir),
                    "FLINK_LOG_DIR": str(self.run_dir / "log")}
        full_env.setdefault("PYTHONPATH", str(REPO_ROOT))
        started = time.monotonic()
        log.info("submitting", extra={"job_file": str(job_file), "rest": self.rest_url, "log": str(log_path)})
        with open(log_path, "wb") as out:
            client = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=full_env, cwd=REPO_ROOT, start_new_session=True)
        try:
            returncode = client.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            # The client JVM and the Python main it started share the group.
            _kill_group(client.pid, 5.0, client)
            raise TimeoutError(f"flink run: not done after {timeout_s:.0f}s\n{tail(log_path)}") from exc
        match = _JOB_ID.search(log_path.read_text(errors="replace"))
        if returncode != 0 or match is None:
            raise RuntimeError(f"flink run failed (exit {returncode}), see {log_path}\n{tail(log_path)}")
        job_id = match.group(1)
        log.info("job submitted", extra={"job_id": job_id, "submit_s": round(time.monotonic() - started, 1)})
        return job_id

    def cancel(self, job_id: str, timeout_s: float = 60.0) -> str:
        """Cancel over REST (no client JVM needed) and wait until CANCELED; returns the final status."""
        request = urllib.request.Request(f"{self.rest_url}/jobs/{job_id}?mode=cancel", method="PATCH")
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"cancel {job_id}: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        status = self.wait_job_status(job_id, "CANCELED", timeout_s)
        log.info("job cancelled", extra={"job_id": job_id, "status": status})
        return status

    # -- lifecycle ----------------------------------------------------------------------
    def save(self) -> None:
        (self.run_dir / STATE_FILE).write_text(json.dumps(
            {"rest_port": self.rest_port, "python": self.python, "pids": self.pids}))

    @classmethod
    def load(cls, run_dir: Path) -> FlinkCluster:
        state = json.loads((Path(run_dir) / STATE_FILE).read_text())
        return cls(run_dir=Path(run_dir), rest_port=state["rest_port"], python=state["python"],
                   pids=state["pids"])

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """TaskManager first (it runs the Python workers, same process group), then the JobManager."""
        procs = {service.name: service.proc for service in self.services}
        errors = []
        for name in ("taskmanager", "jobmanager"):
            pid = self.pids.get(name)
            if pid is None:
                continue
            log.info("stopping flink %s", name, extra={"pid": pid})
            try:
                _kill_group(pid, timeout_s, procs.get(name))
            except RuntimeError as exc:  # still stop the other one
                errors.append(f"{name}: {exc}")
                continue
            del self.pids[name]
        if errors:
            self.save()  # what is left stays known to `stop`
            raise RuntimeError("could not stop flink: " + "; ".join(errors))
        state = self.run_dir / STATE_FILE
        if state.exists():
            state.unlink()

    def running(self) -> bool:
        return any(_group_alive(pid) for pid in self.pids.values())


def start(run_dir: Path | None = None, slots: int = 2, jm_memory: str = "1024m", tm_memory: str = "1280m",
          python: str | None = None, timeout_s: float = START_TIMEOUT_S) -> FlinkCluster:
    """Start one JobManager and one TaskManager and wait until the TaskManager has registered."""
    home = flink_home()
    run_dir = Path(run_dir or default_run_dir()).resolve()
    if (run_dir / STATE_FILE).exists():
        old = FlinkCluster.load(run_dir)
        if old.running():
            raise RuntimeError(f"a cluster from {run_dir} is still running ({old.rest_url}); stop it first")
    for sub in ("conf", "lib", "log", "tmp"):
        shutil.rmtree(run_dir / sub, ignore_errors=True)
    (run_dir / "tmp").mkdir(parents=True)
    python = python or sys.executable
    ports = {name: free_port(HOST) for name in
             ("rest", "jobmanager_rpc", "taskmanager_rpc", "taskmanager_data", "blob")}
    config = cluster_config(run_dir, ports, python, slots, jm_memory, tm_memory, home)
    conf_dir = write_conf_dir(run_dir / "conf", config, home)
    env = {"FLINK_CONF_DIR": str(conf_dir), "FLINK_LOG_DIR": str(run_dir / "log"),
           "FLINK_LIB_DIR": str(write_lib_dir(run_dir / "lib", home))}
    cluster = FlinkCluster(run_dir=run_dir, rest_port=ports["rest"], python=python)
    started = time.monotonic()
    try:
        for name, script in (("jobmanager", "jobmanager.sh"), ("taskmanager", "taskmanager.sh")):
            service = spawn(name, [str(home / "bin" / script), "start-foreground"],
                            run_dir / "log" / f"{name}.out", env=env, cwd=run_dir)
            cluster.services.append(service)
            cluster.pids[name] = service.proc.pid
        cluster.save()
        overview = cluster.wait_ready(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    log.info("flink cluster ready", extra={"rest": cluster.rest_url, "slots": overview.get("slots-total"),
                                           "flink": overview.get("flink-version"),
                                           "start_s": round(time.monotonic() - started, 1)})
    return cluster


# -- CLI --------------------------------------------------------------------------------

def _cli_start(args: argparse.Namespace) -> int:
    cluster = start(args.run_dir, slots=args.slots)
    print(f"flink cluster running: {cluster.rest_url} (logs {cluster.run_dir / 'log'})")
    return 0


def _cli_submit(args: argparse.Namespace) -> int:
    try:
        cluster = FlinkCluster.load(args.run_dir)
    except FileNotFoundError:
        print(f"error: no cluster started from {args.run_dir} (python -m infra.flink.cluster start)", file=sys.stderr)
        return 1
    job_id = cluster.submit(Path(args.job_file), {k: v for k, v in os.environ.items() if k.startswith("SCACHE_")})
    status = cluster.wait_job_status(job_id, "RUNNING", 120)
    print(f"job {job_id} {status}")
    return 0 if status == "RUNNING" else 1


def _cli_status(args: argparse.Namespace) -> int:
    try:
        cluster = FlinkCluster.load(args.run_dir)
    except FileNotFoundError:
        print(f"no cluster started from {args.run_dir}", file=sys.stderr)
        return 1
    try:
        overview = cluster.overview()
    except OSError as exc:
        print(f"cluster at {cluster.rest_url} not answering ({exc}); processes alive: {cluster.running()}")
        return 1
    print(f"{cluster.rest_url}: flink {overview.get('flink-version')}, {overview.get('taskmanagers')} "
          f"taskmanager(s), {overview.get('slots-available')}/{overview.get('slots-total')} slots free, "
          f"{overview.get('jobs-running')} job(s) running")
    for job in cluster.jobs():
        print(f"  {job['id']} {job['status']}")
    return 0


def _cli_stop(args: argparse.Namespace) -> int:
    try:
        cluster = FlinkCluster.load(args.run_dir)
    except FileNotFoundError:
        print(f"no cluster started from {args.run_dir}")
        return 0
    cluster.stop()
    print("flink cluster stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.flink.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("start", _cli_start), ("submit", _cli_submit), ("status", _cli_status),
                       ("stop", _cli_stop)):
        cmd = sub.add_parser(name)
        cmd.add_argument("--run-dir", type=Path, default=default_run_dir(),
                         help="conf, logs and pid state (default $SCACHE_HOME/flink-cluster)")
        cmd.set_defaults(func=func)
        if name == "start":
            cmd.add_argument("--slots", type=int, default=2)
        if name == "submit":
            cmd.add_argument("--job-file", default=str(JOB_FILE))
    args = parser.parse_args(argv)
    if getattr(args, "slots", 1) < 1:  # else the task manager starts and dies with a Java stack trace
        sub.choices["start"].error("--slots must be at least 1")
    configure_logging()
    try:
        return args.func(args)
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
