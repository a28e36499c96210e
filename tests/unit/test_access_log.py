"""The access log: one line per request with its request id (the caller's X-Request-ID, else a fresh one,
echoed in the response), the decision's id for lookups, and the id on every log line of the request."""
from __future__ import annotations

import json
import logging

import pytest
from fastapi.testclient import TestClient

from cache_core.logs import RequestIdFilter, request_id
from cache_core.service.access_log import incoming_id
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher


@pytest.fixture()
def api(minilm_embedder):
    with TestClient(create_app(build_components(Settings(service={"open_access": True}), RecordingPublisher(), minilm_embedder))) as client:
        yield client


def _access(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "scache.access"]


def test_one_line_per_request_with_the_callers_id_echoed(api, caplog):
    caplog.set_level(logging.INFO, logger="scache.access")
    response = api.post("/v1/lookup", json={"query": "How do I reset my PIN?", "unit_id": "u1"},
                        headers={"X-Request-ID": "gw-123"})
    assert response.status_code == 200 and response.headers["x-request-id"] == "gw-123"
    (line,) = _access(caplog)
    assert line.getMessage() == "POST /v1/lookup 200" and line.request_id == "gw-123"
    assert line.method == "POST" and line.path == "/v1/lookup" and line.status == 200 and line.duration_ms >= 0
    assert line.decision_id == response.json()["request_id"] == response.headers["x-scache-request-id"]


def test_a_fresh_id_when_the_caller_sends_none_or_an_unusable_one(api, caplog):
    caplog.set_level(logging.INFO, logger="scache.access")
    first = api.get("/healthz")
    second = api.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"})
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert all(len(i) == 32 for i in ids) and ids[0] != ids[1]
    assert [r.request_id for r in _access(caplog)] == ids
    refused = api.post("/v1/lookup", json={"query": ""})
    assert refused.status_code == 422 and _access(caplog)[-1].status == 422


def test_incoming_id_takes_only_short_tokens():
    assert incoming_id([(b"x-request-id", b"abc-1.2:3")]) == "abc-1.2:3"
    assert incoming_id([(b"X-Request-Id", b"x" * 200)]) != "x" * 200
    assert len(incoming_id([])) == 32


def test_every_log_line_of_a_request_carries_its_id():
    record = logging.makeLogRecord({"msg": "m"})
    own = logging.makeLogRecord({"msg": "m", "request_id": "decision-1"})
    token = request_id.set("http-1")
    try:
        assert RequestIdFilter().filter(record) and RequestIdFilter().filter(own)
    finally:
        request_id.reset(token)
    assert record.request_id == "http-1"
    assert own.request_id == "decision-1" and own.http_request_id == "http-1"
    outside = logging.makeLogRecord({"msg": "m"})
    RequestIdFilter().filter(outside)
    assert not hasattr(outside, "request_id")


def test_background_logging_writes_in_its_own_thread_with_the_request_id(capfd):
    from cache_core.logs import stop_background_writer, configure_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    configure_logging("INFO", "json", background=True)
    try:
        token = request_id.set("http-9")
        try:
            logging.getLogger("scache.test").info("line %d", 1, extra={"k": "v"})
        finally:
            request_id.reset(token)
        stop_background_writer()  # what the service does once stopped: the queued lines are written
        logging.getLogger("scache.test").info("after %d", 2)  # and later ones directly, not into a dead queue
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    line, after = (json.loads(text) for text in capfd.readouterr().err.strip().splitlines()[-2:])
    assert line["msg"] == "line 1" and line["k"] == "v" and line["request_id"] == "http-9"
    assert after["msg"] == "after 2"
