"""Statistics of ``vllm-eagle3 bench``: point estimates with 95 % bootstrap intervals, and the speedup models.

Data flow position: pure math between the measurements (``client.py``: one record per request; ``timers.py``: one
record per decode step) and the report (``report.py``). No vLLM; numpy for the resampling. Everything is
deterministic (each interval's resampling is seeded by the name of what it estimates), so re-rendering ``BENCHMARKS.md`` from the same
results file gives the same text (``tests/unit/test_docs_numbers.py`` relies on it).

- :class:`Estimate`: a value, its 95 % interval and how the interval was obtained;
- :func:`bootstrap`: percentile bootstrap of any statistic of a list of items (requests, prompts, steps);
- :func:`paired_ratio`: speedup = throughput with / without speculation, resampling *prompts* (both variants ran the
  same prompts, so each resample keeps a prompt's pair together: the prompt-to-prompt variation cancels);
- :func:`ideal_speedup`, :func:`cost_ratio`, :func:`break_even`: the step-cost models of the advice section.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import statistics
from typing import Callable, Sequence, TypeVar

NAN = float("nan")
RESAMPLES = 2000
LEVEL = 0.95

T = TypeVar("T")


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


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 1]) of an already sorted list."""
    if not sorted_xs:
        return NAN
    pos = q * (len(sorted_xs) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(sorted_xs) - 1)
    return sorted_xs[i] + (sorted_xs[j] - sorted_xs[i]) * (pos - i)


def bootstrap(items: Sequence[T], statistic: Callable[[Sequence[T]], float], seed: str, *,
              resamples: int = RESAMPLES, method: str = "bootstrap") -> Estimate:
    """``statistic(items)`` with a percentile-bootstrap 95 % interval: ``resamples`` times, draw ``len(items)``
    items with replacement and recompute. Fewer than 2 items: no interval. Non-finite resamples are dropped."""
    value = statistic(items) if items else NAN
    n = len(items)
    if n < 2 or not finite(value):
        return Estimate(value, NAN, NAN, n, method)
    rng = random.Random(seed)
    draws: list[float] = []
    for _ in range(resamples):
        x = statistic(rng.choices(items, k=n))
        if finite(x):
            draws.append(x)
    draws.sort()
    a = (1 - LEVEL) / 2
    return Estimate(value, percentile(draws, a), percentile(draws, 1 - a), n, method)


def mean(xs: Sequence[float]) -> float:
    ys = [x for x in xs if finite(x)]
    return statistics.fmean(ys) if ys else NAN


def median(xs: Sequence[float]) -> float:
    ys = [x for x in xs if finite(x)]
    return statistics.median(ys) if ys else NAN


def ratio_of_sums(pairs: Sequence[tuple[float, float]]) -> float:
    """sum(a) / sum(b) over ``(a, b)`` pairs (NaN when the denominator is 0)."""
    den = sum(b for _, b in pairs)
    return sum(a for a, _ in pairs) / den if den else NAN


def paired_ratio(with_: dict[int, tuple[float, float]], without: dict[int, tuple[float, float]], seed: str,
                 *, method: str = "paired bootstrap over prompts") -> Estimate:
    """Throughput ratio ``(sum tokens / sum seconds) with`` over ``... without``, paired by prompt.

    ``with_`` and ``without`` map a prompt index to ``(tokens, seconds)`` of that prompt's request(s) in each
    variant (several rounds: summed). Only prompts measured in both count; each bootstrap resample draws prompts,
    so a prompt's two measurements stay together.
    """
    import numpy as np

    keys = sorted(set(with_) & set(without))
    m = np.array([[with_[k][0], with_[k][1], without[k][0], without[k][1]] for k in keys], dtype=float).reshape(-1, 4)

    def stat(rows: np.ndarray) -> np.ndarray:  # [..., n, 4] -> [...]
        t = rows.sum(axis=-2)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (t[..., 0] / t[..., 1]) / (t[..., 2] / t[..., 3])

    value = float(stat(m)) if len(keys) else NAN
    if len(keys) < 2 or not finite(value):
        return Estimate(value, NAN, NAN, len(keys), method)
    draws = stat(m[_rng(seed).integers(0, len(keys), size=(RESAMPLES, len(keys)))])
    return _interval(value, draws, len(keys), method)


