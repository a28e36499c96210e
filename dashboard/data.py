"""Streamlit-side data access: one shared ClickHouse client and cached query results.

The client is a ``st.cache_resource`` (shared by every session). Query results are
``st.cache_data`` keyed on the query name, the warehouse, the filters and a
refresh tick, so each result is re-read at most once per refresh interval.
"""
from __future__ import annotations

import json
import time

import pandas as pd
import streamlit as st

from cache_core.experiments import ExperimentConfig, load_experiments
from cache_core.settings import ClickHouseSettings, Settings
from dashboard.control import queries

RESULT_TTL_S = 600  # upper bound on memory use; freshness comes from the refresh tick


@st.cache_resource(show_spinner=False)
def _client(url: str, database: str, username: str, _settings: ClickHouseSettings):
    from cache_core.chclient import connect

    return connect(_settings)


def client(settings: Settings):
    """The shared clickhouse-connect client for these settings."""
    ch = settings.clickhouse
    return _client(ch.url, ch.database, ch.username, ch)


def refresh_tick(settings: Settings) -> int:
    return int(time.time() // settings.dashboard.refresh_s)


@st.cache_data(ttl=RESULT_TTL_S, max_entries=512, show_spinner=False)
def _run(name: str, warehouse: tuple[str, str], tick: int, args: tuple, _settings: Settings):
    fn = getattr(queries, name)
    return fn(client(_settings), *args)


def run(settings: Settings, name: str, *args):
    """``queries.<name>(client, *args)``, cached until the next refresh tick."""
    warehouse = (settings.clickhouse.url, settings.clickhouse.database)
    return _run(name, warehouse, refresh_tick(settings), args, settings)


def file_configs(settings: Settings) -> dict[str, ExperimentConfig]:
    """Definitions in the experiments file ({} if there is none)."""
    try:
        return load_experiments(settings.experiments_file)
    except ValueError:
        return {}


def experiment_configs(settings: Settings) -> dict[str, ExperimentConfig]:
    """Known experiment definitions: the experiments file, overridden by newer versions
    stored in ClickHouse by the control panel (reading Kafka on every refresh would be slow)."""
    configs = file_configs(settings)  # no file: the warehouse may still know experiments
    stored: pd.DataFrame = run(settings, "experiments")
    for row in stored.itertuples(index=False):
        if row.config_json:
            config = ExperimentConfig.model_validate(json.loads(row.config_json))
            if row.experiment_id not in configs or config.version >= configs[row.experiment_id].version:
                configs[row.experiment_id] = config
    return configs


def experiment_ids(settings: Settings) -> list[str]:
    """Experiments with a definition or with data, sorted."""
    stored: pd.DataFrame = run(settings, "experiments")
    return sorted(set(experiment_configs(settings)) | set(stored["experiment_id"]))


def clear() -> None:
    """Drop cached results (after a push, so the panel shows the new version)."""
    _run.clear()
