"""Admin API (``Authorization: Bearer <SCACHE_SERVICE__ADMIN_TOKEN>``): push an experiment config
through the control topic, clear a namespace, purge a namespace's answers by provenance."""
from __future__ import annotations

import hmac
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from cache_core.records import EntryMatch
from cache_core.publish.control_topic import ControlLost, ControlUnconfirmed
from cache_core.events import ControlMessage
from cache_core.experiments import parse_experiment_json
from cache_core.registry import UnknownExperiment
from cache_core.service.auth import presented_key
from cache_core.service.deps import CacheDep, ComponentsDep, MetricsDep, RegistryDep, SettingsDep
from cache_core.service.errors import Refused, errors_detail
from cache_core.service.schemas import PurgeRequest

log = logging.getLogger(__name__)

# A namespace as stored (schemas.LookupRequest.namespace): up to 128 characters, "/" included
# (the ``path`` convertor takes "a/b", sent as a%2Fb; else such a namespace could not be cleared).
AdminNamespace = Annotated[str, Path(min_length=1, max_length=128)]


async def require_admin(settings: SettingsDep, components: ComponentsDep, request: Request) -> None:
    """Raises ``Refused`` (401/403) unless the request carries the admin token (or a client key with
    the admin right)."""
    key, _ = presented_key(request)
    client = components.keys.find(key) if key else None
    if client is not None and "admin" in client.rights:
        return
    token = settings.service.admin_token
    if token is None:
        raise Refused(JSONResponse(status_code=403, content={
            "detail": "admin API disabled: no admin token configured (SCACHE_SERVICE__ADMIN_TOKEN)"}))
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Refused(JSONResponse(status_code=401, headers={"www-authenticate": "Bearer"},
                                       content={"detail": "admin token required: Authorization: Bearer <token>"}))
    if not hmac.compare_digest(given.strip().encode(), token.get_secret_value().encode()):
        raise Refused(JSONResponse(status_code=403, content={"detail": "invalid admin token"}))


router = APIRouter(dependencies=[Depends(require_admin)])


@router.put("/v1/admin/experiments/{experiment_id}")
async def put_experiment(experiment_id: str, request: Request, components: ComponentsDep,
                         registry: RegistryDep, metrics: MetricsDep):
    try:
        config = parse_experiment_json(await request.body())
    except ValidationError as exc:
        return JSONResponse(status_code=422, content={"detail": errors_detail(exc.errors(include_url=False))})
    if config.experiment_id != experiment_id:
        return JSONResponse(status_code=422, content={
            "detail": f"body experiment_id {config.experiment_id!r} does not match the path"})
    try:
        current = registry.get(experiment_id).version
    except UnknownExperiment:
        current = 0
    if config.version <= current:
        return JSONResponse(status_code=409, content={
            "detail": f"version {config.version} is not higher than {current} in force"})
    actor = request.headers.get("x-scache-actor", "admin-api")
    message = ControlMessage(experiment=config, actor=actor, reason=request.headers.get("x-scache-reason", ""))
    try:
        # Publish first: a change other instances never hear of must not apply here alone.
        components.control_publisher(message)
    except ControlLost as exc:  # a concurrent push took this version: it applies nowhere
        log.warning("admin config push lost a race", extra={"experiment_id": experiment_id,
                                                            "version": config.version})
        return JSONResponse(status_code=409, content={"detail": f"{exc}; reload and try again"})
    except ControlUnconfirmed as exc:
        log.exception("control publish unconfirmed", extra={"experiment_id": experiment_id})
        return JSONResponse(status_code=503, content={
            "detail": f"{exc}; not applied here, GET /v1/experiments shows what is in force once "
                      "the topic is readable"})
    except Exception as exc:
        log.exception("control publish failed", extra={"experiment_id": experiment_id})
        return JSONResponse(status_code=503, content={
            "detail": f"control topic unavailable, config not applied: {type(exc).__name__}"})
    registry.apply(message)  # False when this instance's control listener installed it first
    in_force = registry.get(experiment_id).version
    metrics.admin.labels("put_experiment").inc()
    return {"applied": in_force >= config.version, "published": True, "experiment_id": experiment_id,
            "version": in_force}


@router.delete("/v1/admin/namespaces/{namespace:path}")
def delete_namespace(namespace: AdminNamespace, cache: CacheDep, metrics: MetricsDep):
    removed = cache.clear_namespace(namespace)
    metrics.admin.labels("clear_namespace").inc()
    log.info("namespace cleared", extra={"namespace": namespace, "removed": removed})
    return {"namespace": namespace, "removed": removed}


@router.post("/v1/admin/namespaces/{namespace:path}/purge")
def purge_namespace(namespace: AdminNamespace, body: PurgeRequest, cache: CacheDep, metrics: MetricsDep):
    """Remove the answers of a provenance source (a document that changed), optionally of one
    version, or of one question, from every store of the namespace, on every replica."""
    match = EntryMatch(body.provenance_source, body.provenance_version, body.query)
    removed = cache.purge(namespace, match)
    metrics.admin.labels("purge").inc()
    log.info("namespace purged", extra={"namespace": namespace, "removed": removed, **body.model_dump()})
    return {"namespace": namespace, "removed": removed}
