"""Compressed and hashed index kinds (cache_core.store.kinds behind VectorIndex): recall
against exact search, similarities re-scored from the reference (fp16, or the codes
themselves), no float32 copy kept once trained, removal, training fallback, bytes per
entry, and the semantic hash's fingerprints and Hamming neighbourhood."""
from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from cache_core.store import kinds as index_kinds
from cache_core.experiments import ArmConfig
from cache_core.store.faiss import IndexSpec, VectorIndex
from tests.unit.cache_core.store.test_faiss import clustered_vectors, filled

DIM = 32
SPECS = [
    IndexSpec("sq_fp16"), IndexSpec("sq_int8"), IndexSpec("sq_int4"),
    IndexSpec("hnsw_sq_fp16", hnsw_m=16), IndexSpec("hnsw_sq_int8", hnsw_m=16),
    IndexSpec("hnsw_sq_int4", hnsw_m=16),
    IndexSpec("ivf_sq_int8", ivf_nlist=4, ivf_nprobe=4),
    IndexSpec("ivf_pq", ivf_nlist=4, ivf_nprobe=4, pq_m=16, pq_nbits=4, ann_candidates=64),
    IndexSpec("semhash", semhash_tables=8, semhash_radius=2, ann_candidates=100),
]
ENTRIES = 1000  # trains every kind above (ivf_pq: 39 x 16 centroids)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return clustered_vectors(ENTRIES, dim=DIM)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_ann_agrees_with_exact_search_and_scores_are_the_references(spec, vectors):
    index = filled(spec, vectors)
    assert index.trained
    assert index.reference_precision == index_kinds.reference_precision(spec) != "fp32"
    queries = clustered_vectors(100, dim=DIM, seed=1)
    agree = 0
    for query in queries:
        ann, exact = index.search(query, 5), index.exact_search(query, 5)
        agree += ann[0][0] == exact[0][0]
        for entry_id, score in ann:  # the reference's cosine (fp16 or the codes), near the float32 one
            assert score == pytest.approx(float(index.vector(entry_id) @ query), abs=1e-4)
            true = float(vectors[int(entry_id[1:])] @ query)
            assert score == pytest.approx(true, abs=2e-3 if index.reference_precision == "fp16" else 2e-2)
        assert [s for _, s in ann] == sorted((s for _, s in ann), reverse=True)
    # Random hyperplanes rank a cluster's near-ties (cosine 0.9 to 0.95) by a noisy
    # Hamming distance: the hash is for near-duplicates (next test), not fine ranking.
    assert agree / len(queries) >= (0.6 if spec.kind == "semhash" else 0.9)


def test_semhash_finds_near_duplicates(vectors):
    index = filled(IndexSpec("semhash"), vectors)  # the arm defaults: 4 x 16 bits, radius 4
    rng = np.random.default_rng(5)
    picks = rng.choice(ENTRIES, 100, replace=False)
    noisy = vectors[picks] + rng.normal(0, 0.03, (100, DIM)).astype(np.float32)  # cosine ~0.98
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    agree = sum(index.search(q, 1)[0][0] == index.exact_search(q, 1)[0][0] for q in noisy)
    assert agree >= 95


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_self_is_top1_and_removed_ids_never_come_back(spec, vectors):
    index = filled(spec, vectors)
    entry, score = index.search(vectors[7], 1)[0]
    assert entry == "e7" and score == pytest.approx(1.0, abs=1e-3 if index.reference_precision == "fp16" else 1e-2)
    for i in range(0, 200, 2):
        assert index.remove(f"e{i}")
    for i in range(0, 40, 2):
        found = [e for e, _ in index.search(vectors[i], 5)]
        assert found and all(int(e[1:]) % 2 == 1 or int(e[1:]) >= 200 for e in found)


