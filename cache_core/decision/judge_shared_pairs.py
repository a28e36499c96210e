"""Labelled pairs from the project's public data folder (../shared/data), for ``judge_train --shared-data``
and the judge benchmark.

Each source yields (cached, query, label, source) rows; label 1 means the cached answer fits the
new question:

* mrpc: Microsoft's paraphrase pairs (human 0/1), train and test files as given.
* stsb: STS-B pairs; score >= 4 is a duplicate, <= 2.5 is not, between is dropped.
* banking77: every question paired with its 3 nearest other questions (MiniLM) of the
  same split: same intent = 1. Nearest neighbours are the hard negatives a cache meets.
* mock: GPTCache's origin/similar pairs (1) and each ``similar`` with its nearest other
  origin (0).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np


def _mrpc(path: Path, source: str) -> list[tuple[str, str, int, str]]:
    rows = []
    with path.open(encoding="utf-8-sig") as f:
        next(f)
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 5:
                rows.append((parts[3], parts[4], int(parts[0]), source))
    return rows


def _stsb(path: Path, source: str) -> list[tuple[str, str, int, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) < 7:
            continue
        score = float(parts[4])
        if 2.5 < score < 4.0:
            continue
        rows.append((parts[5], parts[6], int(score >= 4.0), source))
    return rows


def _neighbour_pairs(texts: list[str], labels: list, vecs: np.ndarray, k: int,
                     source: str) -> list[tuple[str, str, int, str]]:
    sims = vecs @ vecs.T
    np.fill_diagonal(sims, -1)
    rows, seen = [], set()
    for i in range(len(texts)):
        for j in np.argpartition(-sims[i], k)[:k]:
            key = (min(i, j), max(i, j))
            if key in seen or texts[i] == texts[j]:
                continue
            seen.add(key)
            rows.append((texts[j], texts[i], int(labels[i] == labels[j]), source))
    return rows


class SharedDataError(ValueError):
    """The data folder lacks a file the pairs are built from."""


def shared_pairs(data: Path, encode, max_per_split: int | None = None) -> list[tuple[str, str, int, str]]:
    """Every training split's rows as (cached, query, label, source)."""
    return [row for name, rows in load_pairs(data, encode, max_per_split).items()
            if name.endswith("-train") for row in rows]


def _sample(rows: list, limit: int | None, seed: int = 0) -> list:
    """At most ``limit`` of ``rows`` (a seeded sample, order kept)."""
    if limit is None or len(rows) <= limit:
        return rows
    keep = np.sort(np.random.default_rng(seed).choice(len(rows), limit, replace=False))
    return [rows[i] for i in keep]


HUMAN_PAIRS = {"mrpc": (_mrpc, "mrpc/msr_paraphrase_{split}.txt"), "stsb": (_stsb, "stsb/sts-{split}.csv")}
"""The sets whose pairs come labelled by people, as given: no encoder needed to build them."""


def human_pairs(data: Path, source: str) -> dict[str, list[tuple[str, str, int, str]]]:
    """``source``'s ("mrpc" or "stsb") train and test rows as (cached, query, label, source)."""
    read, file = HUMAN_PAIRS[source]
    return {f"{source}-{split}": read(Path(data) / file.format(split=split), source) for split in ("train", "test")}


def load_pairs(data: Path, encode, max_per_split: int | None = None) -> dict[str, list[tuple[str, str, int, str]]]:
    """split name -> rows (at most ``max_per_split`` each, a seeded sample); ``encode(texts) -> unit vectors``."""
    data = Path(data)
    for needed in ("mrpc/msr_paraphrase_train.txt", "stsb/sts-train.csv", "banking77/train.csv",
                   "gptcache-mock/mock_data.json"):
        if not (data / needed).is_file():
            raise SharedDataError(f"{data}: missing {needed} (expected the shared data folder)")
    out = human_pairs(data, "mrpc") | human_pairs(data, "stsb")
    for split in ("train", "test"):
        with (data / "banking77" / f"{split}.csv").open() as f:
            rows = _sample(list(csv.DictReader(f)), None if max_per_split is None else max_per_split // 2)
        texts = [r["text"] for r in rows]
        out[f"banking77-{split}"] = _neighbour_pairs(
            texts, [r["category"] for r in rows], encode(texts), 3, "banking77")
    mock = json.loads((data / "gptcache-mock" / "mock_data.json").read_text())
    origins = [m["origin"] for m in mock]
    similars = [m["similar"] for m in mock]
    ov, sv = encode(origins), encode(similars)
    sims = sv @ ov.T
    mock_rows = []
    for i, (o, s) in enumerate(zip(origins, similars)):
        mock_rows.append((o, s, 1, "mock"))
        order = np.argsort(-sims[i])
        j = next(j for j in order if origins[j] != o)
        mock_rows.append((origins[j], s, 0, "mock"))
    half = len(mock_rows) // 2
    out["mock-train"], out["mock-test"] = mock_rows[:half], mock_rows[half:]
    return {name: _sample(rows, max_per_split) for name, rows in out.items()}
