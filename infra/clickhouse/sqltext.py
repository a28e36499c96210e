"""Just enough ClickHouse SQL lexing for the warehouse and the migrator.

Nothing here builds SQL. It splits a script into statements and looks at the head
and tail of one statement (its kind, a FORMAT clause), skipping string literals,
quoted identifiers and comments, so a ';' or 'FORMAT' inside them is never misread.
"""
from __future__ import annotations

import re

_QUOTES = "'\"`"
RESULT_KINDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "CHECK", "VALUES"})
"""Statements that produce a result set (and so are read-only)."""
_FORMAT_TAIL = re.compile(
    r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)(?:\s+SETTINGS\b[^;]*)?\s*;?\s*\Z", re.IGNORECASE
)


def _skip_quoted(text: str, start: int) -> int:
    """Index just past the quoted token opening at ``start`` (backslash escapes honoured)."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == quote:
            if text[i + 1:i + 2] == quote:  # doubled quote escapes itself
                i += 2
                continue
            return i + 1
        i += 1
    return len(text)


def _skip_comment(text: str, start: int) -> int:
    """Index just past a comment opening at ``start``, or ``start`` if none opens there."""
    two = text[start:start + 2]
    if two == "--" or text[start] == "#":
        end = text.find("\n", start)
        return len(text) if end < 0 else end + 1
    if two == "/*":
        end = text.find("*/", start + 2)
        return len(text) if end < 0 else end + 2
    return start


def mask(text: str) -> str:
    """``text`` with literals and comments blanked (same length), for safe searching."""
    out = list(text)
    i = 0
    while i < len(text):
        if text[i] in _QUOTES:
            end = _skip_quoted(text, i)
            out[i + 1:end - 1] = " " * max(0, end - i - 2)
            i = end
            continue
        end = _skip_comment(text, i)
        if end != i:
            out[i:end] = " " * (end - i)
            i = end
            continue
        i += 1
    return "".join(out)


def split_statements(script: str) -> list[str]:
    """Statements of a script, split on top-level ';', stripped, empty ones dropped.

    Comments inside a statement are kept (ClickHouse ignores them); a chunk that is
    only comments is dropped.
    """
    masked = mask(script)
    statements, start = [], 0
    for i, ch in enumerate(masked):
        if ch == ";":
            statements.append((script[start:i], masked[start:i]))
            start = i + 1
    statements.append((script[start:], masked[start:]))
    return [raw.strip() for raw, blank in statements if blank.strip()]


def statement_kind(sql: str) -> str:
    """Upper-cased first keyword, ignoring comments and opening parentheses."""
    match = re.match(r"[\s(]*([A-Za-z]+)", mask(sql))
    return match.group(1).upper() if match else ""


def output_format(sql: str) -> str | None:
    """The format named by a trailing ``FORMAT x`` clause, if any."""
    match = _FORMAT_TAIL.search(mask(sql))
    return match.group(1) if match else None


def is_multi_statement(sql: str) -> bool:
    return len(split_statements(sql)) > 1


_INSERT_FORMAT = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)", re.IGNORECASE)
INSERT_HEAD_BYTES = 1 << 16


def split_insert(sql: bytes) -> tuple[str, str, bytes] | None:
    """``(statement without FORMAT, format, data)`` for ``INSERT ... FORMAT x <data>``.

    The data starts where ClickHouse starts it: after the format name, spaces and
    tabs, then one optional line break. Returns None for an INSERT with no FORMAT
    clause (``VALUES`` literals, ``INSERT ... SELECT``), which runs as ordinary SQL.
    """
    match = None
    for size in (4096, INSERT_HEAD_BYTES):  # statements are short; mask() is a Python loop
        head = sql[:size].decode("latin-1")  # one char per byte: indices stay byte offsets
        match = _INSERT_FORMAT.search(mask(head))
        if match is not None or len(sql) <= size:
            break
    if match is None:
        return None
    pos = match.end()
    while pos < len(sql) and sql[pos:pos + 1] in (b" ", b"\t", b"\f"):
        pos += 1
    if sql[pos:pos + 1] == b"\r":
        pos += 1
    if sql[pos:pos + 1] == b"\n":
        pos += 1
    statement = sql[:match.start()].decode("utf-8").strip()
    return statement, match.group(1), sql[pos:]
