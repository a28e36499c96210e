"""Every command-line entry point of the packages: ``--help`` prints help under the command's real name
(``usage: python -m infra.clickhouse.migrate``, not ``usage: migrate.py``) and does nothing else, and a bad
argument is an error naming the command, not a traceback. Each runs as a child with every service address
pointing at a refused loopback port and HOME / SCACHE_HOME in an empty directory that must stay empty."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from infra.runtime import REPO_ROOT, free_port

PACKAGES = ("cache_core", "udfs", "jobs", "dashboard", "infra")
SCRIPTS = {"jobs.attribution_job": "python jobs/attribution_job.py"}  # run by path (flink run -py), not -m
NAMED = {"infra.cli": "scache"}  # the console script


def entry_points() -> dict[str, str]:
    """module -> the program name its usage must show, for every file with a ``__main__`` guard."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            text = path.read_text()
            if path.name != "__main__.py" and 'if __name__ == "__main__"' not in text:
                continue
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if path.name == "__main__.py" else parts)
            found[module] = NAMED.get(module) or SCRIPTS.get(module) or f"python -m {module}"
    return found


ENTRY_POINTS = entry_points()


def _argv(module: str) -> list[str]:
    if module in SCRIPTS:
        return [sys.executable, str(REPO_ROOT / SCRIPTS[module].split()[-1])]
    return [sys.executable, "-m", module]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], tuple[subprocess.CompletedProcess, float, list[str]]]:
    refused = free_port()

    def run(module: str, flag: str):
        home = tmp_path_factory.mktemp("home")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCACHE_")}
        env.update(HOME=str(home), SCACHE_HOME=str(home / "scache"), PYTHONPATH=str(REPO_ROOT),
                   SCACHE_KAFKA__BOOTSTRAP_SERVERS=f"127.0.0.1:{refused}",
                   SCACHE_CLICKHOUSE__URL=f"http://127.0.0.1:{refused}")
        started = time.monotonic()
        done = subprocess.run([*_argv(module), flag], cwd=home, env=env, capture_output=True, text=True,
                              timeout=180)
        left = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
        return (module, flag), (done, time.monotonic() - started, left)

    cases = [(module, flag) for module in ENTRY_POINTS for flag in ("--help", "--bogus-flag")]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(lambda case: run(*case), cases))


def test_the_known_entry_points_are_found():
    assert {"infra.clickhouse.migrate", "dashboard.control.simulation", "infra.kafka.broker", "cache_core.service",
            "jobs.attribution_job", "infra.stack", "infra.replay", "infra.cli"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_help_prints_usage_under_the_real_name_and_does_nothing_else(runs, module):
    done, elapsed, left = runs[(module, "--help")]
    prog = ENTRY_POINTS[module]
    assert done.returncode == 0, f"{module} --help: exit {done.returncode}\n{done.stderr[-2000:]}"
    assert done.stdout.startswith(f"usage: {prog}"), f"{module} --help printed:\n{done.stdout[:500]}"
    assert "Traceback" not in done.stderr and not left, (done.stderr[-2000:], left)  # wrote nothing
    assert elapsed < 60, f"{module} --help took {elapsed:.0f} s"  # help, not work


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_a_bad_argument_is_an_error_naming_the_command(runs, module):
    done, _, left = runs[(module, "--bogus-flag")]
    prog = ENTRY_POINTS[module]
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, f"{module}: exit {done.returncode}\n{done.stderr}"
    assert lines and lines[-1].startswith(f"{prog}: "), done.stderr  # argparse's error line (or a required one's)
    assert not left, left
