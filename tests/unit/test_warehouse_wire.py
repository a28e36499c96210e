"""Pure pieces of the warehouse: SQL lexing, body codecs, error mapping (no server)."""
from __future__ import annotations

import gzip
import zlib

import lz4.frame
import pytest
from backports import zstd

from infra.clickhouse import codecs
from infra.clickhouse.engine import ClickHouseError
from infra.clickhouse.sqltext import output_format, split_insert, split_statements, statement_kind


def test_split_statements_ignores_semicolons_in_literals_and_comments():
    script = "SELECT ';' ; -- a; b\nSELECT `x;y` FROM t /* ; */;\n-- only a comment;\n"
    assert split_statements(script) == ["SELECT ';'", "-- a; b\nSELECT `x;y` FROM t /* ; */"]


def test_statement_kind_and_output_format():
    assert statement_kind("  /* c */ (SELECT 1)") == "SELECT"
    assert statement_kind("-- x\ninsert into t values (1)") == "INSERT"
    assert output_format("SELECT 'FORMAT CSV' FROM t FORMAT JSONEachRow -- tail") == "JSONEachRow"
    assert output_format("SELECT 1 FORMAT JSON SETTINGS max_threads = 1;") == "JSON"
    assert output_format("SELECT 'x FORMAT CSV'") is None


def test_split_insert_finds_data_where_clickhouse_does():
    data = b"\x20\x0a\x00\xff binary"  # starts with bytes that look like whitespace
    assert split_insert(b"INSERT INTO t (a) FORMAT Native\n" + data) == ("INSERT INTO t (a)", "Native", data)
    assert split_insert(b"INSERT INTO t FORMAT JSONEachRow {\"a\": 1}") == ("INSERT INTO t", "JSONEachRow", b'{"a": 1}')
    assert split_insert(b"INSERT INTO t SELECT 'FORMAT x'") is None
    assert split_insert(b"INSERT INTO t VALUES (1)") is None


@pytest.mark.parametrize(("encoding", "compress"), [
    ("lz4", lz4.frame.compress), ("zstd", zstd.compress), ("gzip", gzip.compress), ("deflate", zlib.compress), ("identity", bytes)])
def test_decode_concatenated_frames(encoding, compress):
    # clickhouse-connect compresses each insert block into its own frame.
    parts = [b"first block " * 100, b"second block " * 50]
    body = b"".join(compress(p) for p in parts) if encoding in ("lz4", "zstd", "gzip") else compress(b"".join(parts))
    assert codecs.decode(encoding, body) == b"".join(parts)


def test_decode_rejects_unknown_and_truncated():
    with pytest.raises(codecs.UnsupportedEncoding):
        codecs.decode("br", b"x")
    with pytest.raises(Exception):
        codecs.decode("lz4", lz4.frame.compress(b"abc" * 100)[:-6])


def test_choose_response_encoding():
    assert codecs.choose("br, gzip;q=0.5, lz4") == "gzip"
    assert codecs.choose("br") is None


def test_error_mapping_follows_clickhouse():
    unknown = ClickHouseError.from_chdb(RuntimeError(
        "Streaming insert finish failed: Code: 60. DB::Exception: Table default.x does not exist. (UNKNOWN_TABLE) (version 26.9.2.1)"))
    assert (unknown.code, unknown.name, unknown.http_status) == (60, "UNKNOWN_TABLE", 404)
    assert unknown.message.startswith("Code: 60. DB::Exception:")
    assert ClickHouseError.from_chdb(RuntimeError("Code: 62. DB::Exception: Syntax error. (SYNTAX_ERROR)")).http_status == 400
    assert ClickHouseError.from_chdb(RuntimeError("Code: 27. DB::Exception: x. (CANNOT_PARSE_INPUT_ASSERTION_FAILED)")).http_status == 400
    assert ClickHouseError.from_chdb(RuntimeError("boom")).code == 1001
