"""The attribution job's optimized plan, from Flink's own planner (``--explain``, no services).

Every operator must be one whose state is bounded: windows, dedup and the feedback interval
join (their state expires) — never a regular stream join, and never a bounded source, whose
task FINISHES while the job runs (it did: a constant UNNEST became Values -> Correlate joined
to the stream, and the cluster test saw a task that never reached RUNNING).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from infra.runtime import REPO_ROOT
from tests.fixtures.flink import JOB_SCRIPT, connector_jar

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SCACHE_LOG_LEVEL": "WARNING",
           "SCACHE_FLINK__CONNECTOR_JAR": str(connector_jar()),
           "SCACHE_FLINK__CHECKPOINT_DIR": str(tmp_path_factory.mktemp("checkpoints"))}
    done = subprocess.run([sys.executable, str(JOB_SCRIPT), "--explain"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("== Optimized Execution Plan ==", 1)[1]


def _operators(plan: str) -> list[str]:
    return re.findall(r"^[\s:|+-]*([A-Za-z]+)\(", plan, flags=re.MULTILINE)


def test_no_bounded_source_and_no_regular_join(plan):
    operators = set(_operators(plan))
    assert "Values" not in operators
    assert "Join" not in operators
    assert operators >= {"TableSourceScan", "IntervalJoin", "Deduplicate", "Correlate"}


def test_both_topics_are_read_once(plan):
    scans = re.findall(r"TableSourceScan\(table=\[\[default_catalog, default_database, (\w+)", plan)
    assert sorted(set(scans)) == ["events", "feedback"]
    assert len(scans) == 2  # the other branches reuse the scans
