"""Structured logging: one JSON object per line (or readable console lines)."""
from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import sys
import time
from contextvars import ContextVar
from queue import SimpleQueue

_STANDARD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}

request_id: ContextVar[str | None] = ContextVar("scache_request_id", default=None)
"""The HTTP request being served (cache_core.service.access_log sets it); every log line written while it
runs carries it."""


class RequestIdFilter(logging.Filter):
    """Stamps the current request's id on each record: ``request_id``, or ``http_request_id`` when the
    record already names a (decision's) ``request_id`` of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = request_id.get()
        if current is not None:
            own = getattr(record, "request_id", None)
            if own is None:
                record.request_id = current
            elif own != current:
                record.http_request_id = current
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Anything passed as logger.info("...", extra={...}) becomes a field.
        payload.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD
        )
        base = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname:<7} {record.name}: {record.getMessage()}"
        text = f"{base} {extras}" if extras else base
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _Enqueue(logging.handlers.QueueHandler):
    """Hands records to ``configure_logging``'s writer thread: the request id is stamped here (it is a
    context variable of this thread), the message is rendered (its arguments may change later), and the
    formatting and the write happen in the writer thread."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.msg, record.args = record.getMessage(), None
        return record


_writer: logging.handlers.QueueListener | None = None


def stop_background_writer() -> None:
    """Writes what is queued, stops the writer thread and has the root logger write directly again, so
    a line logged after this is not left in a queue nobody reads. The service calls it at the end of
    its shutdown: uvicorn then re-raises SIGTERM, which ends the process without atexit handlers (the
    shutdown's own lines, "cache service stopped" among them, were lost that way). Also at exit, and
    before a new setup."""
    global _writer
    if _writer is None:
        return
    _writer.stop()
    direct = _writer.handlers[0]
    direct.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [direct if isinstance(h, _Enqueue) else h for h in root.handlers]
    _writer = None


def configure_logging(level: str = "INFO", fmt: str = "console", background: bool = False) -> None:
    """Idempotent root-logger setup for every scache process.

    ``background`` (the HTTP service): lines are formatted and written by a thread of their own, so an
    event loop never formats a line or waits on the write (a write releases the GIL, and the loop then
    waits for it behind the encoder threads; the access log's line was the costliest such wait on the
    loop in bench/front_throughput.py's profile). ``stop_background_writer`` writes what is queued (the
    service calls it once stopped; also at exit); a killed process loses it."""
    global _writer
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    stop_background_writer()
    if background:
        queue: SimpleQueue = SimpleQueue()
        _writer = logging.handlers.QueueListener(queue, handler)
        _writer.start()
        atexit.register(stop_background_writer)
        handler = _Enqueue(queue)
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("kafka", "urllib3", "httpx", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
