"""The few machine helpers the cache itself needs: where it keeps files outside the clone,
and whether a port answers. infra/runtime.py (launchers) builds on these."""
from __future__ import annotations

import os
import socket
from pathlib import Path


def scache_home() -> Path:
    """Machine-wide cache for venvs, resolved jars and service state (outside the clone)."""
    return Path(os.environ.get("SCACHE_HOME", Path.home() / ".cache" / "scache"))


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
