"""docs/metrics.md names every metric family a fully equipped replica exports on /metrics, with its type, and
nothing else; the access log writes one line per request with the request id."""
from __future__ import annotations

import re

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from cache_core.state.feedback import FeedbackFollower
from cache_core.state.persistence import Persistence
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import PROJECT_ROOT, KafkaSettings, Settings
from tests.unit.cache_core.helpers import RecordingPublisher


def _exported(minilm_embedder, tmp_path) -> dict[str, str]:
    """Family name -> type, from a replica with persistence and replication, after some traffic."""
    app = create_app(build_components(Settings(service={"open_access": True}), RecordingPublisher(), minilm_embedder,
                                      persistence=Persistence(tmp_path / "snap"),
                                      replicate=True, instance_id="docs"))
    components = app.state.components
    components.feedback_follower = FeedbackFollower(KafkaSettings(), components.cache)  # as the service sets it
    with TestClient(app) as client:
        client.post("/v1/store", json={"query": "How do I reset my password?", "answer": "Link.", "unit_id": "u"})
        client.post("/v1/lookup", json={"query": "how can I reset my password", "unit_id": "u"})
        client.post("/v1/feedback", json={"request_id": "r", "verdict": "correct"})
        text = client.get("/metrics").text
    return {f.name: f.type for f in text_string_to_metric_families(text) if not f.name.endswith("_created")}


# Exported only under conditions the fixture does not create (batched ANN checks, shadow checks on).
CONDITIONAL = {"scache_ann_checks_dropped", "scache_ann_checks_batched", "scache_ann_check_batches",
               "scache_ann_check_cpu_seconds", "scache_ann_check_pending", "scache_shadow_checks",
               "scache_shadow_upstream_calls", "scache_shadow_upstream_seconds", "scache_shadow_waiting"}


def test_every_exported_metric_is_documented_with_its_type(minilm_embedder, tmp_path):
    exported = _exported(minilm_embedder, tmp_path)
    doc = (PROJECT_ROOT / "docs" / "metrics.md").read_text()
    documented = dict(re.findall(r"^\| `((?:scache|process)_\w+)` \| (counter|gauge|histogram) \|", doc, flags=re.M))
    listed = set(re.findall(r"^\| `((?:scache|process)_\w+)` \|", doc, flags=re.M))
    assert {"scache_publisher_spilled", "scache_persistence_fsyncs", "scache_replication_messages",
            "scache_feedback_follower_caught_up", "process_cpu_seconds", "process_resident_memory_bytes"} <= set(exported)
    missing = sorted(set(exported) - listed)
    assert not missing, f"docs/metrics.md does not name {missing}"
    assert listed == set(documented), f"listed without a type: {sorted(listed - set(documented))}"
    wrong = {name: (kind, documented[name]) for name, kind in exported.items()
             if name in documented and documented[name] != kind}
    assert not wrong, f"documented with another type (exported, documented): {wrong}"
    stale = sorted(set(documented) - set(exported) - CONDITIONAL)
    assert not stale, f"docs/metrics.md names metrics the service does not export: {stale}"


def test_what_only_grows_is_a_counter(minilm_embedder, tmp_path):
    exported = _exported(minilm_embedder, tmp_path)
    for name in ("scache_persistence_log_records", "scache_persistence_fsyncs", "scache_persistence_fsync_seconds",
                 "scache_persistence_snapshots", "process_cpu_seconds"):
        assert exported[name] == "counter", name
    assert exported["scache_persistence_last_snapshot_timestamp_seconds"] == "gauge"
