"""The client API keys in force (``cache_core.service.auth`` checks them), by sha256."""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import yaml
from pydantic import TypeAdapter

from cache_core.settings import ClientKey, ServiceSettings

log = logging.getLogger(__name__)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.strip().encode()).hexdigest()


class KeyRing:
    """The client keys in force, by digest."""

    def __init__(self, keys: list[ClientKey]):
        self.by_digest = {key.sha256: key for key in keys}

    @classmethod
    def from_settings(cls, service: ServiceSettings) -> KeyRing:
        """The settings' keys and the key file's. Raises ValueError for a file that does not parse."""
        keys = list(service.api_keys)
        if service.api_keys_file is not None:
            keys += load_key_file(service.api_keys_file)
        if service.open_access:
            log.warning("open access: anyone who reaches this port may look up, store, chat and post feedback "
                        "in any namespace (SCACHE_SERVICE__OPEN_ACCESS=true; for local use only)")
        elif not keys:
            log.warning("no client API keys configured: lookups, stores, chat and feedback will be refused "
                        "(SCACHE_SERVICE__API_KEYS, or SCACHE_SERVICE__OPEN_ACCESS=true for local use)")
        return cls(keys)

    def find(self, key: str) -> ClientKey | None:
        return self.by_digest.get(key_digest(key))


def load_key_file(path: Path) -> list[ClientKey]:
    try:
        data = yaml.safe_load(path.read_text())
        return TypeAdapter(list[ClientKey]).validate_python(data or [])
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise ValueError(f"client key file {path}: {exc}") from exc