@pytest.mark.parametrize("kind", ["hnsw_sq_int8", "semhash"])
def test_kinds_without_removal_tombstone_then_rebuild(kind, vectors):
    index = VectorIndex(DIM, IndexSpec(kind), rebuild_fraction=0.2)
    index.add_many([f"e{i}" for i in range(400)], vectors[:400])
    built = index.rebuilds  # int8 trained once it had 256
    for i in range(66):  # 66 tombstones, not over 0.2 x 334 live
        index.remove(f"e{i}")
    assert index.rebuilds == built and len(index._tombstones) == 66
    index.remove("e66")  # 67 > 0.2 x 333
    assert index.rebuilds == built + 1 and not index._tombstones and index.trained
    assert index.search(vectors[150], 1)[0][0] == "e150"


def test_quantisers_that_learn_ranges_are_exact_until_trained(vectors):
    index = VectorIndex(DIM, IndexSpec("sq_int8"))
    for i in range(index_kinds.SQ_TRAIN_SIZE - 1):
        index.add(f"e{i}", vectors[i])
    assert not index.trained and index.ann_bytes_per_entry() == 0.0
    index.add("last", vectors[-1])
    assert index.trained and index.search(vectors[3], 1)[0][0] == "e3"
    assert VectorIndex(DIM, IndexSpec("sq_fp16")).trained  # fp16 learns nothing


def test_a_rebuild_below_the_training_size_falls_back_to_exact(vectors):
    index = VectorIndex(DIM, IndexSpec("hnsw_sq_int8"), rebuild_fraction=0.2)
    index.add_many([f"e{i}" for i in range(300)], vectors[:300])
    for i in range(120):
        index.remove(f"e{i}")
    assert not index.trained and len(index) == 180
    assert index.search(vectors[200], 1)[0][0] == "e200"


def test_bytes_per_entry_follow_the_code_size(vectors):
    sizes = {spec.kind: filled(spec, vectors).ann_bytes_per_entry() for spec in SPECS}
    flat_bytes, id_bytes = DIM * 4, 8
    assert sizes["sq_fp16"] == pytest.approx(flat_bytes / 2 + id_bytes, rel=0.05)
    assert sizes["sq_int8"] == pytest.approx(flat_bytes / 4 + id_bytes, rel=0.05)
    assert sizes["sq_int4"] == pytest.approx(flat_bytes / 8 + id_bytes, rel=0.1)
    assert sizes["hnsw_sq_int8"] > sizes["sq_int8"]  # plus the graph's links
    assert sizes["ivf_sq_int8"] == pytest.approx(sizes["sq_int8"], rel=0.1)
    assert sizes["ivf_pq"] < sizes["sq_int8"]
    assert sizes["semhash"] == 8 + 8 + 8 * 8


def test_references_hold_no_float32_copy_once_trained(vectors):
    """The fp16 / int8 quantisers keep only their codes; the others an fp16 copy."""
    for spec in SPECS:
        index = filled(spec, vectors)
        per_entry = index.reference_bytes_per_entry()
        if index_kinds.reference_precision(spec) == "codes":
            assert per_entry == 0.0, spec.kind
        else:
            assert per_entry == pytest.approx(DIM * 2 + 8), spec.kind
    untrained = VectorIndex(DIM, IndexSpec("ivf_sq_int8", ivf_nlist=4))
    untrained.add("a", vectors[0])
    assert untrained.reference_precision == "fp32" and not untrained.trained


@pytest.mark.parametrize("kind", ["ivf_sq_int8", "sq_int8", "semhash"])
def test_stepped_exact_scan_of_the_reference_leaves_out_later_rows(kind, vectors):
    """The ANN check's blocks (rows of the fp16 copy, or whole inverted lists of codes)
    cover every row once, and a query's bound leaves out what was added after its lookup."""
    index = VectorIndex(DIM, IndexSpec(kind, ivf_nlist=4, ivf_nprobe=1))
    index.add_many([f"e{i}" for i in range(800)], vectors[:800])
    mark = index.mark()
    index.add_many([f"e{i}" for i in range(800, ENTRIES)], vectors[800:])
    queries = vectors[[900, 901, 10]]
    before = np.array([mark.next_id, mark.next_id, np.iinfo(np.int64).max], dtype=np.int64)
    blocks = [index.exact_block_many(queries, start, start + 97, 5, before=before)
              for start in range(0, index.exact_rows(), 97)]
    scores = np.concatenate([b[0] for b in blocks], axis=1)
    ids = np.concatenate([b[1] for b in blocks], axis=1)
    for q, (row_scores, row_ids) in enumerate(zip(scores, ids)):
        order = np.argsort(-row_scores, kind="stable")[:5]
        found = index.labels(row_ids[order])
        everything = index.exact_search(queries[q], ENTRIES)
        allowed = [e for e, _ in everything if q == 2 or int(e[1:]) < 800][:5]
        assert found == allowed
    assert index.labels(ids[2][np.argsort(-scores[2])[:1]]) == ["e10"]


