"""Resolve the Kafka broker's jars from Maven Central into scache_home(), once per pom.

The target directory is named after the pom's content hash, so editing the pom
gives a fresh directory and an unchanged pom reuses the cached one. A marker file
is written only after Maven succeeded; a half-copied directory is never used.
"""
from __future__ import annotations

import sys
from pathlib import Path

from infra.maven import copy_dependencies_once, pom_digest
from cache_core.runtime import scache_home

POM = Path(__file__).resolve().parent / "pom.xml"
MARKER = ".complete"


def jars_dir(pom: Path = POM) -> Path:
    return scache_home() / "jars" / f"kafka-{pom_digest(pom)}"


def resolve_jars(pom: Path = POM) -> Path:
    """The directory holding every runtime jar of the broker, resolving it if needed."""
    return copy_dependencies_once(pom, jars_dir(pom), marker=MARKER, expect="kafka_2.13-*.jar",
                                  what="Kafka broker's jars")


def kafka_classpath(pom: Path = POM) -> str:
    """A java -cp value (``dir/*``) with the broker and its runtime dependencies."""
    return str(resolve_jars(pom) / "*")


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m infra.kafka.resolve", description="Resolve the Kafka broker's jars from Maven Central (once) and print their directory.").parse_args(argv)
    try:
        print(resolve_jars())
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
