"""The FastAPI app around built components: ``create_app(components)``.

``cache_core.service.wiring`` builds the components (once, from the settings); the app's lifespan
starts and stops them; the routes (``cache_core.service.routes``, one module per concern) receive what
they use through the dependencies of ``cache_core.service.deps``.
"""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from cache_core.service.access_log import AccessLog
from cache_core.service.errors import add_error_handlers
from cache_core.service.routes import ROUTERS
from cache_core.service.transport import TransportMiddleware
from cache_core.service.wiring import Components


def create_app(components: Components) -> FastAPI:
    """The HTTP service of ``components``; it starts them when it starts (a no-op if the caller
    already did) and stops them when it shuts down (uvicorn re-raises SIGTERM after it exits, so
    code after ``uvicorn.run`` is not a safe place to flush)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        components.start()
        try:
            yield
        finally:
            await components.upstream.aclose()
            components.stop()

    app = FastAPI(title="scache", version="0.1.0", lifespan=lifespan)
    app.state.components = components
    add_error_handlers(app)
    app.add_middleware(TransportMiddleware,
                       max_body_bytes=int(components.settings.service.max_request_mib * 1024 * 1024))
    # outermost: a 413 from the size limit gets its request id, log line (and trace) too
    app.add_middleware(AccessLog, tracing=components.tracing)
    for router in ROUTERS:
        app.include_router(router)
    return app