def test_ivf_pq_needs_pq_m_to_divide_the_dimension():
    index = VectorIndex(DIM, IndexSpec("ivf_pq", ivf_nlist=2, pq_m=5, pq_nbits=4))
    with pytest.raises(ValueError, match="pq_m must divide"):
        index.add_many([f"e{i}" for i in range(700)], clustered_vectors(700, dim=DIM))


# -- semantic hash ------------------------------------------------------------------

def hamming(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.unpackbits(np.bitwise_xor(a, b)).sum())


def test_fingerprint_bits_disagree_in_proportion_to_the_angle():
    hashed = index_kinds.SemanticHashIndex(384, seed=3)
    rng = np.random.default_rng(0)
    for cosine in (0.99, 0.9, 0.7):
        dists = []
        for _ in range(200):
            a = rng.standard_normal(384)
            a /= np.linalg.norm(a)
            ortho = rng.standard_normal(384)
            ortho -= (ortho @ a) * a
            ortho /= np.linalg.norm(ortho)
            b = cosine * a + np.sqrt(1 - cosine ** 2) * ortho
            codes = hashed.fingerprints(np.stack([a, b]).astype(np.float32))
            dists.append(hamming(codes[0], codes[1]))
        expected = 64 * np.arccos(cosine) / np.pi
        assert np.mean(dists) == pytest.approx(expected, abs=1.0)


def test_same_seed_same_fingerprints_other_seed_other():
    vecs = clustered_vectors(20, dim=64)
    a = index_kinds.SemanticHashIndex(64, seed=1).fingerprints(vecs)
    assert np.array_equal(a, index_kinds.SemanticHashIndex(64, seed=1).fingerprints(vecs))
    assert not np.array_equal(a, index_kinds.SemanticHashIndex(64, seed=2).fingerprints(vecs))
    assert a.shape == (20, 8) and a.dtype == np.uint8


def test_hash_search_finds_what_the_radius_reaches_and_not_beyond():
    """4 tables of 16 bits, radius r: an entry whose 64-bit fingerprint differs from the
    query's in at most 4 (r + 1) - 1 bits shares a key within r flips in some table."""
    hashed = index_kinds.SemanticHashIndex(8, tables=4, radius=1)
    query = np.zeros(64, dtype=bool)
    near = query.copy()
    near[[0, 1, 16, 17, 32, 33, 48]] = True  # 7 bits: table 4 differs in one
    far = query.copy()
    far[[0, 1, 16, 17, 32, 33, 48, 49]] = True  # 8 bits, two in every table
    codes = np.packbits(np.stack([near, far]), axis=1)
    hashed._index.add_with_ids(codes, np.array([10, 11], dtype=np.int64))
    dist, ids = hashed._index.search(np.packbits(query[None], axis=1), 2)
    assert ids[0].tolist() == [10, -1] and dist[0][0] == 7


def test_arm_options_are_validated():
    arm = ArmConfig(name="a", index_kind="semhash", semhash_radius=2, semhash_tables=8)
    spec = IndexSpec.for_arm(arm)
    assert (spec.kind, spec.semhash_radius, spec.semhash_tables) == ("semhash", 2, 8)
    assert IndexSpec.for_arm(ArmConfig(name="a")).semhash_radius == 4
    for bad in ({"semhash_tables": 3}, {"semhash_radius": 9}, {"index_kind": "lsh"},
                {"pq_nbits": 2}, {"ann_candidates": 0}):
        with pytest.raises(ValidationError):
            ArmConfig(name="a", **bad)
