"""A user's labelled pairs file, as ``judge_train --pairs`` reads it.

CSV or TSV with a header, or JSON Lines; one pair a row: the stored question, the new one and
whether the stored answer fits the new question. Files exported from elsewhere keep their own
column names, so the common ones are understood as they are:

* stored question: ``cached_query``, ``question1``, ``sentence1``, ``text1``, ``s1``
* new question: ``query``, ``question2``, ``sentence2``, ``text2``, ``s2``
* label: ``label``, ``is_duplicate``, ``duplicate``, ``verdict`` — 1 / true / correct / yes /
  duplicate, or 0 / false / wrong / no / different

(Quora's question pairs, GLUE's MRPC / QQP exports and our own verdict exports read unchanged.)
A row with an empty question is skipped and counted: public dumps carry a few, and one blank
row should not cost a 400k-row file; a label that is none of the above stops the read with
the row's number.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("cache_core.decision.judge_pairs_file")

Pair = tuple[str, str, int]  # cached_query, query, label
TRUE_LABELS = frozenset({"1", "1.0", "true", "correct", "yes", "duplicate"})
FALSE_LABELS = frozenset({"0", "0.0", "false", "wrong", "no", "different"})
COLUMNS = {
    "cached_query": ("cached_query", "question1", "sentence1", "text1", "s1"),
    "query": ("query", "question2", "sentence2", "text2", "s2"),
    "label": ("label", "is_duplicate", "duplicate", "verdict"),
}
"""Each field's accepted column names, the first present in a row wins."""


class PairsError(ValueError):
    """A pairs file that cannot be read; the message names the file and row."""


@dataclass
class PairsFile:
    pairs: list[Pair]
    skipped_blank: int


def read_pairs(path: Path) -> list[Pair]:
    """The file's pairs as (cached_query, query, label); see the module docstring."""
    return read_pairs_file(path).pairs


def read_pairs_file(path: Path) -> PairsFile:
    from cache_core.seed import SeedError, read_records

    try:
        records = read_records(path)
    except SeedError as exc:
        raise PairsError(str(exc)) from None
    pairs, blank = [], 0
    for n, row in records:
        if isinstance(row, SeedError):
            raise PairsError(f"{path}:{n}: {row}")
        fields = _fields(row, path, n)
        if fields is None:
            blank += 1
            continue
        pairs.append(fields)
    if blank:
        log.warning("%s: skipped %d rows with an empty question", path, blank)
    if len({p[2] for p in pairs}) < 2:
        raise PairsError(f"{path}: needs both correct and wrong pairs, got {len(pairs)} rows of one label")
    return PairsFile(pairs, blank)


def _fields(row, path: Path, n: int) -> Pair | None:
    """One row's pair; None when a question is empty."""
    if not isinstance(row, dict):
        raise PairsError(f"{path}: row {n} is not an object with query, cached_query and label")
    found = {field: next((name for name in names if name in row), None) for field, names in COLUMNS.items()}
    missing = [field for field, name in found.items() if name is None]
    if missing:
        accepted = "; ".join(f"{field}: {' / '.join(COLUMNS[field])}" for field in missing)
        raise PairsError(f"{path}: row {n} needs query, cached_query and label (missing {accepted})")
    cached, query, label = (row[found[field]] for field in ("cached_query", "query", "label"))
    if label in (None, ""):
        raise PairsError(f"{path}: row {n} has no label")
    label = str(label).strip().lower()
    if label not in TRUE_LABELS | FALSE_LABELS:
        raise PairsError(f"{path}: row {n}: label {row[found['label']]!r} is neither 1/correct nor 0/wrong")
    if cached is None or query is None or not str(cached).strip() or not str(query).strip():
        return None
    return str(cached), str(query), int(label in TRUE_LABELS)
