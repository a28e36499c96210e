"""``InternalNames``: entry ids by growing internal ids, in a list that removals cannot
grow without bound."""
from __future__ import annotations

import numpy as np
import pytest

from cache_core.store.faiss import IndexSpec, VectorIndex
from cache_core.store.id_names import MIN_CUT, InternalNames


def test_names_read_back_and_go_on_pop():
    names = InternalNames()
    for i in range(10):
        names.add(i, f"e{i}")
    assert [names.get(i) for i in (0, 9, 10, -1)] == ["e0", "e9", None, None]
    assert names.pop(3) == "e3" and names.pop(3) is None and names.get(3) is None
    assert len(names) == 9


def test_skipped_ids_name_nothing_and_an_old_id_is_refused():
    names = InternalNames()
    names.add(0, "a")
    names.add(5, "b")
    assert [names.get(i) for i in range(6)] == ["a", None, None, None, None, "b"]
    with pytest.raises(ValueError):
        names.add(5, "c")


def test_churn_keeps_the_list_within_twice_the_live_names_and_the_hot_ones_found():
    """A few hot entries stay while millions come and go (an LRU store's life)."""
    names = InternalNames()
    hot = {i: f"hot{i}" for i in range(5)}
    for i, name in hot.items():
        names.add(i, name)
    live: list[int] = []
    for i in range(5, 50_000):
        names.add(i, f"e{i}")
        live.append(i)
        if len(live) > 300:
            gone = live.pop(0)
            assert names.pop(gone) == f"e{gone}"
    assert len(names) == 5 + len(live)
    assert len(names._names) <= max(MIN_CUT, 2 * len(live)) + 1
    assert all(names.get(i) == name for i, name in hot.items())
    assert all(names.get(i) == f"e{i}" for i in live)
    assert names.get(live[0] - 1) is None


def test_a_churned_index_still_names_its_search_results():
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((3000, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = VectorIndex(8, IndexSpec("flat"))
    index.add("keep", vecs[0])
    for i in range(1, 3000):
        index.add(f"e{i}", vecs[i])
        if i > 50:
            index.remove(f"e{i - 50}")
    assert index.search(vecs[0], 1)[0][0] == "keep"
    assert index.search(vecs[2990], 1)[0][0] == "e2990"
    assert len(index._entry_of._names) < 2 * MIN_CUT
