"""The one way scache code opens a ClickHouse connection (embedded warehouse or real server)."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import clickhouse_connect
from clickhouse_connect.driver import Client

from cache_core.settings import ClickHouseSettings


def connect(ch: ClickHouseSettings, **kw: Any) -> Client:
    """A clickhouse-connect client for ``ch.url``; keyword arguments override (e.g. ``database``).

    Sessions are off by default: scache needs no session state, and a session makes a
    client unusable from two threads at once (Streamlit reruns, Flink sink threads).
    """
    url = urlsplit(ch.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"ClickHouse URL must be http(s)://host[:port], got {ch.url!r}")
    options: dict[str, Any] = {
        "interface": url.scheme,
        "host": url.hostname,
        "port": url.port or (8443 if url.scheme == "https" else 8123),
        "username": url.username or ch.username,
        "password": url.password or ch.password.get_secret_value(),
        "database": ch.database,
        "autogenerate_session_id": False,
    }
    if url.path.strip("/"):
        options["proxy_path"] = url.path
    options.update(kw)
    return clickhouse_connect.get_client(**options)
