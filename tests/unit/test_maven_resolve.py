"""infra/maven: one resolution per directory, and a clear error without Maven."""
from __future__ import annotations

import pytest

from infra import maven


def test_a_marked_directory_is_reused_without_maven(tmp_path, monkeypatch):
    target = tmp_path / "jars" / "x-123"
    target.mkdir(parents=True)
    (target / ".complete").write_text("ok\n")
    monkeypatch.setattr(maven, "_run_maven", lambda *a: (_ for _ in ()).throw(AssertionError("ran maven")))
    assert maven.copy_dependencies_once(tmp_path / "pom.xml", target, marker=".complete", expect="*.jar",
                                        what="jars") == target


def test_no_maven_on_path_is_a_clear_error_and_leaves_no_marker(tmp_path, monkeypatch):
    monkeypatch.setattr(maven.shutil, "which", lambda name: None)
    target = tmp_path / "jars" / "x-123"
    with pytest.raises(RuntimeError, match="mvn not found on PATH: install Maven to resolve the Flink connector"):
        maven.copy_dependencies_once(tmp_path / "pom.xml", target, marker=".complete", expect="*.jar",
                                     what="Flink connector")
    assert not (target / ".complete").exists()
