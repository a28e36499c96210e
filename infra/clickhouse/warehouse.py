"""The embedded warehouse: one process that owns a chdb data directory and serves
the part of ClickHouse's HTTP interface that clickhouse-connect uses.

Clients talk to it exactly as to a ClickHouse server (``cache_core.chclient``), so
pointing ``SCACHE_CLICKHOUSE__URL`` at a real server needs no code change.

    python -m infra.clickhouse.warehouse --data-dir D [--host 127.0.0.1] [--port P]

What it implements, as ClickHouse does: ``GET /ping``; the statement in the
``query`` URL parameter, the POST body, or both (joined by a newline, so
``INSERT ... FORMAT Native`` in the URL takes the data from the body);
``database``, ``default_format``, ``query_id``, ``param_<name>`` bindings for
``{name:Type}`` placeholders, multipart form-encoded queries, and any other URL
parameter as a query setting; request bodies in lz4 (frame) / zstd / gzip /
deflate; compressed responses when ``enable_http_compression=1``; the
``X-ClickHouse-*`` response headers; errors as HTTP 4xx/5xx carrying ClickHouse's
own message and ``X-ClickHouse-Exception-Code``. Not implemented: sessions (each
request is sessionless, so SET / USE statements have no lasting effect), external
data tables, and ClickHouse's native ``compress``/``decompress`` block framing.
"""
from __future__ import annotations

import argparse
import base64
import email.parser
import email.policy
import fcntl
import hmac
import json
import logging
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from infra.clickhouse import codecs, sqltext
from infra.clickhouse.engine import ChdbEngine, ClickHouseError, Outcome

log = logging.getLogger(__name__)

# URL parameters that steer the HTTP exchange rather than the query; never sent as settings.
_TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "query_id", "user", "password", "quota_key", "role",
    "session_id", "session_timeout", "session_check", "buffer_size", "wait_end_of_query",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms", "enable_http_compression",
    "client_protocol_version", "cancel_http_readonly_queries_on_client_close",
    "add_http_cors_header", "http_response_buffer_size", "http_wait_end_of_query",
    "compress", "decompress", "readonly",
})
_NO_LASTING_EFFECT = frozenset({"SET", "USE"})
MAX_BODY_BYTES = 1 << 30


@dataclass
class Auth:
    """The one user the warehouse accepts; with no password configured, anyone is let in."""

    username: str = "default"
    password: str = ""

    def check(self, user: str | None, password: str | None) -> None:
        if not self.password:
            return
        if user == self.username and hmac.compare_digest((password or "").encode(), self.password.encode()):
            return
        raise ClickHouseError.of(
            516, "AUTHENTICATION_FAILED",
            f"{user or 'default'}: Authentication failed: password is incorrect, or there is no user with such name",
        )


@dataclass
class QueryRequest:
    """One HTTP request, reduced to what ClickHouse's HTTP handler looks at."""

    method: str
    params: dict[str, str]
    headers: dict[str, str]
    body: bytes = b""
    form: dict[str, str] = field(default_factory=dict)

    @property
    def query_id(self) -> str:
        return self.params.get("query_id") or str(uuid.uuid4())

    def sql(self) -> bytes:
        """URL query and body (or the form's query field), joined as ClickHouse joins them."""
        query = (self.form.get("query") or self.params.get("query", "")).encode()
        if query and self.body:
            return query + b"\n" + self.body
        return query or self.body

    def credentials(self) -> tuple[str | None, str | None]:
        basic = self.headers.get("authorization", "")
        if basic.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(basic[6:]).decode().partition(":")
                return user, password
            except ValueError:
                return None, None
        if "x-clickhouse-user" in self.headers:
            return self.headers["x-clickhouse-user"], self.headers.get("x-clickhouse-key", "")
        return self.params.get("user"), self.params.get("password")

    def bound_params(self) -> dict[str, str]:
        merged = {**self.params, **self.form}
        return {k[len("param_"):]: v for k, v in merged.items() if k.startswith("param_")}

    def settings(self) -> dict[str, str]:
        return {k: v for k, v in self.params.items() if k not in _TRANSPORT_PARAMS and not k.startswith("param_")}

    def read_only(self) -> bool:
        # ClickHouse: GET implies readonly; so does an explicit readonly=1/2.
        return self.method == "GET" or self.params.get("readonly", "0") not in ("", "0")


