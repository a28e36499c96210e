"""FastAPI dependencies: what a route needs, taken from the app's ``Components``
(``cache_core.service.wiring``). Tests override them with ``app.dependency_overrides[get_cache] = ...``.

Every dependency here (and ``auth.get_caller``) is ``async def`` although none awaits: FastAPI runs a
plain ``def`` dependency in its thread pool, a thread hop per dependency per request, which cost the
lookup route most of its throughput under concurrency (bench/front_throughput.py). The hot routes
(lookup, chat) take one dependency instead, ``auth.AccessDep``: every dependency costs its solving
on every request."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from cache_core.cache import SemanticCache
from cache_core.registry import ExperimentRegistry
from cache_core.service.metrics import ServiceMetrics
from cache_core.service.wiring import Components, Publisher
from cache_core.settings import Settings


async def get_components(request: Request) -> Components:
    return request.app.state.components


ComponentsDep = Annotated[Components, Depends(get_components)]


async def get_cache(components: ComponentsDep) -> SemanticCache:
    return components.cache


async def get_registry(components: ComponentsDep) -> ExperimentRegistry:
    return components.registry


async def get_metrics(components: ComponentsDep) -> ServiceMetrics:
    return components.metrics


async def get_publisher(components: ComponentsDep) -> Publisher:
    return components.publisher


async def get_settings(components: ComponentsDep) -> Settings:
    return components.settings


CacheDep = Annotated[SemanticCache, Depends(get_cache)]
RegistryDep = Annotated[ExperimentRegistry, Depends(get_registry)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
PublisherDep = Annotated[Publisher, Depends(get_publisher)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
