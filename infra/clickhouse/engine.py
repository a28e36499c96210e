"""The chdb session behind the warehouse, with ClickHouse's per-request semantics.

A chdb session is one stateful ClickHouse instance, but every HTTP request must
see only its own database and settings (like a sessionless ClickHouse HTTP
request). So requests run one at a time under a lock, and before each one the
session's current database and changed settings are brought in line with that
request, issuing only the USE / SET statements that differ from the last one.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from chdb import session as chdb_session

log = logging.getLogger(__name__)

_CODE = re.compile(r"Code: (\d+)\.")
_NAME = re.compile(r"\(([A-Z][A-Z0-9_]+)\)(?: \(version [^)]*\))?\s*\Z")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# ClickHouse's exceptionCodeToHTTPStatus, by error name (names are stable, numbers too).
_HTTP_STATUS_BY_NAME = {
    **dict.fromkeys(
        ("DUPLICATE_COLUMN", "ILLEGAL_COLUMN", "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE",
         "TOO_DEEP_AST", "TOO_BIG_AST", "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA",
         "TYPE_MISMATCH", "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE", "UNKNOWN_QUERY_PARAMETER",
         "BAD_QUERY_PARAMETER", "BAD_REQUEST_PARAMETER", "CANNOT_DECOMPRESS"), 400),
    "REQUIRED_PASSWORD": 401,
    **dict.fromkeys(("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "ACCESS_DENIED", "READONLY"), 403),
    **dict.fromkeys(
        ("UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
         "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION",
         "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE"), 404),
    "HTTP_LENGTH_REQUIRED": 411,
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    **dict.fromkeys(("SOCKET_TIMEOUT", "CANNOT_OPEN_FILE"), 503),
}


class ClickHouseError(Exception):
    """A ClickHouse exception: numeric code, symbolic name and the server's message text."""

    def __init__(self, code: int, name: str, message: str):
        super().__init__(message)
        self.code, self.name, self.message = code, name, message

    @classmethod
    def of(cls, code: int, name: str, text: str) -> "ClickHouseError":
        """An error raised by the warehouse itself, worded the way ClickHouse words its own."""
        return cls(code, name, f"Code: {code}. DB::Exception: {text}. ({name})")

    @classmethod
    def from_chdb(cls, exc: Exception) -> "ClickHouseError":
        text = str(exc).strip()
        code, name = _CODE.search(text), _NAME.search(text)
        if code is None:
            return cls.of(1001, "STD_EXCEPTION", text or type(exc).__name__)
        # Streaming wrappers prefix their own words; ClickHouse's message starts at "Code:".
        return cls(int(code.group(1)), name.group(1) if name else "UNKNOWN_EXCEPTION", text[code.start():])

    @property
    def http_status(self) -> int:
        if self.name.startswith("CANNOT_PARSE_"):
            return 400
        return _HTTP_STATUS_BY_NAME.get(self.name, 500)


@dataclass(frozen=True)
class Outcome:
    """What one statement returned: the formatted bytes and chdb's counters."""

    body: bytes
    read_rows: int
    read_bytes: int
    written_rows: int
    written_bytes: int
    elapsed_ns: int


def _string_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _backquoted(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


class ChdbEngine:
    """One chdb session on ``data_dir``; ``execute`` is safe to call from many threads."""

    def __init__(self, data_dir: Path):
        data_dir.mkdir(parents=True, exist_ok=True)
        self._session = chdb_session.Session(str(data_dir))
        self._lock = threading.Lock()
        self._database = "default"
        self._changed: dict[str, str] = {}
        version, tz = self._raw("SELECT version(), timezone()").decode().rstrip("\n").split("\t")
        self.version, self.timezone = version, tz
        self.known_settings = frozenset(self._raw("SELECT name FROM system.settings").decode().split())

    def _raw(self, sql: str) -> bytes:
        return self._session.query(sql, "TabSeparated").bytes()

    def execute(self, sql: bytes, *, fmt: str, database: str = "default",
                settings: dict[str, str] | None = None, params: dict[str, str] | None = None) -> Outcome:
        """Run one statement as ClickHouse would for a sessionless HTTP request."""
        with self._request(database, settings):
            started = time.perf_counter_ns()
            try:
                result = self._session.query(sql, fmt, params=params or {})
            except Exception as exc:  # chdb raises ChdbError / RuntimeError carrying ClickHouse's text
                raise ClickHouseError.from_chdb(exc) from None
            return Outcome(
                body=result.bytes() or b"",
                read_rows=result.rows_read(), read_bytes=result.bytes_read(),
                written_rows=result.rows_written(), written_bytes=result.bytes_written(),
                elapsed_ns=time.perf_counter_ns() - started,
            )

    def insert(self, statement: str, fmt: str, data: bytes, *, database: str = "default",
               settings: dict[str, str] | None = None) -> Outcome:
        """``statement`` (``INSERT INTO t (cols)``) fed with ``data`` in input format ``fmt``.

        Goes through chdb's streaming inserter: a query string is not binary-safe.
        """
        with self._request(database, settings):
            started = time.perf_counter_ns()
            try:
                inserter = self._session.send_insert(statement, fmt)
                if data:
                    inserter.append(data)
                result = inserter.finish()
            except Exception as exc:
                raise ClickHouseError.from_chdb(exc) from None
            return Outcome(b"", 0, 0, result.rows_written, result.bytes_written, time.perf_counter_ns() - started)

    @contextmanager
    def _request(self, database: str, settings: dict[str, str] | None) -> Iterator[None]:
        """Holds the lock, with the session open on ``database`` and exactly ``settings`` changed."""
        with self._lock:
            self._require_open()
            self._use_database(database)
            self._sync_settings(settings or {})
            yield

    def _require_open(self) -> None:
        if self._session is None:
            raise ClickHouseError.of(210, "NETWORK_ERROR", "Warehouse is shutting down")

    def _use_database(self, database: str) -> None:
        if database == self._database:
            return
        try:
            self._raw(f"USE {_backquoted(database)}")
        except Exception as exc:
            raise ClickHouseError.from_chdb(exc) from None
        self._database = database

    def _sync_settings(self, wanted: dict[str, str]) -> None:
        """Reset settings the previous request changed, then apply this request's."""
        for name in [n for n in self._changed if n not in wanted]:
            self._set(name, "DEFAULT")
            del self._changed[name]
        for name, value in wanted.items():
            if self._changed.get(name) == value:
                continue
            if not _IDENTIFIER.match(name) or name not in self.known_settings:
                raise ClickHouseError.of(115, "UNKNOWN_SETTING", f"Unknown setting '{name}'")
            self._set(name, _string_literal(value))
            self._changed[name] = value

    def _set(self, name: str, literal: str) -> None:
        try:
            self._raw(f"SET {name} = {literal}")
        except Exception as exc:
            raise ClickHouseError.from_chdb(exc) from None

    def close(self) -> None:
        """Wait for the running statement, then release the data directory."""
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None
