"""Fixtures that start real services live in tests/fixtures/; they are registered here."""
pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.warehouse",
    "tests.fixtures.flink",
    "tests.fixtures.cache",
]
