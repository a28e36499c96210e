"""The project as a package: the wheel holds every package and the data files the services read at run
time, the ``scache`` console script dispatches to each module's main, and pyproject's pins are the lock's."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from infra import cli
from infra.runtime import REPO_ROOT

PACKAGES = ("cache_core", "udfs", "jobs", "dashboard", "infra")
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """A wheel built without network or build isolation (the venv's setuptools), from a copy of the sources."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(out), str(src)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("scache-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_holds_every_package_and_the_files_read_at_run_time(wheel):
    names = set(wheel.namelist())
    expected = {str(init.relative_to(REPO_ROOT)) for package in PACKAGES
                for init in (REPO_ROOT / package).rglob("__init__.py")}
    assert expected <= names, sorted(expected - names)
    data = {"infra/experiments.yaml", "infra/serve-experiments.yaml", "infra/kafka/pom.xml", "infra/kafka/log4j2.properties", "infra/flink/pom.xml",
            *(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "infra/clickhouse/migrations").glob("*.sql"))}
    assert data <= names, sorted(data - names)
    assert not any(n.startswith(("tests/", "bench/", "data/")) for n in names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "scache = infra.cli:main" in wheel.read(entry_points).decode()


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "requirements.lock").read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line):
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def test_every_direct_dependency_and_extra_is_pinned_as_in_the_lock():
    lock = _lock()
    project = PYPROJECT["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    assert set(project["optional-dependencies"]) >= {"test", "bench", "export", "dashboard"}
    for requirement in requirements:
        name, version = requirement.split("==")
        assert lock.get(re.sub(r"[-_.]+", "-", name).lower()) == version, requirement
    runtime = {r.split("==")[0] for r in project["dependencies"]}
    assert not runtime & {"torch", "sentence-transformers", "apache-flink", "streamlit", "pytest"}


def test_scache_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("demo", "serve", "replay", "test", "autotune", "seed", "settings", "judge-train", "judge-eval"):
        assert re.search(rf"^  {command}\s", out, re.M), out


def test_no_command_or_an_unknown_one_is_one_line_and_exit_2(capsys):
    assert cli.main([]) == 2 and "usage: scache COMMAND" in capsys.readouterr().err
    assert cli.main(["bogus"]) == 2
    assert capsys.readouterr().err.strip() == (
        "scache: unknown command 'bogus'; choose from demo, serve, replay, test, autotune, seed, settings, judge-train, "
        "judge-eval")


def test_a_command_runs_its_modules_main_with_the_arguments(monkeypatch):
    called = []
    import infra.stack

    monkeypatch.setattr(infra.stack, "main", lambda argv: called.append(argv) or 0)
    assert cli.main(["serve", "--port", "9000"]) == 0 and called == [["serve", "--port", "9000"]]


def test_each_command_names_a_module_with_a_main():
    import importlib.util

    for module, _, _ in cli.COMMANDS.values():
        assert importlib.util.find_spec(module) is not None, module


def test_no_module_shipped_to_flink_is_named_like_a_standard_library_one():
    """PyFlink's workers can end up with a shipped package's own folder on sys.path (cache_core/types.py
    shadowed ``types`` there and every Python worker of the attribution job died importing it)."""
    text = (REPO_ROOT / "jobs" / "attribution_job.py").read_text()
    shipped = re.search(r"^SHIPPED_PACKAGES = \(([^)]*)\)", text, re.M).group(1)
    packages = re.findall(r'"(\w+)"', shipped)
    assert "cache_core" in packages
    clashes = [str(path.relative_to(REPO_ROOT)) for package in packages for path in (REPO_ROOT / package).rglob("*.py")
               if path.stem in sys.stdlib_module_names]
    assert not clashes, clashes
