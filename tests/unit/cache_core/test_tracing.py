"""OpenTelemetry spans of the request path, read back with the SDK's in-memory exporter: off by default,
one trace per HTTP request (following a caller's traceparent), the lookup span carrying the decision's
request id and the nearest similarity, embed / search / decide (judge) under it, the upstream call and the
publish (from the event thread) in the same trace, a store's span; a missing OTLP exporter is a one-line
start error."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings, TracingSettings
from cache_core.tracing import NO_SPAN, OFF, TracingError, build_tracing
from infra.runtime import REPO_ROOT
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.chat_stub import StubUpstream

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def upstream():
    with StubUpstream() as server:
        yield server


@pytest.fixture()
def traced(minilm_embedder, upstream):
    spans = InMemorySpanExporter()
    settings = Settings(service={"open_access": True, "upstream_url": f"http://127.0.0.1:{upstream.port}/v1"})
    components = build_components(settings, RecordingPublisher(), minilm_embedder, expiry_sweep_s=None,
                                  tracing=build_tracing(settings.tracing, "replica-1", exporter=spans))
    with TestClient(create_app(components)) as client:
        client.spans = spans
        yield client
    components.tracing.shutdown()


def finished(client) -> dict[str, list]:
    assert client.app.state.components.cache.flush_events()  # the publish spans end in the event thread
    by_name: dict[str, list] = {}
    for span in client.spans.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    return by_name


def test_off_by_default_and_free():
    assert Settings().tracing.exporter == "none"
    tracing = build_tracing(TracingSettings())
    assert tracing is OFF and not tracing.enabled
    assert tracing.span("scache.lookup") is NO_SPAN and tracing.capture() is None
    with tracing.span("scache.embed") as span:
        span.set_attribute("ignored", 1)


def test_a_lookup_is_one_trace_with_its_request_id_and_nearest_similarity(traced):
    traced.post("/v1/store", json={"query": "How do I reset my card PIN?", "answer": "In the app.", "unit_id": "u1"})
    stored = finished(traced)
    (store,) = stored["scache.store"]
    assert store.attributes["scache.stored"] == 1 and store.parent.span_id == stored["POST /v1/store"][0].context.span_id
    assert stored["scache.embed"][0].parent.span_id == store.context.span_id
    traced.spans.clear()
    response = traced.post("/v1/lookup", json={"query": "I forgot my card PIN", "unit_id": "u1"},
                           headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01", "x-request-id": "req-42"})
    body = response.json()
    spans = finished(traced)
    (root,) = spans["POST /v1/lookup"]
    (lookup,) = spans["scache.lookup"]
    assert format(root.context.trace_id, "032x") == TRACE_ID  # the caller's trace, followed
    assert root.attributes["scache.http_request_id"] == "req-42" == response.headers["x-request-id"]
    assert root.attributes["http.response.status_code"] == 200
    assert lookup.parent.span_id == root.context.span_id
    assert lookup.attributes["scache.request_id"] == body["request_id"]
    assert lookup.attributes["scache.similarity"] == pytest.approx(body["similarity"])
    assert lookup.attributes["scache.decision"] == body["decision"]
    assert lookup.attributes["scache.threshold"] == body["threshold"] and lookup.attributes["scache.arm"] == body["arm"]
    for name in ("scache.embed", "scache.search", "scache.decide"):
        (child,) = spans[name]
        assert child.parent.span_id == lookup.context.span_id, name
    assert spans["scache.search"][0].attributes["scache.candidates"] >= 1
    (publish,) = spans["scache.publish"]  # ended in the event thread, parented across it
    assert publish.parent.span_id == lookup.context.span_id
    assert publish.attributes["scache.request_id"] == body["request_id"]
    assert {s.resource.attributes["service.instance.id"] for s in traced.spans.get_finished_spans()} == {"replica-1"}


def test_a_chat_miss_traces_the_upstream_call_in_the_same_trace(traced, upstream):
    response = traced.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "trace me please"}],
                                                         "user": "u2"})
    assert response.status_code == 200 and response.headers["x-scache-decision"] == "miss"
    spans = finished(traced)
    (root,) = spans["POST /v1/chat/completions"]
    (call,) = spans["scache.upstream"]
    assert call.parent.span_id == root.context.span_id and call.context.trace_id == root.context.trace_id
    assert call.attributes["scache.request_id"] == response.headers["x-scache-request-id"]
    assert call.attributes["scache.upstream_status"] == 200 and call.end_time - call.start_time > 0
    assert spans["scache.lookup"][0].context.trace_id == root.context.trace_id
    assert root.attributes["scache.request_id"] == response.headers["x-scache-request-id"]


OTLP_MODULES = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                "opentelemetry.exporter.otlp.proto.grpc.trace_exporter")


def test_console_runs_and_otlp_without_its_package_says_which(monkeypatch):
    console = build_tracing(TracingSettings(exporter="console"))
    assert console.enabled
    console.shutdown()
    for module in OTLP_MODULES:  # as on an install without the otel extra
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(TracingError, match="opentelemetry-exporter-otlp-proto-http"):
        build_tracing(TracingSettings(exporter="otlp"))


def test_spans_reach_an_otlp_http_receiver():
    """The otel extra's exporter, to a real HTTP endpoint on loopback (as a collector's /v1/traces)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    bodies = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        tracing = build_tracing(TracingSettings(exporter="otlp", otlp_endpoint=endpoint), instance_id="r1")
        with tracing.span("scache.lookup", {"scache.similarity": 0.93}):
            pass
        tracing.shutdown()  # flushes the batch
    finally:
        server.shutdown()
    (path, body), = bodies
    request = ExportTraceServiceRequest.FromString(body)
    spans = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    assert path == "/v1/traces" and [span.name for span in spans] == ["scache.lookup"]
    assert {a.key: a.value.double_value for a in spans[0].attributes} == {"scache.similarity": 0.93}


