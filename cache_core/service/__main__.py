"""Run the cache service: ``python -m cache_core.service [--spool-dir DIR] [--instance-id ID]``.

Loads the model once, restores the cache from settings.cache.snapshot_dir
(write-ahead log + snapshots; one directory per instance), starts the event
publisher (with heartbeats), the control-topic listener and (settings.cache.replicate)
the entries follower that shares entries between replicas, the feedback follower
(a "wrong" verdict taken by any replica removes the entry that served it; it resumes from the
hits and offsets a graceful stop saved), serves HTTP with uvicorn on settings.service.host/port,
and on SIGTERM/SIGINT stops listening (the feedback follower saving its state), flushes and
closes the publisher, then writes a final snapshot.
"""
from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading
from pathlib import Path

import uvicorn
import yaml

from infra.runtime import scache_home

log = logging.getLogger("cache_core.service")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cache_core.service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spool-dir", type=Path, default=None,
                        help="where undeliverable events wait (default: SCACHE_HOME/spool/cache-PORT)")
    parser.add_argument("--instance-id", default=None,
                        help="instance id in events (default: HOSTNAME:PORT)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from cache_core.logs import configure_logging
    from cache_core.settings import settings_or_exit

    settings = settings_or_exit("cache_core.service")  # a bad SCACHE_* value: one line, exit 2
    configure_logging(settings.log_level, settings.log_format)
    instance_id = args.instance_id or f"{socket.gethostname()}:{settings.service.port}"
    spool_dir = args.spool_dir or scache_home() / "spool" / f"cache-{settings.service.port}"
    return serve(settings, instance_id, spool_dir)


def serve(settings, instance_id: str, spool_dir: Path) -> int:
    from cache_core import heap

    heap.pin_mmap_threshold()  # before the model loads: the encoder's freed buffers go back to the OS
    from cache_core.control import ControlListener
    from cache_core.embedder import EmbedderError, load_embedder
    from cache_core.feedback import FeedbackFollower
    from cache_core.index import set_search_threads
    from cache_core.persistence import Persistence, PersistenceError
    from cache_core.publisher import MIB, EventPublisher
    from cache_core.service.app import create_app

    from cache_core.registry import ExperimentRegistry

    set_search_threads(1)
    try:
        registry = ExperimentRegistry.from_file(settings.experiments_file)
        embedder = load_embedder(settings.cache)
    except (EmbedderError, ValueError, yaml.YAMLError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    try:
        service = settings.service
        publisher = EventPublisher(settings.kafka, spool_dir=spool_dir, instance_id=instance_id,
                                   queue_size=service.publish_queue_size, max_spool_bytes=service.spool_max_mib * MIB,
                                   send_timeout_s=service.publish_timeout_s)
    except OSError as exc:  # the spool directory cannot be made (a file there, no permission)
        log.error("cannot start: spool directory %s: %s", spool_dir, exc)
        return 2
    listener: list = []
    stopped = threading.Event()

    def shutdown() -> None:
        if stopped.is_set():
            return
        stopped.set()
        for running in listener:
            running.stop()
        publisher.close()
        log.info("cache service stopped", extra={"publisher": publisher.stats()})

    persistence = None
    if settings.cache.persist:
        persistence = Persistence(settings.cache.snapshot_dir, fsync=settings.cache.wal_fsync,
                                  interval_s=settings.cache.snapshot_interval_s,
                                  max_log_records=settings.cache.snapshot_max_log_records)
    try:
        try:
            app = create_app(settings, publisher, embedder, registry=registry,
                             instance_id=instance_id, shutdown_hooks=[shutdown],
                             persistence=persistence, replicate=settings.cache.replicate)
        except (PersistenceError, OSError) as exc:  # OSError: e.g. snapshot_dir is a file
            log.error("cannot start: %s", exc)
            return 2
        listener.append(ControlListener(settings.kafka, on_record=app.state.registry.apply_record))
        listener[0].start()
        app.state.followers["control"] = listener[0]  # /readyz: not before the live config is known
        if app.state.entry_follower is not None:  # entries the other replicas store
            listener.append(app.state.entry_follower.start())
        if settings.cache.feedback_memory:  # verdicts other replicas took on hits served here
            app.state.feedback_follower = FeedbackFollower(
                settings.kafka, app.state.cache, state_dir=persistence.directory if persistence else None,
                max_age_s=settings.cache.feedback_resume_max_age_s,
                checkpoint_s=settings.cache.feedback_checkpoint_s).start()
            listener.append(app.state.feedback_follower)
            # /readyz: resumed after a graceful stop, not before the verdicts posted meanwhile are applied
            app.state.followers["feedback"] = app.state.feedback_follower
        publisher.start_heartbeats(settings.cache.heartbeat_interval_s)
        log.info("cache service starting", extra={"host": settings.service.host,
                                                  "port": settings.service.port,
                                                  "instance_id": instance_id})
        uvicorn.run(app, host=settings.service.host, port=settings.service.port,
                    log_level=settings.log_level.lower(), access_log=False, log_config=None)
    finally:
        shutdown()  # also when uvicorn could not start (e.g. port taken)
    return 0


if __name__ == "__main__":
    sys.exit(main())
