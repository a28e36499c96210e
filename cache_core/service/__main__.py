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
from pathlib import Path

import uvicorn
import yaml

from cache_core.runtime import scache_home

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
    from cache_core.logs import configure_logging, stop_background_writer
    from cache_core.settings import settings_or_exit

    settings = settings_or_exit("cache_core.service")  # a bad SCACHE_* value: one line, exit 2
    configure_logging(settings.log_level, settings.log_format, background=True)
    instance_id = args.instance_id or f"{socket.gethostname()}:{settings.service.port}"
    spool_dir = args.spool_dir or scache_home() / "spool" / f"cache-{settings.service.port}"
    try:
        return serve(settings, instance_id, spool_dir)
    finally:  # e.g. a "cannot start" line: written before exit waits for the other threads
        stop_background_writer()


def serve(settings, instance_id: str, spool_dir: Path) -> int:
    from cache_core import heap

    heap.pin_mmap_threshold()  # before the model loads: the encoder's freed buffers go back to the OS
    from cache_core.embedding.embedder import EmbedderError
    from cache_core.store.faiss import set_search_threads
    from cache_core.state.persistence import PersistenceError
    from cache_core.service.app import create_app
    from cache_core.service.wiring import Components
    from cache_core.tracing import TracingError

    set_search_threads(1)
    try:
        components = Components.for_service(settings, instance_id, spool_dir)
    except (EmbedderError, TracingError, ValueError, yaml.YAMLError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    except OSError as exc:  # the spool directory cannot be made (a file there, no permission)
        log.error("cannot start: spool directory %s: %s", spool_dir, exc)
        return 2
    try:
        try:
            components.start()  # restores the cache: a broken snapshot stops here, before serving
        except (PersistenceError, OSError) as exc:  # OSError: e.g. snapshot_dir is a file
            log.error("cannot start: %s", exc)
            return 2
        log.info("cache service starting", extra={"host": settings.service.host, "port": settings.service.port,
                                                  "instance_id": instance_id})
        uvicorn.run(create_app(components, freeze=True), host=settings.service.host, port=settings.service.port,
                    log_level=settings.log_level.lower(), access_log=False, log_config=None)
    finally:
        components.stop()  # also when uvicorn could not start (e.g. port taken); a no-op after the lifespan's
    return 0


if __name__ == "__main__":
    sys.exit(main())