def _content_type(fmt: str) -> str:
    name = fmt.lower()
    if name.startswith("json"):
        return "application/json; charset=UTF-8"
    if name.startswith(("tabseparated", "tsv")):
        return "text/tab-separated-values; charset=UTF-8"
    if name.startswith("csv"):
        return "text/csv; charset=UTF-8; header=absent"
    if name.startswith(("pretty", "vertical", "markdown", "values", "template")):
        return "text/plain; charset=UTF-8"
    return "application/octet-stream"


def _parse_form(content_type: str, body: bytes) -> dict[str, str]:
    """Fields of a multipart/form-data body (clickhouse-connect sends long queries and binds so)."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields: dict[str, str] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if part.get_filename():
            raise ClickHouseError.of(48, "NOT_IMPLEMENTED", "External data tables are not supported by this warehouse")
        if name:
            fields[name] = part.get_payload(decode=True).decode("utf-8")
    return fields


class Warehouse:
    """Turns parsed requests into chdb statements and ClickHouse-shaped replies."""

    def __init__(self, engine: ChdbEngine, auth: Auth, display_name: str = "scache-warehouse"):
        self.engine, self.auth, self.display_name = engine, auth, display_name

    def base_headers(self, query_id: str) -> dict[str, str]:
        return {
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": self.engine.timezone,
            "X-ClickHouse-Server-Display-Name": self.display_name,
        }

    def run(self, request: QueryRequest, query_id: str) -> tuple[Outcome, str | None]:
        """Execute the request; returns chdb's outcome and the result format (None: no result set)."""
        self.auth.check(*request.credentials())
        for flag in ("compress", "decompress"):
            if request.params.get(flag, "0") not in ("", "0"):
                raise ClickHouseError.of(48, "NOT_IMPLEMENTED", f"HTTP parameter {flag}=1 (native block compression) is not supported")
        sql = request.sql()
        if not sql.strip():
            raise ClickHouseError.of(62, "SYNTAX_ERROR", "Empty query")
        head = sql[:4096].decode("utf-8", errors="replace")
        kind = sqltext.statement_kind(head)
        text = None if kind == "INSERT" else sql.decode("utf-8", errors="replace")
        self._check_statement(request, kind, text)
        fmt = request.params.get("default_format") or "TabSeparated"
        result_format = (sqltext.output_format(text) or fmt) if kind in sqltext.RESULT_KINDS else None
        if kind in _NO_LASTING_EFFECT:
            return Outcome(b"", 0, 0, 0, 0, 0), None
        database, settings = request.params.get("database") or "default", request.settings()
        insert = sqltext.split_insert(sql) if kind == "INSERT" else None
        if insert is not None:
            statement, insert_format, data = insert
            return self.engine.insert(statement, insert_format, data, database=database, settings=settings), None
        outcome = self.engine.execute(sql, fmt=fmt, database=database, settings=settings, params=request.bound_params())
        return outcome, result_format

    @staticmethod
    def _check_statement(request: QueryRequest, kind: str, text: str | None) -> None:
        if text is not None and sqltext.is_multi_statement(text):
            raise ClickHouseError.of(62, "SYNTAX_ERROR", "Multi-statements are not allowed")
        if request.read_only() and kind not in sqltext.RESULT_KINDS:
            raise ClickHouseError.of(
                164, "READONLY",
                "Cannot execute query in readonly mode. For queries over HTTP, method GET implies readonly. "
                "You should use method POST for modifying queries",
            )

    def error_body(self, error: ClickHouseError) -> bytes:
        text = error.message
        if "(version " not in text:
            text = f"{text} (version {self.engine.version})"
        return (text + "\n").encode()


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler; one thread per connection (ThreadingHTTPServer)."""

    protocol_version = "HTTP/1.1"
    server_version = "scache-warehouse"
    disable_nagle_algorithm = True
    timeout = 600
    warehouse: Warehouse  # set on the subclass built by make_server

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        log.debug(format % args, extra={"client": self.client_address[0]})

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        try:
            body = self._read_body()
        except (ValueError, OSError) as exc:
            self.close_connection = True
            self._send_error(ClickHouseError.of(400, "BAD_REQUEST_PARAMETER", f"Cannot read request body: {exc}"), str(uuid.uuid4()))
            return
        if url.path in ("/ping", "/replicas_status") or (url.path == "/" and method == "GET" and "query" not in params):
            self._send(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
        elif url.path == "/":
            self._query(QueryRequest(method, params, {k.lower(): v for k, v in self.headers.items()}, body))
        else:
            self._send(404, f"There is no handle {url.path}\n\nUse / or /ping for health checks.\n".encode(),
                       {"Content-Type": "text/plain; charset=UTF-8"})

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise ValueError(f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        chunks, total = [], 0
        while True:
            size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise ValueError(f"chunked body exceeds {MAX_BODY_BYTES} bytes")
            chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def _query(self, request: QueryRequest) -> None:
        query_id = request.query_id
        started = time.perf_counter()
        try:
            self._decode_request(request)
            outcome, result_format = self.warehouse.run(request, query_id)
        except ClickHouseError as error:
            self._send_error(error, query_id)
            return
        except Exception as exc:  # never let one request take the server down
            log.exception("unexpected failure", extra={"query_id": query_id})
            self._send_error(ClickHouseError.of(1001, "STD_EXCEPTION", f"{type(exc).__name__}: {exc}"), query_id)
            return
        self._send_result(request, outcome, result_format, query_id)
        log.debug("query done", extra={"query_id": query_id, "ms": round((time.perf_counter() - started) * 1000, 2),
                                       "read_rows": outcome.read_rows, "written_rows": outcome.written_rows})

    @staticmethod
    def _decode_request(request: QueryRequest) -> None:
        encoding = request.headers.get("content-encoding", "")
        try:
            request.body = codecs.decode(encoding, request.body)
        except codecs.UnsupportedEncoding as exc:
            raise ClickHouseError.of(89, "UNKNOWN_COMPRESSION_METHOD", f"Unknown HTTP compression method '{exc}'") from None
        except Exception as exc:  # corrupt frames: lz4 / zstd / zlib each raise their own type
            raise ClickHouseError.of(271, "CANNOT_DECOMPRESS", f"Cannot decompress {encoding} request body: {exc}") from None
        content_type = request.headers.get("content-type", "")
        if content_type.lower().startswith("multipart/form-data"):
            request.form = _parse_form(content_type, request.body)
            request.body = b""

    def _send_result(self, request: QueryRequest, outcome: Outcome, result_format: str | None, query_id: str) -> None:
        headers = self.warehouse.base_headers(query_id)
        headers["X-ClickHouse-Summary"] = json.dumps({
            "read_rows": str(outcome.read_rows), "read_bytes": str(outcome.read_bytes),
            "written_rows": str(outcome.written_rows), "written_bytes": str(outcome.written_bytes),
            "total_rows_to_read": str(outcome.read_rows), "result_rows": "0", "result_bytes": str(len(outcome.body)),
            "elapsed_ns": str(outcome.elapsed_ns),
        })
        if result_format:
            headers["X-ClickHouse-Format"] = result_format
            headers["Content-Type"] = _content_type(result_format)
        else:
            headers["Content-Type"] = "text/plain; charset=UTF-8"
        body = outcome.body
        encoding = codecs.choose(request.headers.get("accept-encoding", "")) if (
            request.params.get("enable_http_compression") == "1" and body) else None
        if encoding:
            body = codecs.encode(encoding, body)
            headers["Content-Encoding"] = encoding
        self._send(200, body, headers)

    def _send_error(self, error: ClickHouseError, query_id: str) -> None:
        log.info("query failed", extra={"query_id": query_id, "code": error.code, "error": error.name})
        headers = self.warehouse.base_headers(query_id)
        headers.update({"X-ClickHouse-Exception-Code": str(error.code), "Content-Type": "text/plain; charset=UTF-8"})
        self._send(error.http_status, self.warehouse.error_body(error), headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # client went away mid-reply
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        # A client hanging up mid-request is routine; anything else is logged, never fatal.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("client connection dropped", extra={"client": client_address[0], "error": repr(exc)})
        else:
            log.warning("request handling failed", exc_info=True, extra={"client": client_address[0]})


def make_server(warehouse: Warehouse, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("WarehouseHandler", (Handler,), {"warehouse": warehouse})
    return _Server((host, port), handler)


def _lock_data_dir(data_dir: Path):
    """Hold an exclusive lock so a second warehouse on the same directory fails clearly."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lock_file = open(data_dir / ".warehouse.lock", "a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"warehouse: {data_dir} is already in use by another warehouse process") from None
    return lock_file


