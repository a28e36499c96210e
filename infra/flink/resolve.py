"""Resolve the Flink Kafka SQL connector jar from Maven Central, once per pom version.

The jar lands in ``<scache_home()>/jars/flink-<pom sha256[:12]>/``; a marker file there
says the copy finished, so later calls (and other processes) skip Maven entirely.
CLI: ``python -m infra.flink.resolve`` prints the jar path.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from infra.maven import copy_dependencies_once, pom_digest
from cache_core.runtime import scache_home

POM = Path(__file__).resolve().parent / "pom.xml"
CONNECTOR_ARTIFACT = "flink-sql-connector-kafka"
_MARKER = ".resolved"


def jar_dir(pom: Path = POM) -> Path:
    return scache_home() / "jars" / f"flink-{pom_digest(pom)}"


def connector_version(pom: Path = POM) -> str:
    """The connector version pinned in the pom, e.g. ``5.0.0-2.2``."""
    match = re.search(r"<flink\.kafka\.connector\.version>([^<]+)<", pom.read_text())
    if match is None:
        raise ValueError(f"{pom}: no <flink.kafka.connector.version> property")
    return match.group(1).strip()


def connector_jar(pom: Path = POM) -> Path:
    """Path of the resolved connector jar; runs Maven only if not resolved yet."""
    out = jar_dir(pom)
    if not (out / _MARKER).exists():
        _copy_dependencies(pom, out)
    jars = sorted(out.glob(f"{CONNECTOR_ARTIFACT}-*.jar"))
    if not jars:
        raise FileNotFoundError(f"{out}: no {CONNECTOR_ARTIFACT} jar after resolution")
    return jars[-1]


def _copy_dependencies(pom: Path, out: Path) -> None:
    copy_dependencies_once(pom, out, marker=_MARKER, expect=f"{CONNECTOR_ARTIFACT}-*.jar",
                           what="Flink Kafka connector", marker_text=connector_version(pom) + "\n")


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m infra.flink.resolve", description="Resolve the Flink Kafka SQL connector jar from Maven Central (once) and print its path.").parse_args(argv)
    try:
        print(connector_jar())
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
