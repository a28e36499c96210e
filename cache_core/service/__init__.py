"""The cache's HTTP service: ``wiring`` builds the components, ``app.create_app`` serves them,
``python -m cache_core.service`` runs it."""
