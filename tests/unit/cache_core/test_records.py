"""``CacheEntry`` keeps its query and answer packed in one UTF-8 ``bytes``: they read back
as given, whatever the script, and the entry written down (snapshot, log, put) and read
back is the same."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from cache_core.records import CacheEntry, pack_texts
from cache_core.state.codec import entry_from_meta, persisted_meta


def entry(query: str, answer: str) -> CacheEntry:
    return CacheEntry(entry_id="e1", query=query, embedding=None, answer=answer, created_at=1.0, ttl_s=60.0,
                      ttl_policy="absolute", max_age_s=600.0, namespace="default", intent_cluster=3)


@pytest.mark.parametrize("query,answer", [
    ("How do I top up?", "Use the app."),
    ("", ""),
    ("", "only an answer"),
    ("a question only", ""),
    ("Überweisung storniert? 日本語の質問 🙂", "Ja — 答え\x00with a NUL\nand lines"),
    ("x" * 70_000, "y" * 3),  # a query past 65,535 bytes: its length takes 4 bytes
])
def test_query_and_answer_read_back_as_given(query, answer):
    e = entry(query, answer)
    assert (e.query, e.answer) == (query, answer)
    assert e.texts == pack_texts(query, answer)


def test_packed_texts_take_one_object_of_about_their_utf8_size():
    query, answer = "How do I top up my card? #12345", "Open the app, choose Top up, and follow the steps."
    e = entry(query, answer)
    two_strings = sys.getsizeof(query) + sys.getsizeof(answer)
    assert sys.getsizeof(e.texts) <= two_strings - 40  # one header (33 B) instead of two (49 B each)
    assert not hasattr(e, "__dict__")


def test_an_entry_written_down_and_read_back_is_equal():
    e = entry("Wo ist meine Karte? 🙂", "Sie ist unterwegs.")
    back = entry_from_meta(persisted_meta(e), np.zeros(4, dtype=np.float32))
    assert (back.query, back.answer) == (e.query, e.answer)
    assert back.texts == e.texts and back.entry_id == e.entry_id and back.ttl_s == e.ttl_s
