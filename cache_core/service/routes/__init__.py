"""The service's routes, one module per concern; each holds an ``APIRouter`` named ``router``."""
from cache_core.service.routes import admin, chat, feedback, health, lookup, models, store

ROUTERS = (lookup.router, store.router, feedback.router, chat.router, models.router, admin.router, health.router)
