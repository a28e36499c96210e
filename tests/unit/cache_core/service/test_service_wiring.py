"""cache_core.service.wiring: components built once, started and stopped in order; routes take them
through dependencies that a test can override."""
from __future__ import annotations

from fastapi.testclient import TestClient

from cache_core.service.app import create_app
from cache_core.service.deps import get_publisher
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher


class _Follower:
    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def start(self):
        self.log.append(f"start {self.name}")
        return self

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")

    def stats(self) -> dict:
        return {"caught_up": True}


class _ClosingPublisher(RecordingPublisher):
    def __init__(self, log: list[str]):
        super().__init__()
        self.log = log

    def publish_event(self, event) -> None:
        self.log.append("event")
        super().publish_event(event)

    def close(self) -> None:
        self.log.append("close publisher")


def test_the_app_starts_and_stops_its_components_once_and_in_order(minilm_embedder):
    log: list[str] = []
    publisher = _ClosingPublisher(log)
    components = build_components(Settings(service={"open_access": True}), publisher, minilm_embedder, expiry_sweep_s=None, close_publisher=True)
    for name in ("feedback", "entries", "control"):  # inserted out of order: started control first
        components.followers[name] = _Follower(name, log)
    components.start()  # as serve() does before uvicorn; the lifespan's start is then a no-op
    with TestClient(create_app(components)) as client:
        assert client.post("/v1/lookup", json={"query": "hello there", "unit_id": "u"}).status_code == 200
    assert log[:3] == ["start control", "start entries", "start feedback"]
    # the lookup's event was published before the followers stopped and the publisher closed
    assert log[3:] == ["event", "stop control", "stop entries", "stop feedback", "close publisher"]
    components.stop()  # idempotent
    assert log.count("close publisher") == 1


class _DownPublisher(RecordingPublisher):
    def publish_feedback(self, feedback) -> None:
        raise RuntimeError("publisher closed")


def test_a_route_dependency_can_be_overridden(minilm_embedder):
    app = create_app(build_components(Settings(service={"open_access": True}), RecordingPublisher(), minilm_embedder, expiry_sweep_s=None))
    app.dependency_overrides[get_publisher] = _DownPublisher
    with TestClient(app) as client:
        answer = client.post("/v1/feedback", json={"request_id": "r1", "verdict": "wrong"})
    assert answer.status_code == 503 and answer.json() == {"detail": "feedback could not be queued"}
