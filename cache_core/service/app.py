"""The FastAPI app around built components: ``create_app(components)``.

``cache_core.service.wiring`` builds the components (once, from the settings); the app's lifespan
starts and stops them; the routes (``cache_core.service.routes``, one module per concern) receive what
they use through the dependencies of ``cache_core.service.deps``.
"""
from __future__ import annotations

import gc
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from cache_core.logs import stop_background_writer
from cache_core.service.access_log import AccessLog
from cache_core.service.errors import add_error_handlers
from cache_core.service.fast_lookup import FastLookup
from cache_core.service.routes import ROUTERS
from cache_core.service.transport import TransportMiddleware
from cache_core.service.wiring import Components

log = logging.getLogger(__name__)


def freeze_heap() -> None:
    """Move everything alive now (the restored entries, their indexes, the loaded modules) out of the
    garbage collector's reach: a full collection then walks only what was made since. Without it,
    one full collection every few seconds under load walked the whole heap, 100-390 ms with the
    event loop stopped (10^4 entries, the 2-core machine loaded; bench/front_throughput.py's
    ``stalls``), and that pause was the p99 of every request in flight. Entries stored later are
    still collected as usual."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("heap frozen", extra={"objects": gc.get_freeze_count(),
                                    "ms": round((time.perf_counter() - started) * 1000, 1)})


def create_app(components: Components, freeze: bool = False) -> FastAPI:
    """The HTTP service of ``components``; it starts them when it starts (a no-op if the caller
    already did) and stops them when it shuts down (uvicorn re-raises SIGTERM after it exits, so
    code after ``uvicorn.run`` is not a safe place to flush). ``freeze``: once started, the heap is
    frozen (``freeze_heap``; what ``python -m cache_core.service`` does; not for a process that builds
    many apps, such as a test session, whose objects would never be collected)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        components.start()
        if freeze:
            freeze_heap()
        try:
            yield
        finally:
            await components.upstream.aclose()
            components.stop()
            stop_background_writer()  # uvicorn re-raises SIGTERM next: queued lines written now or never

    app = FastAPI(title="scache", version="0.1.0", lifespan=lifespan)
    app.state.components = components
    add_error_handlers(app)
    # innermost of these: a well-formed lookup is answered without FastAPI's request handling
    app.add_middleware(FastLookup, service=app)
    app.add_middleware(TransportMiddleware,
                       max_body_bytes=int(components.settings.service.max_request_mib * 1024 * 1024))
    # outermost: a 413 from the size limit gets its request id, log line (and trace) too
    app.add_middleware(AccessLog, tracing=components.tracing)
    for router in ROUTERS:
        app.include_router(router)
    return app
