"""The cache's HTTP service: ``create_app`` builds it, ``python -m cache_core.service`` runs it."""
from cache_core.service.app import create_app

__all__ = ["create_app"]
