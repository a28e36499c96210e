"""infra/flink: the connector pinned in the pom fits the installed PyFlink."""
from __future__ import annotations

import pyflink.version

from infra.flink import resolve


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_connector_suffix_matches_pyflink_major_minor():
    connector = resolve.connector_version()
    flink_suffix = connector.rsplit("-", 1)[1]
    assert flink_suffix == _major_minor(pyflink.version.__version__), (
        f"flink-sql-connector-kafka {connector} is built for Flink {flink_suffix}, "
        f"but apache-flink {pyflink.version.__version__} is installed")


def test_jar_dir_is_keyed_by_pom_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("SCACHE_HOME", str(tmp_path))
    pom = tmp_path / "pom.xml"
    pom.write_text(resolve.POM.read_text())
    first = resolve.jar_dir(pom)
    pom.write_text(resolve.POM.read_text() + "<!-- changed -->")
    assert first.parent == tmp_path / "jars" and first != resolve.jar_dir(pom)


def test_resolved_marker_skips_maven(tmp_path, monkeypatch):
    monkeypatch.setenv("SCACHE_HOME", str(tmp_path))
    out = resolve.jar_dir()
    out.mkdir(parents=True)
    (out / ".resolved").write_text("x")
    jar = out / "flink-sql-connector-kafka-5.0.0-2.2.jar"
    jar.write_bytes(b"")
    monkeypatch.setattr(resolve, "_copy_dependencies", lambda *a: (_ for _ in ()).throw(AssertionError))
    assert resolve.connector_jar() == jar