def _rng(seed: str):
    import numpy as np

    return np.random.default_rng(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little"))


def _interval(value: float, draws, n: int, method: str) -> Estimate:
    import numpy as np

    draws = np.sort(draws[np.isfinite(draws)])
    if not len(draws):
        return Estimate(value, NAN, NAN, n, method)
    a = (1 - LEVEL) / 2
    return Estimate(value, percentile(draws.tolist(), a), percentile(draws.tolist(), 1 - a), n, method)


# ------------------------------------------------------------------------------------------------ step models

def ideal_speedup(tau: float, k: int, c: float, verify_factor: float = 1.0) -> float:
    """Speedup of speculative decoding over plain decoding if only the draft and the verification cost time.

    One speculative step emits ``tau`` tokens (acceptance length) and costs ``verify_factor`` target steps (the
    target forward over k+1 tokens per request, relative to a 1-token forward) plus ``k`` draft forwards of
    ``c`` target steps each. With ``verify_factor = 1`` this is the textbook ``tau / (1 + k c)`` (verification as
    cheap as one decode step, as on a GPU that is memory-bound at this batch).
    """
    if k < 0 or c < 0 or verify_factor <= 0:
        raise ValueError(f"ideal_speedup needs k >= 0, c >= 0 and verify_factor > 0, got k={k}, c={c}, "
                         f"verify_factor={verify_factor}")
    return tau / (verify_factor + k * c)


def cost_ratio(draft_ms_per_step: float, k: int, target_ms_per_step: float) -> float:
    """c = time of one draft forward / time of one target decode forward (no speculation, same batch)."""
    if k <= 0 or not target_ms_per_step > 0:
        return NAN
    return draft_ms_per_step / k / target_ms_per_step


def break_even(spec_step_ms: float, plain_step_ms: float) -> float:
    """The acceptance length under which speculation loses: a speculative step emits tau tokens in
    ``spec_step_ms``, a plain step 1 token in ``plain_step_ms``, so speculation wins iff
    tau > spec_step_ms / plain_step_ms. (The incident: 56.8 vs 90 tok/s = an acceptance below this.)"""
    if not (finite(spec_step_ms) and finite(plain_step_ms)) or plain_step_ms <= 0:
        return NAN
    return spec_step_ms / plain_step_ms


def stratified_ratio(num: Sequence[Sequence[float]], den: Sequence[Sequence[float]], seed: str, *,
                     resamples: int = RESAMPLES, method: str = "bootstrap over steps within each server") -> Estimate:
    """(mean over groups of the group means of ``num``) / (the same of ``den``), with a 95 % interval from
    resampling each group's items (e.g. decode steps) independently, group by group (a group = one server).

    With one group per side this is the plain two-sample ratio of means. The interval covers the step-to-step
    variation inside the servers measured, not the variation between server processes: compare two servers of
    the same configuration for that.
    """
    num = [list(g) for g in num if g]
    den = [list(g) for g in den if g]

    def stat(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
        x = sum(sum(g) / len(g) for g in a) / len(a)
        y = sum(sum(g) / len(g) for g in b) / len(b)
        return x / y if y else NAN

    if not num or not den:
        return NONE
    value = stat(num, den)
    n = min(len(g) for g in num + den)
    if n < 2:
        return Estimate(value, NAN, NAN, n, method)
    import numpy as np

    rng = _rng(seed)

    def side(groups: Sequence[Sequence[float]]):
        return sum(np.asarray(g)[rng.integers(0, len(g), size=(RESAMPLES, len(g)))].mean(axis=1)
                   for g in groups) / len(groups)

    with np.errstate(divide="ignore", invalid="ignore"):
        draws = side(num) / side(den)
    return _interval(value, draws, sum(len(g) for g in num + den), method)


def mean_ci(xs: Sequence[float], seed: str, method: str = "bootstrap over steps") -> Estimate:
    """Mean with a 95 % bootstrap interval (vectorised: a timed cell has hundreds of steps)."""
    import numpy as np

    ys = np.array([x for x in xs if finite(x)], dtype=float)
    if len(ys) == 0:
        return Estimate(NAN, NAN, NAN, 0, method)
    value = float(ys.mean())
    if len(ys) < 2:
        return Estimate(value, NAN, NAN, 1, method)
    return _interval(value, ys[_rng(seed).integers(0, len(ys), size=(RESAMPLES, len(ys)))].mean(axis=1), len(ys),
                     method)
