"""Statistics of ``vllm-eagle3 bench``: point estimates with 95 % bootstrap intervals, and the speedup models. One
resampler, :func:`draws` (the doctor's paired bootstrap uses it too), seeded by the name of what is estimated, so the
same results file always renders the same ``BENCHMARKS.md`` (``tests/unit/test_docs_numbers.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Callable, Sequence

import numpy as np

NAN = float("nan")
RESAMPLES = 2000
LEVEL = 0.95


def finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95 % interval ``[lo, hi]`` over ``n`` resampled items (``method`` says which)."""

    value: float
    lo: float = NAN
    hi: float = NAN
    n: int = 0
    method: str = ""

    def fmt(self, digits: int = 2) -> str:
        """``1.23 [1.10-1.35]``; ``n/a`` without a value; the bare value without an interval."""
        if not finite(self.value):
            return "n/a"
        if not (finite(self.lo) and finite(self.hi)):
            return f"{self.value:.{digits}f}"
        return f"{self.value:.{digits}f} [{self.lo:.{digits}f}-{self.hi:.{digits}f}]"

    def excludes(self, x: float) -> bool:
        """Whether ``x`` lies outside the interval (e.g. 1.0 for a ratio: the difference is not noise)."""
        return finite(self.lo) and finite(self.hi) and not (self.lo <= x <= self.hi)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Estimate":
        return cls(**d) if d else cls(NAN)


NONE = Estimate(NAN)


def draws(seed: str, *sizes: int, resamples: int = RESAMPLES) -> list[np.ndarray]:
    """The one resampler: per group of ``sizes[i]`` items, ``[resamples, sizes[i]]`` indices drawn with replacement,
    all from one generator seeded by the name ``seed``."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little"))
    return [rng.integers(0, n, size=(resamples, n)) for n in sizes]


def interval(value: float, replicates: np.ndarray, n: int, method: str) -> Estimate:
    """``value`` with the percentile interval of its bootstrap ``replicates`` (non-finite ones dropped)."""
    reps = replicates[np.isfinite(replicates)]
    if not len(reps):
        return Estimate(value, NAN, NAN, n, method)
    lo, hi = np.percentile(reps, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return Estimate(value, float(lo), float(hi), n, method)


def bootstrap(
    items: Sequence, statistic: Callable[[np.ndarray], np.ndarray], seed: str, *, method: str = "bootstrap"
) -> Estimate:
    """``statistic(items)`` with a percentile-bootstrap 95 % interval. ``items`` ``[n]`` or ``[n, m]`` (rows resampled
    together); ``statistic`` reduces the item axis of all resamples at once. Fewer than 2 items: no interval."""
    x = np.asarray(items, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(statistic(x)) if len(x) else NAN
        if len(x) < 2 or not finite(value):
            return Estimate(value, NAN, NAN, len(x), method)
        return interval(value, statistic(x[draws(seed, len(x))[0]]), len(x), method)


def ratio_of_sums(rows: np.ndarray) -> np.ndarray:
    """``[..., n, 2]`` (a, b) rows -> sum(a) / sum(b)."""
    t = rows.sum(axis=-2)
    return t[..., 0] / t[..., 1]


def paired_ratio(
    with_: dict[int, tuple[float, float]],
    without: dict[int, tuple[float, float]],
    seed: str,
    *,
    method: str = "paired bootstrap over prompts",
) -> Estimate:
    """Throughput ratio ``with_`` / ``without`` (prompt -> (tokens, seconds), rounds summed), over the prompts in
    both; each resample draws prompts, keeping a prompt's two measurements together."""
    keys = sorted(set(with_) & set(without))
    m = np.array([[*with_[k], *without[k]] for k in keys], dtype=float).reshape(-1, 4)
    return bootstrap(m, lambda r: ratio_of_sums(r[..., :2]) / ratio_of_sums(r[..., 2:]), seed, method=method)


def mean_ci(xs: Sequence[float], seed: str, method: str = "bootstrap over steps") -> Estimate:
    """Mean with a 95 % bootstrap interval (a timed cell has hundreds of steps)."""
    return bootstrap([x for x in xs if finite(x)], lambda r: r.mean(axis=-1), seed, method=method)


def stratified_ratio(
    num: Sequence[Sequence[float]],
    den: Sequence[Sequence[float]],
    seed: str,
    *,
    method: str = "bootstrap over steps within each server",
) -> Estimate:
    """(mean of ``num``'s group means) / (the same of ``den``), each group's items (e.g. one server's decode steps)
    resampled independently: the interval covers step-to-step variation, not server-to-server (compare two servers
    of one configuration for that)."""
    groups = [np.asarray(g, dtype=float) for g in (*num, *den) if len(g)]
    split = sum(1 for g in num if len(g))
    if not split or split == len(groups):
        return NONE
    a, b = (sum(sum(g.tolist()) / len(g) for g in part) / len(part) for part in (groups[:split], groups[split:]))
    value = a / b if b else NAN
    n = min(len(g) for g in groups)
    if n < 2:
        return Estimate(value, NAN, NAN, n, method)
    means = [g[idx].mean(axis=1) for g, idx in zip(groups, draws(seed, *map(len, groups)))]
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = (sum(means[:split]) / split) / (sum(means[split:]) / (len(groups) - split))
    return interval(value, reps, sum(map(len, groups)), method)


def mean(xs: Sequence[float], of: Callable = np.mean) -> float:
    ys = [x for x in xs if finite(x)]
    return float(of(ys)) if ys else NAN


def median(xs: Sequence[float]) -> float:
    return mean(xs, np.median)


# ------------------------------------------------------------------------------------------------ step models


def ideal_speedup(tau: float, k: int, c: float, verify_factor: float = 1.0) -> float:
    """Speedup over plain decoding if only the draft and the verify cost time: a step emits ``tau`` tokens for
    ``verify_factor`` target steps (k+1 tokens per request vs 1) plus ``k`` drafts of ``c`` target steps each;
    ``verify_factor = 1``: the textbook ``tau / (1 + k c)``."""
    if k < 0 or c < 0 or verify_factor <= 0:
        raise ValueError(f"ideal_speedup needs k >= 0, c >= 0 and verify_factor > 0, got {k=}, {c=}, {verify_factor=}")
    return tau / (verify_factor + k * c)


def cost_ratio(draft_ms_per_step: float, k: int, target_ms_per_step: float) -> float:
    """c = time of one draft forward / time of one target decode forward (no speculation, same batch)."""
    return draft_ms_per_step / k / target_ms_per_step if k > 0 and target_ms_per_step > 0 else NAN
