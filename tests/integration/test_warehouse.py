"""The embedded warehouse, driven by clickhouse-connect exactly as a ClickHouse server would be."""
from __future__ import annotations

import gzip
import json
import multiprocessing
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timezone

import lz4.frame
import pandas as pd
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError
from clickhouse_connect.driver.summary import QuerySummary

from cache_core.chclient import connect
from cache_core.settings import ClickHouseSettings
from infra.clickhouse.warehouse import start_warehouse

pytestmark = pytest.mark.integration

SCRATCH_DDL = """CREATE TABLE {name} (id Int64, tag LowCardinality(String), note Nullable(String),
    at DateTime64(3, 'UTC'), hist Array(Int64)) ENGINE = MergeTree ORDER BY id"""


@pytest.fixture()
def scratch(ch_client) -> str:
    """A fresh table in the scache database (name generated here, never from input)."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    ch_client.command(SCRATCH_DDL.format(name=name))
    yield name
    ch_client.command(f"DROP TABLE IF EXISTS {name}")


def _rows(n: int, tag: str = "a", start: int = 0) -> list[list]:
    at = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    return [[start + i, tag, None if i % 3 else f"n{i}", at, [i, i * 2]] for i in range(n)]


def _http(url: str, sql: str | None = None, body: bytes | None = None, headers: dict | None = None,
          **params: str) -> tuple[int, dict, bytes]:
    """A raw HTTP exchange, for what clickhouse-connect does not expose (status, headers)."""
    if sql is not None:
        params["query"] = sql
    request = urllib.request.Request(f"{url}/?{urllib.parse.urlencode(params)}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_ping(warehouse, ch_client):
    assert ch_client.ping()
    with urllib.request.urlopen(warehouse.info["url"] + "/ping", timeout=10) as response:
        assert (response.status, response.read()) == (200, b"Ok.\n")


def test_command_results(ch_client, scratch):
    assert ch_client.command("SELECT 1") == 1
    version, tz = ch_client.command("SELECT version(), timezone()")
    assert version == ch_client.server_version and tz
    assert isinstance(ch_client.command(f"INSERT INTO {scratch} (id, tag, at) VALUES (1, 'x', now64())"), QuerySummary)
    assert ch_client.command(f"SELECT count() FROM {scratch} WHERE id = 99") == 0
    assert ch_client.command(f"SELECT tag FROM {scratch} WHERE id = 99") == ""  # empty result, not a summary


def test_query_rows_and_dataframe(ch_client, scratch):
    ch_client.insert(scratch, _rows(5), column_names=["id", "tag", "note", "at", "hist"])
    result = ch_client.query(f"SELECT id, tag, note, at, hist FROM {scratch} ORDER BY id")
    assert result.column_names == ("id", "tag", "note", "at", "hist")
    assert result.result_rows[0] == (0, "a", "n0", datetime(2026, 1, 2, 3, 4, 5, 678000), [0, 0])
    assert result.result_rows[1][2] is None
    frame = ch_client.query_df(f"SELECT id, tag, hist FROM {scratch} WHERE id >= 3 ORDER BY id")
    assert frame["id"].tolist() == [3, 4] and frame["tag"].tolist() == ["a", "a"]
    assert [list(h) for h in frame["hist"]] == [[3, 6], [4, 8]]


@pytest.mark.parametrize("compression", ["lz4", "zstd", "gzip", False])
def test_native_insert_compressed(ch_settings, scratch, compression):
    client = connect(ch_settings, compress=compression)
    try:
        assert client.write_compression == (compression or None)
        summary = client.insert(scratch, _rows(10_000, tag="bulk"), column_names=["id", "tag", "note", "at", "hist"])
        assert summary.written_rows == 10_000
        count, total, hist_total = client.query(f"SELECT count(), sum(id), sum(arraySum(hist)) FROM {scratch}").result_rows[0]
        assert (count, total, hist_total) == (10_000, sum(range(10_000)), 3 * sum(range(10_000)))
    finally:
        client.close()


def test_insert_df(ch_client, scratch):
    frame = pd.DataFrame({
        "id": [10, 11], "tag": ["df", "df"], "note": ["x", None],
        "at": pd.to_datetime(["2026-03-01 00:00:00.5", "2026-03-02 00:00:00.0"], utc=True), "hist": [[1, 2, 3], []],
    })
    assert ch_client.insert_df(scratch, frame).written_rows == 2
    rows = ch_client.query(f"SELECT id, note, toUnixTimestamp64Milli(at), hist FROM {scratch} ORDER BY id").result_rows
    assert rows == [(10, "x", 1772323200500, [1, 2, 3]), (11, None, 1772409600000, [])]


def test_raw_insert_query_in_body_and_in_url(ch_client, scratch):
    # Uncompressed text: clickhouse-connect puts the INSERT at the head of the body.
    ch_client.raw_insert(scratch, ["id", "tag"], insert_block='{"id": 1, "tag": "body"}\n', fmt="JSONEachRow")
    # Compressed: the INSERT goes in the URL and the body carries only the data.
    block = lz4.frame.compress(b'{"id": 2, "tag": "url"}\n{"id": 3, "tag": "url"}\n')
    ch_client.raw_insert(scratch, ["id", "tag"], insert_block=block, fmt="JSONEachRow", compression="lz4")
    rows = ch_client.query(f"SELECT id, tag FROM {scratch} ORDER BY id").result_rows
    assert rows == [(1, "body"), (2, "url"), (3, "url")]


def test_format_clause_and_default_format(warehouse, ch_client):
    assert ch_client.raw_query("SELECT 1 AS x FORMAT JSONEachRow") == b'{"x":1}\n'
    assert ch_client.raw_query("SELECT 2 AS x", fmt="CSV") == b"2\n"
    status, headers, body = _http(warehouse.info["url"], "SELECT 3 AS x", default_format="JSONCompact")
    assert status == 200 and headers["X-ClickHouse-Format"] == "JSONCompact"
    assert json.loads(body)["data"] == [[3]]
    assert _http(warehouse.info["url"], "SELECT 40 +", body=b"2")[2] == b"42\n"  # URL query + body, joined
    summary = json.loads(headers["X-ClickHouse-Summary"])
    assert summary["read_rows"] == "1" and headers["X-ClickHouse-Query-Id"]


def test_parameters_bind_server_side_and_store_injection_verbatim(ch_client, scratch):
    evil = "x'); DROP TABLE " + scratch + "; -- \\' \" ` \t\n{tag:String}"
    ch_client.command(f"INSERT INTO {scratch} (id, tag, note, at) SELECT {{id:Int64}}, {{tag:String}}, {{note:String}}, now64()",
                      parameters={"id": 7, "tag": "p", "note": evil})
    assert ch_client.query(f"SELECT note FROM {scratch} WHERE id = {{id:Int64}}", parameters={"id": 7}).result_rows == [(evil,)]
    assert ch_client.query("SELECT {s:String}", parameters={"s": evil}).result_rows == [(evil,)]
    assert ch_client.command(f"EXISTS TABLE {scratch}") == 1
    with pytest.raises(DatabaseError, match="BAD_QUERY_PARAMETER|cannot be parsed"):
        ch_client.query("SELECT {n:Int64}", parameters={"n": "1; DROP TABLE x"})


def test_form_encoded_queries(ch_settings):
    client = connect(ch_settings, form_encode_query_params=True)
    try:
        assert client.query("SELECT {a:String} || {b:String}", parameters={"a": "x&y=", "b": "é"}).result_rows == [("x&y=é",)]
    finally:
        client.close()


def test_errors_are_clickhouse_errors_and_server_survives(warehouse, ch_client):
    with pytest.raises(DatabaseError) as unknown:
        ch_client.query("SELECT * FROM no_such_table")
    assert "Code: 60. DB::Exception:" in str(unknown.value) and "UNKNOWN_TABLE" in str(unknown.value)
    with pytest.raises(DatabaseError, match="Code: 62.*SYNTAX_ERROR"):
        ch_client.command("SELEC 1")
    with pytest.raises(DatabaseError, match="UNKNOWN_SETTING"):
        ch_client.query("SELECT 1", settings={"no_such_setting": 1})
    url = warehouse.info["url"]
    status, headers, body = _http(url, "SELECT * FROM no_such_table")
    assert status == 404 and headers["X-ClickHouse-Exception-Code"] == "60" and body.startswith(b"Code: 60.")
    assert _http(url, body=b"SELEC 1")[0] == 400
    assert _http(url, body=b"SELECT throwIf(1)")[0] == 500
    assert _http(url, body=b"SELECT 1; SELECT 2")[0] == 400
    status, headers, _ = _http(url, body=b"\x04\x22garbage", headers={"Content-Encoding": "lz4"})
    assert status == 400 and headers["X-ClickHouse-Exception-Code"] == "271"
    status, headers, _ = _http(url, "CREATE TABLE t_get (a Int8) ENGINE = Memory")  # GET implies readonly
    assert status == 403 and headers["X-ClickHouse-Exception-Code"] == "164"
    assert ch_client.command("SELECT 1") == 1


def test_settings_apply_to_their_request_only(ch_client):
    assert ch_client.command("SELECT getSetting('max_threads')", settings={"max_threads": 1}) == 1
    assert ch_client.command("SELECT getSetting('max_threads')") != 1


def test_response_compression_when_asked(warehouse):
    url = warehouse.info["url"]
    status, headers, body = _http(url, "SELECT 'hello'", headers={"Accept-Encoding": "gzip"}, enable_http_compression="1")
    assert status == 200 and headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == b"hello\n"
    status, headers, body = _http(url, "SELECT 'hello'", headers={"Accept-Encoding": "gzip"})
    assert "Content-Encoding" not in headers and body == b"hello\n"


def _worker(url: str, table: str, tag: str, batches: int, rows: int) -> int:
    """Child process: its own client, interleaving inserts with reads of its own rows."""
    client = connect(ClickHouseSettings(url=url, database="scache"))
    seen = 0
    for batch in range(batches):
        client.insert(table, _rows(rows, tag=tag, start=batch * rows), column_names=["id", "tag", "note", "at", "hist"])
        now = client.command(f"SELECT count() FROM {table} WHERE tag = {{tag:String}}", parameters={"tag": tag})
        assert now == seen + rows, (tag, batch, now, seen)
        seen = now
    client.close()
    return seen


def test_two_processes_insert_and_query_concurrently(ch_settings, ch_client, scratch):
    batches, rows = 15, 500
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        jobs = [pool.apply_async(_worker, (ch_settings.url, scratch, tag, batches, rows)) for tag in ("p1", "p2")]
        seen = [job.get(timeout=120) for job in jobs]
    assert seen == [batches * rows, batches * rows]
    per_tag = dict(ch_client.query(f"SELECT tag, count() FROM {scratch} GROUP BY tag").result_rows)
    assert per_tag == {"p1": batches * rows, "p2": batches * rows}


def test_data_survives_restart_and_dir_is_exclusive(tmp_path):
    data_dir = tmp_path / "data"
    first = start_warehouse(data_dir)
    try:
        client = connect(ClickHouseSettings(url=first.info["url"]), database="default")
        client.command("CREATE TABLE kept (id Int64) ENGINE = MergeTree ORDER BY id")
        client.insert("kept", [[i] for i in range(1234)], column_names=["id"])
        client.close()
        with pytest.raises(RuntimeError, match="already in use"):
            start_warehouse(data_dir, timeout_s=30)
    finally:
        first.stop()
    assert first.proc.returncode == 0  # clean shutdown on SIGTERM
    second = start_warehouse(data_dir)
    try:
        client = connect(ClickHouseSettings(url=second.info["url"]), database="default")
        assert client.command("SELECT count(), sum(id) FROM kept") == ["1234", str(sum(range(1234)))]
        client.close()
    finally:
        second.stop()


def test_password_is_enforced_when_configured(tmp_path):
    service = start_warehouse(tmp_path / "data", env={"SCACHE_CLICKHOUSE__PASSWORD": "s3cret"})
    try:
        with pytest.raises(DatabaseError, match="516.*AUTHENTICATION_FAILED"):
            connect(ClickHouseSettings(url=service.info["url"], password="wrong"), database="default")
        client = connect(ClickHouseSettings(url=service.info["url"], password="s3cret"), database="default")
        assert client.command("SELECT 1") == 1
        client.close()
    finally:
        service.stop()
