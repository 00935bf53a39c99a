"""Statistics the sampling tests share (test support): a goodness-of-fit test of sampled tokens against the exact
distribution they should follow.

Data flow position: after serving; the tests compare what a speculative engine sampled with the target's own
distribution (the rejection sampler must leave it unchanged).
"""

from __future__ import annotations

from collections import Counter

MIN_EXPECTED = 5.0
"""Pearson's chi-square is trusted where every category expects at least this many counts (the usual rule)."""


def chi_square(observed: Counter, expected_p: dict, n: int) -> tuple[float, int, float]:
    """Pearson chi-square of counts against probabilities; categories with expected < :data:`MIN_EXPECTED` pooled
    (the smallest first, until the pool reaches it). Returns (statistic, degrees of freedom, p-value)."""
    import torch

    bins: list[tuple[float, float]] = []  # (observed, expected)
    pool_o = pool_e = 0.0
    for c in sorted(expected_p, key=lambda c: expected_p[c]):
        e, o = expected_p[c] * n, observed.get(c, 0)
        if e < MIN_EXPECTED and pool_e < MIN_EXPECTED:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            bins.append((o, e))
    if pool_e > 0:
        bins.append((pool_o, pool_e))
    stat = sum((o - e) ** 2 / e for o, e in bins)
    df = len(bins) - 1
    p_value = float(
        torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )
    return stat, df, p_value
