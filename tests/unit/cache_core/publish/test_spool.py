"""The publisher's on-disk spool, without any broker."""
from __future__ import annotations

import json

import pytest

from cache_core.publish.spool import Record, Spool, SpoolLocked


def records(n: int, start: int = 0, topic: str = "t") -> list[Record]:
    return [Record(topic=topic, key=f"k{i % 3}".encode(), value=json.dumps({"i": i}).encode())
            for i in range(start, start + n)]


def drain(spool: Spool, batch: int = 7) -> list[Record]:
    out = []
    while (b := spool.read_batch(batch)) is not None:
        out.extend(b.records)
        spool.ack(b)
    return out


def test_record_line_round_trip_keeps_bytes_and_partition():
    rec = Record(topic="events", key=b"\x00\xffunit", value='{"q":"é"}'.encode(), partition=2)
    assert Record.from_line(rec.to_line()) == rec
    assert rec.to_line().endswith(b"\n") and rec.to_line().count(b"\n") == 1


def test_fifo_across_segments_and_segments_are_deleted(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=200)
    assert spool.append(records(50)) == 50
    assert len(spool.segments()) > 3
    assert [r.value for r in drain(spool)] == [r.value for r in records(50)]
    assert spool.empty() and spool.pending_bytes == 0
    assert spool.segments() == []


def test_append_refuses_past_the_bound_and_keeps_a_prefix(tmp_path):
    line = len(records(1)[0].to_line())
    spool = Spool(tmp_path, max_bytes=line * 10 + line // 2)
    assert spool.append(records(25)) == 10
    assert spool.disk_bytes() <= spool.max_bytes
    assert spool.append(records(1, start=99)) == 0
    assert [json.loads(r.value)["i"] for r in drain(spool)] == list(range(10))
    # Delivered segments free space again.
    assert spool.append(records(3, start=100)) == 3


def test_restart_resumes_after_last_ack(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=10_000)
    spool.append(records(20))
    batch = spool.read_batch(5)
    spool.ack(batch)
    spool.read_batch(5)  # read but never acknowledged: must come back
    spool.close()

    again = Spool(tmp_path, max_bytes=1 << 20)
    assert [json.loads(r.value)["i"] for r in drain(again)] == list(range(5, 20))


def test_new_appends_after_restart_come_after_old_records(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(3))
    spool.close()
    again = Spool(tmp_path, max_bytes=1 << 20)
    again.append(records(3, start=3))
    assert [json.loads(r.value)["i"] for r in drain(again)] == list(range(6))


def test_torn_tail_is_cut_and_corrupt_line_is_counted(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(2))
    spool.close()
    seg = sorted(tmp_path.glob("seg-*.jsonl"))[-1]
    with open(seg, "ab") as f:
        f.write(b"this is not json\n")
        f.write(records(1, start=2)[0].to_line())
        f.write(b'{"t":"t","k":"a2V5","v":"{\\"i\\": 9')  # crash mid-write

    again = Spool(tmp_path, max_bytes=1 << 20)
    batch = again.read_batch(100)
    assert [json.loads(r.value)["i"] for r in batch.records] == [0, 1, 2]
    assert batch.corrupt == 1
    again.ack(batch)
    assert again.empty()


def test_pending_bytes_survive_restart(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(10))
    spool.ack(spool.read_batch(4))
    pending = spool.pending_bytes
    spool.close()
    assert Spool(tmp_path, max_bytes=1 << 20).pending_bytes == pending > 0


def test_second_process_cannot_share_a_spool(tmp_path):
    spool = Spool(tmp_path, max_bytes=1024)
    with pytest.raises(SpoolLocked):
        Spool(tmp_path, max_bytes=1024)
    spool.close()
    Spool(tmp_path, max_bytes=1024).close()


def test_rejects_nonpositive_bound(tmp_path):
    with pytest.raises(ValueError, match="got 0"):
        Spool(tmp_path, max_bytes=0)


def test_acking_a_prefix_redelivers_only_the_rest(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(records(6))
    batch = spool.read_batch(10)
    spool.ack(batch.prefix(2))
    assert [json.loads(r.value)["i"] for r in drain(spool)] == [2, 3, 4, 5]
    spool.append(records(2, start=6))
    assert spool.read_batch(10).prefix(0).records == []
