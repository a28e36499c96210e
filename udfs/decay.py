"""Similarity decay: a stale match counts less than a fresh one.

    sim_decay(s, a) = s * decay_factor ** (a / max_age_s)   for 0 <= a <= max_age_s
                    = 0.0                                    for a >  max_age_s (expired)

With the defaults (0.85, 3600 s) a match one hour old keeps 85 % of its similarity and
anything older counts as expired. Inputs: cosine similarity s in [-1, 1] (a tolerance of
SIM_TOLERANCE absorbs float rounding of normalised vectors) and the cached entry's age a
in seconds. None in -> None out; s out of range, NaN or a < 0 are data errors: None out,
counted in udfs.errors.DATA_ERRORS.
"""
from __future__ import annotations

import math

import numpy as np

from udfs.errors import DATA_ERRORS

DECAY_FACTOR = 0.85
MAX_AGE_S = 3600.0
SIM_TOLERANCE = 1e-6
"""|s| up to 1 + SIM_TOLERANCE is rounding of unit vectors, clamped to +-1, not an error."""

ERR_SIMILARITY = "sim_decay.similarity_out_of_range"
ERR_AGE = "sim_decay.negative_age"


def sim_decay(similarity: float | None, age_s: float | None,
              decay_factor: float = DECAY_FACTOR, max_age_s: float = MAX_AGE_S) -> float | None:
    """Decayed similarity of a match ``age_s`` seconds old (formula in the module doc)."""
    if similarity is None or age_s is None:
        return None
    if math.isnan(similarity) or abs(similarity) > 1.0 + SIM_TOLERANCE:
        DATA_ERRORS.count(ERR_SIMILARITY)
        return None
    if math.isnan(age_s) or age_s < 0:
        DATA_ERRORS.count(ERR_AGE)
        return None
    if age_s > max_age_s:
        return 0.0
    clamped = max(-1.0, min(1.0, similarity))
    return clamped * decay_factor ** (age_s / max_age_s)


def sim_decay_array(similarity: np.ndarray, age_s: np.ndarray,
                    decay_factor: float = DECAY_FACTOR, max_age_s: float = MAX_AGE_S) -> np.ndarray:
    """Vectorised ``sim_decay``: NaN stands for None, in and out; errors are counted."""
    sim = np.asarray(similarity, dtype="float64")
    age = np.asarray(age_s, dtype="float64")
    present = ~np.isnan(sim) & ~np.isnan(age)
    bad_sim = present & (np.abs(sim) > 1.0 + SIM_TOLERANCE)
    bad_age = present & ~bad_sim & (age < 0)
    DATA_ERRORS.count(ERR_SIMILARITY, int(bad_sim.sum()))
    DATA_ERRORS.count(ERR_AGE, int(bad_age.sum()))
    with np.errstate(invalid="ignore"):
        decayed = np.clip(sim, -1.0, 1.0) * np.power(decay_factor, age / max_age_s)
    decayed = np.where(age > max_age_s, 0.0, decayed)
    return np.where(present & ~bad_sim & ~bad_age, decayed, np.nan)
