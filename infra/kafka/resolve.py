"""Resolve the Kafka broker's jars from Maven Central into scache_home(), once per pom.

The target directory is named after the pom's content hash, so editing the pom
gives a fresh directory and an unchanged pom reuses the cached one. A marker file
is written only after Maven succeeded; a half-copied directory is never used.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import subprocess
import sys
from pathlib import Path

from infra.runtime import scache_home

log = logging.getLogger(__name__)

POM = Path(__file__).resolve().parent / "pom.xml"
MARKER = ".complete"


def pom_digest(pom: Path = POM) -> str:
    """First 12 hex chars of the pom's sha256."""
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:12]


def jars_dir(pom: Path = POM) -> Path:
    return scache_home() / "jars" / f"kafka-{pom_digest(pom)}"


def resolve_jars(pom: Path = POM) -> Path:
    """The directory holding every runtime jar of the broker, resolving it if needed."""
    target = jars_dir(pom)
    if (target / MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (tests, launchers) may ask at once: one resolves, others wait.
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / MARKER).exists():
            _run_maven(pom, target)
    return target


def _run_maven(pom: Path, target: Path) -> None:
    if shutil.which("mvn") is None:
        raise RuntimeError("mvn not found on PATH: install Maven to resolve the Kafka jars")
    shutil.rmtree(target, ignore_errors=True)
    cmd = ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
           f"-DoutputDirectory={target}"]
    log.info("resolving kafka jars", extra={"dir": str(target)})
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"maven failed ({done.returncode}) resolving {pom}:\n"
                           f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    if not any(target.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"maven succeeded but {target} has no kafka_2.13 jar")
    (target / MARKER).write_text("ok\n")


def kafka_classpath(pom: Path = POM) -> str:
    """A java -cp value (``dir/*``) with the broker and its runtime dependencies."""
    return str(resolve_jars(pom) / "*")


def main() -> int:
    try:
        print(resolve_jars())
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