def serve(data_dir: Path, host: str, port: int, auth: Auth) -> None:
    """Run in the foreground until SIGTERM / SIGINT, then shut down cleanly."""
    lock = _lock_data_dir(data_dir)
    started = time.perf_counter()
    engine = ChdbEngine(data_dir)
    server = make_server(Warehouse(engine, auth), host, port)
    stop = threading.Event()

    def request_stop(signum, _frame) -> None:
        if not stop.is_set():
            stop.set()
            log.info("warehouse stopping", extra={"signal": signal.Signals(signum).name})
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    log.info("warehouse listening", extra={
        "url": f"http://{host}:{server.server_address[1]}", "data_dir": str(data_dir),
        "engine_version": engine.version, "startup_ms": round((time.perf_counter() - started) * 1000)})
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        engine.close()
        lock.close()
        log.info("warehouse stopped")


def start_warehouse(data_dir: Path, port: int | None = None, log_path: Path | None = None,
                    timeout_s: float = 60.0, env: dict | None = None):
    """Start the warehouse as a child process and wait until ``/ping`` answers.

    Returns a ``Service`` with ``info["url"]`` (and ``info["data_dir"]``); call ``.stop()``.
    """
    import urllib.request

    from infra.runtime import free_port, spawn, wait_until

    port = port or free_port()
    data_dir = Path(data_dir)
    log_path = log_path or data_dir.parent / f"{data_dir.name}-warehouse.log"
    service = spawn("warehouse", [sys.executable, "-m", "infra.clickhouse.warehouse", "--data-dir", str(data_dir),
                                  "--host", "127.0.0.1", "--port", str(port)], log_path, env=env)
    url = f"http://127.0.0.1:{port}"

    def pinged() -> bool:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
            return response.read() == b"Ok.\n"

    try:
        wait_until(pinged, timeout_s, "warehouse", proc=service.proc, log_path=log_path)
    except BaseException:
        service.stop()
        raise
    service.info.update(url=url, port=port, data_dir=data_dir)
    return service


def main(argv: list[str] | None = None) -> None:
    from cache_core.logs import configure_logging
    from cache_core.settings import settings_or_exit

    settings = settings_or_exit("warehouse")
    default_port = urlsplit(settings.clickhouse.url).port or 8123
    parser = argparse.ArgumentParser(prog="python -m infra.clickhouse.warehouse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=settings.clickhouse.data_dir)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:  # 0: any free port
        parser.error(f"--port must be 0-65535, got {args.port}")
    configure_logging(settings.log_level, settings.log_format)
    auth = Auth(settings.clickhouse.username, settings.clickhouse.password.get_secret_value())
    try:
        serve(args.data_dir, args.host, args.port, auth)
    except OSError as exc:  # port taken, data dir unwritable, ...
        raise SystemExit(f"warehouse: {exc}") from None


if __name__ == "__main__":
    main()