def test_the_service_refuses_to_start_with_an_exporter_it_lacks(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCACHE_")}
    env.update(PYTHONPATH=str(REPO_ROOT), SCACHE_HOME=str(tmp_path), SCACHE_TRACING__EXPORTER="otlp")
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in OTLP_MODULES)
    start = (f"import runpy, sys; {blocked}; sys.argv = ['cache_core.service', '--spool-dir', {str(tmp_path / 'spool')!r}]; "
             "runpy.run_module('cache_core.service', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", start], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "opentelemetry-exporter-otlp-proto-http" in done.stderr and "Traceback" not in done.stderr


class FakeEncoder:
    """The judge tests' hashed-word vectors as an Embedder."""

    dim = 16

    def encode_with_norms(self, texts):
        from tests.unit.cache_core.decision.test_judge import fake_encode

        vecs = fake_encode(list(texts)).astype("float32")
        return vecs, np.ones(len(vecs), dtype="float32")

    def encode(self, texts):
        return self.encode_with_norms(texts)[0]


def test_a_judged_arm_has_a_judge_span_inside_decide(tmp_path):
    from cache_core.cache import SemanticCache
    from cache_core.decision.judge import shelf_judges
    from cache_core.decision.judge_model import JudgeShelf
    from cache_core.decision.judge_train import train
    from cache_core.decision.rule import HitRule
    from cache_core.experiments import ArmConfig, JudgeConfig
    from cache_core.registry import ExperimentRegistry
    from tests.unit.cache_core.decision.test_judge import fake_encode, fake_tokens, labelled_pairs
    from tests.unit.cache_core.helpers import experiment

    train(labelled_pairs(), [], fake_encode, fake_tokens, version="t1", encoder="fake", seed=3).save(tmp_path)
    spans = InMemorySpanExporter()
    tracing = build_tracing(TracingSettings(), exporter=spans)
    exp = experiment(ArmConfig(name="a", threshold=0.1, judge=JudgeConfig(version="t1")))
    cache = SemanticCache(FakeEncoder(), ExperimentRegistry({exp.experiment_id: exp}), tracing=tracing,
                          hit_rule=HitRule(judges=shelf_judges(JudgeShelf(tmp_path, tokens=lambda: fake_tokens))))
    cache.store("how do i reset my card", "Use the app.", unit_id="u1")
    spans.clear()
    result = cache.lookup("how can i reset my card", unit_id="u1")
    by_name = {span.name: span for span in spans.get_finished_spans()}
    judge, decide, lookup = by_name["scache.judge"], by_name["scache.decide"], by_name["scache.lookup"]
    assert judge.parent.span_id == decide.context.span_id and decide.parent.span_id == lookup.context.span_id
    assert judge.attributes["scache.judge_version"] == "t1" == result.judge_version
    assert judge.attributes["scache.judge_probability"] == pytest.approx(result.judge_probability)
    assert lookup.attributes["scache.similarity"] == pytest.approx(result.similarity)
    tracing.shutdown()
