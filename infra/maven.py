"""Copy a pom's dependencies from Maven Central into a directory, once.

Shared by the Kafka broker's jars (infra/kafka/resolve.py) and the Flink connector
(infra/flink/resolve.py). A marker file is written only after Maven succeeded and the
expected jar is there, so a half-copied directory is never used; an exclusive lock beside
the directory lets one of several processes asking at once (tests, launchers) resolve while
the others wait and then reuse its result.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)


def pom_digest(pom: Path) -> str:
    """First 12 hex chars of the pom's sha256: the jar directory's key, so an edited pom resolves afresh."""
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:12]


def copy_dependencies_once(pom: Path, target: Path, *, marker: str, expect: str, what: str,
                           marker_text: str = "ok\n") -> Path:
    """``target`` with ``pom``'s dependencies in it (``expect``: a glob one of them matches),
    running Maven only if ``target/marker`` is missing."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / marker).exists():
            _run_maven(pom, target, expect, what)
            (target / marker).write_text(marker_text)
    return target


def _run_maven(pom: Path, target: Path, expect: str, what: str) -> None:
    if shutil.which("mvn") is None:
        raise RuntimeError(f"mvn not found on PATH: install Maven to resolve the {what}")
    shutil.rmtree(target, ignore_errors=True)  # what an interrupted run left
    cmd = ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={target}"]
    log.info("resolving %s", what, extra={"dir": str(target)})
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"maven failed ({done.returncode}) resolving {pom}:\n"
                           f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    if not any(target.glob(expect)):
        raise RuntimeError(f"maven succeeded but {target} has no {expect}")
