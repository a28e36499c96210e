"""Fixtures that start real services live in tests/fixtures/; they are registered here.

The suite runs on the demo's experiments (infra/experiments.yaml: ``threshold-ab``, arms at 0.80-0.90 that
hit on paraphrases), which its fixtures and assertions were written against; the settings' default is
serve's safe arms (tests/unit/test_serve_replay.py checks both defaults with the variable unset)."""
import os
from pathlib import Path

os.environ.setdefault("SCACHE_EXPERIMENTS_FILE", str(Path(__file__).resolve().parent.parent / "infra" / "experiments.yaml"))

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.warehouse",
    "tests.fixtures.flink",
    "tests.fixtures.cache",
]
