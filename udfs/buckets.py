"""Buckets that attribute hit rate to cache lifetime, similarity, index precision and latency.

Also the histogram helpers the dashboard uses to read latency quantiles back from merged
``latency_hist`` arrays (one count per LATENCY_BOUNDS_MS bucket, last = overflow).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence

import numpy as np

from udfs.errors import DATA_ERRORS

LIFETIME_BUCKETS = ("fresh", "mid", "late", "expired", "none")
NO_ENTRY = "none"
ERR_LIFETIME = "lifetime_bucket.invalid_age_or_ttl"
ERR_LATENCY = "latency_bucket.negative_latency"

LATENCY_BOUNDS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
"""Inclusive upper bounds (ms) of the latency buckets; one more bucket holds everything above."""
LATENCY_BUCKETS = len(LATENCY_BOUNDS_MS) + 1

PRECISION_EDGES = (0.90, 0.95, 0.99)
PRECISION_BUCKETS = ("lt_0.90", "0.90-0.95", "0.95-0.99", "ge_0.99")
NO_CHECKS = "unchecked"


def lifetime_bucket(age_s: float | None, ttl_s: float | None) -> str:
    """Where in its TTL the matched entry was: fresh (< 1/3), mid, late (>= 2/3), expired (>= TTL).

    "none" when there was no entry (or it carries no TTL). A negative age or a
    non-positive TTL is a data error: counted, and bucketed as "none".
    """
    if age_s is None or ttl_s is None or math.isnan(age_s) or math.isnan(ttl_s):
        return NO_ENTRY
    if age_s < 0 or ttl_s <= 0:
        DATA_ERRORS.count(ERR_LIFETIME)
        return NO_ENTRY
    if age_s >= ttl_s:
        return "expired"
    if age_s >= ttl_s * 2 / 3:
        return "late"
    if age_s < ttl_s / 3:
        return "fresh"
    return "mid"


def lifetime_bucket_array(age_s: np.ndarray, ttl_s: np.ndarray) -> np.ndarray:
    """Vectorised ``lifetime_bucket`` (NaN = None), an object array of labels."""
    age = np.asarray(age_s, dtype="float64")
    ttl = np.asarray(ttl_s, dtype="float64")
    present = ~np.isnan(age) & ~np.isnan(ttl)
    invalid = present & ((age < 0) | (ttl <= 0))
    DATA_ERRORS.count(ERR_LIFETIME, int(invalid.sum()))
    ok = present & ~invalid
    with np.errstate(invalid="ignore", divide="ignore"):
        labels = np.select(
            [~ok, age >= ttl, age >= ttl * 2 / 3, age < ttl / 3],
            [NO_ENTRY, "expired", "late", "fresh"],
            default="mid",
        )
    return labels.astype(object)


def similarity_bucket(sim: float | None, width: float = 0.05) -> float | None:
    """Lower edge of the ``width``-wide similarity bucket holding ``sim`` (1.0 joins the top bucket)."""
    if sim is None or math.isnan(sim):
        return None
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")
    clamped = max(-1.0, min(1.0, sim))
    # The epsilon keeps 0.15 / 0.05 = 2.999... in bucket 3, where a reader expects it.
    index = math.floor(clamped / width + 1e-9)
    top = math.floor(1.0 / width + 1e-9) - 1
    return round(min(index, top) * width, 10)


def precision_bucket(agreements: int | None, checks: int | None) -> str:
    """Bucket of the sampled ANN-vs-exact agreement rate (``agreements / checks``)."""
    if not checks or agreements is None:
        return NO_CHECKS
    if agreements < 0 or agreements > checks:
        raise ValueError(f"agreements must be in [0, {checks}], got {agreements}")
    rate = agreements / checks
    return PRECISION_BUCKETS[_precision_index(rate)]


def _precision_index(rate: float) -> int:
    for i, edge in enumerate(PRECISION_EDGES):
        if rate < edge:
            return i
    return len(PRECISION_EDGES)


def latency_bucket_index(ms: float | None) -> int | None:
    """Index of the first bound >= ``ms`` (len(bounds) = overflow). Negative ms: data error, None."""
    if ms is None or math.isnan(ms):
        return None
    if ms < 0:
        DATA_ERRORS.count(ERR_LATENCY)
        return None
    return bisect_left(LATENCY_BOUNDS_MS, ms)


def latency_bucket_index_array(ms: np.ndarray) -> np.ndarray:
    """Vectorised ``latency_bucket_index``: float array, NaN where the scalar returns None."""
    values = np.asarray(ms, dtype="float64")
    negative = values < 0
    DATA_ERRORS.count(ERR_LATENCY, int(negative.sum()))
    index = np.searchsorted(np.asarray(LATENCY_BOUNDS_MS, dtype="float64"), values, side="left")
    return np.where(np.isnan(values) | negative, np.nan, index.astype("float64"))


def latency_histogram(values_ms: Iterable[float | None]) -> list[int]:
    """Counts per latency bucket of the given latencies (None and invalid values skipped)."""
    hist = [0] * LATENCY_BUCKETS
    for ms in values_ms:
        index = latency_bucket_index(ms)
        if index is not None:
            hist[index] += 1
    return hist


def merge_histograms(hists: Iterable[Sequence[int]]) -> list[int]:
    """Bucket-wise sum of histograms (e.g. windows and dimensions of ``window_agg``)."""
    total = [0] * LATENCY_BUCKETS
    for hist in hists:
        if len(hist) != LATENCY_BUCKETS:
            raise ValueError(f"histogram must have {LATENCY_BUCKETS} buckets, got {len(hist)}")
        for i, count in enumerate(hist):
            total[i] += int(count)
    return total


def histogram_quantile(hist: Sequence[int], q: float,
                       bounds: Sequence[float] = LATENCY_BOUNDS_MS) -> float | None:
    """The ``q``-quantile of a bucketed histogram, interpolated linearly inside its bucket.

    As Prometheus does: the first bucket starts at 0, and a quantile landing in the
    overflow bucket is reported as the highest finite bound. None for an empty histogram.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    if len(hist) != len(bounds) + 1:
        raise ValueError(f"histogram must have {len(bounds) + 1} buckets, got {len(hist)}")
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(hist):
        if count and seen + count >= rank:
            if i == len(bounds):
                return float(bounds[-1])
            lower = 0.0 if i == 0 else float(bounds[i - 1])
            return lower + (float(bounds[i]) - lower) * (rank - seen) / count
        seen += count
    return float(bounds[-1])
