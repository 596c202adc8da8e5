"""The scoring formula of SPEC §5 — the only place it is written down.

``score(d) = Σ_t idf(t) · tf·(k1+1) / (tf + k1·(1 − b + b·dl/max(avgdl, 1)))`` over the query's
tokens (a repeated query token counts again), with ``idf(t) = ln(1 + (N − df + 0.5)/(df + 0.5))``,
then times :func:`recency_factor`. Everything is float64. :func:`term_score` is plain arithmetic
so the index can apply it to whole numpy posting columns as well as to single numbers.
"""

from __future__ import annotations

import math

K1 = 1.2
B = 0.75
RECENCY_BOOST = 0.15
RECENCY_HALF_LIFE_DAYS = 30.0
SECONDS_PER_DAY = 86400.0


def idf(n_docs: int, df: int) -> float:
    """``ln(1 + (N − df + 0.5)/(df + 0.5))`` — always > 0 because ``df ≤ N``."""
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def term_score(idf_t, tf, dl, avgdl: float):
    """One query token's contribution to a document of ``dl`` tokens holding it ``tf`` times.

    ``tf`` and ``dl`` may be floats or float64 numpy arrays of equal shape.
    """
    return idf_t * (tf * (K1 + 1.0)) / (tf + K1 * (1.0 - B + B * dl / max(avgdl, 1.0)))


def recency_factor(created_at: float | None, now: float) -> float:
    """``1 + 0.15 · 0.5^(age_days/30)`` for a session created at ``created_at`` (unix seconds).

    Missing ``created_at`` → 1.0; a session from the future counts as age 0 → 1.15.
    """
    if created_at is None:
        return 1.0
    age_days = max(now - created_at, 0.0) / SECONDS_PER_DAY
    return 1.0 + RECENCY_BOOST * 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)


def recency_factors(created_at, now: float):
    """:func:`recency_factor` of each of a float64 numpy array of ``created_at`` (NaN: missing)."""
    from memfs.search.numpy_once import np

    age_days = np.maximum(now - created_at, 0.0) / SECONDS_PER_DAY
    factors = 1.0 + RECENCY_BOOST * 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)
    factors[np.isnan(created_at)] = 1.0
    return factors
