"""Is the wiring I serve as good as the best one? Paired statistics and the verdict behind ``vllm-eagle3 doctor``.

Data flow position: after :mod:`vllm_eagle3.tools.doctor.measure` has drafted chains for each candidate wiring on the
SAME
sequences and anchors (per anchor: which of the k chained drafts equal the target's greedy tokens). This module
reduces those matches to what serving depends on, compares the configured wiring with the best one, and returns a
:class:`Reading`. No model, no engine: plain tensors, unit-tested on synthetic matches.

What is compared. For k = the served ``num_speculative_tokens``: the acceptance length ``AL(k) = 1 + mean over
anchors of the leading accepted drafts (at most k)`` (tokens emitted per target forward; the model card's
definition, :class:`vllm_eagle3.reference.acceptance.ChainStats`), and position-0 acceptance (first draft
accepted). Every wiring is scored at the same anchors, so the difference between two wirings is PAIRED: anchors
where any wiring fails (hard text) fail for both and cancel out of the difference.

Method: paired cluster bootstrap over sequences. Adjacent anchors are strongly correlated (a chain accepted at t is
mostly accepted at t + 1, a repetitive stretch makes many anchors easy at once), so anchors are not independent
samples and an anchor-level standard error would be too narrow. Sequences (held-out windows, or independent prompts
with their greedy continuations) are the blocks: each bootstrap replicate draws sequences with replacement and
recomputes BOTH wirings' ratio-of-sums on the same draw (pairing), giving a percentile interval of the relative
loss ``(AL_best - AL_configured) / AL_best``. The best wiring is picked on the same text, which biases the loss
upward (winner's curse): the test errs towards "not OK", never towards a false OK.

Verdicts, the words the watch and the online check use too (:mod:`vllm_eagle3.verdicts`, which also states and
justifies ``TOLERANCE``, ``COLLAPSE_RATIO`` and ``MIN_GAIN``):

* ``ok``: the upper end of the loss interval is within ``TOLERANCE`` (indistinguishable from the best, or at most
  that much worse);
* ``costs`` (printed ``COSTS x%``): the lower end of the interval is above ``TOLERANCE`` (significantly worse;
  x = the point estimate);
* ``wrong``: the configured wiring's speculative gain ``AL - 1`` is, at the upper end of its interval, below
  ``COLLAPSE_RATIO`` of the best's (acceptance collapsed: [3, 31, 59] for a head trained on [embed, 3, 31] keeps
  ~0.2 %);
* ``no wiring works``: even the best wiring's gain is below ``MIN_GAIN`` (untrained head, or one for another target);
* ``undecided``: the interval straddles ``TOLERANCE``; the text needed to decide is estimated from the interval's
  1/sqrt(n) shrinkage; ``pending``: fewer than ``MIN_SEQUENCES`` sequences, too few to judge at all.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from vllm_eagle3 import verdicts
from vllm_eagle3.verdicts import COLLAPSE_RATIO, MIN_GAIN, TOLERANCE

CONFIDENCE = 0.95
BOOTSTRAP = 2000
MIN_SEQUENCES = 8
"""Fewer independent sequences than this make a cluster bootstrap meaningless: refuse to judge (pending)."""

MAX_MORE = 100.0
"""Do not promise a text length more than this many times the one measured."""


@dataclasses.dataclass(frozen=True)
class WiringChains:
    """One wiring's chained drafts, reduced per sequence (the bootstrap's blocks)."""

    taps: tuple[int, ...]
    label: str
    why: str
    anchors: torch.Tensor  # [N] anchors per sequence
    first: torch.Tensor  # [N] anchors whose first draft was accepted
    accepted: torch.Tensor  # [N] leading accepted drafts (<= k) summed over anchors
    walk: torch.Tensor  # [N, 2] served walk (drafts, accepted) per sequence (:func:`acceptance.served_walk`)

    @classmethod
    def from_matches(cls, taps: Sequence[int], label: str, why: str, match: torch.Tensor, k: int) -> "WiringChains":
        """``match`` [N, A, >= k] bool: sequence, anchor, draft step == target's greedy token."""
        from vllm_eagle3.reference.acceptance import served_walk

        run = match[..., :k].long().cumprod(-1)  # [N, A, k]: step j and all before it accepted
        walk = torch.tensor([served_walk(m, k) for m in match], dtype=torch.float64).reshape(-1, 2)
        return cls(
            tuple(taps),
            label,
            why,
            torch.full((match.shape[0],), float(match.shape[1]), dtype=torch.float64),
            run[..., 0].sum(-1).double(),
            run.sum((-1, -2)).double(),
            walk,
        )

    @property
    def p0(self) -> float:
        return float(self.first.sum() / self.anchors.sum().clamp(min=1))

    @property
    def acceptance_length(self) -> float:
        return 1.0 + float(self.accepted.sum() / self.anchors.sum().clamp(min=1))

    @property
    def served_walk_length(self) -> float:
        return 1.0 + float(self.walk[:, 1].sum() / self.walk[:, 0].sum().clamp(min=1))


@dataclasses.dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float

    def fmt(self, scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
        return (
            f"{self.estimate * scale:.{digits}f}{unit} [{self.low * scale:.{digits}f}, {self.high * scale:.{digits}f}]"
        )


@dataclasses.dataclass(frozen=True)
class Reading:
    """The doctor's verdict on one configured wiring, with the intervals behind it."""

    kind: verdicts.Verdict  # ok | costs | wrong | no wiring works | undecided | pending
    configured: WiringChains
    best: WiringChains
    loss: Interval  # relative acceptance-length loss vs the best
    p0_diff: Interval  # best - configured position-0 acceptance (absolute)
    gain_ratio: Interval  # (AL_configured - 1) / (AL_best - 1)
    best_gain: Interval  # AL_best - 1
    sequences: int
    more_text: float | None  # undecided, pending: the text needed, as a multiple of the text measured
    equivalent: list[str]  # labels of wirings interchangeable with the configured one (within the tolerance)

    @property
    def best_is_better(self) -> bool:
        """The best wiring is significantly better than the configured one by more than the tolerance (the only
        case where the doctor prints a config to adopt)."""
        return self.kind in (verdicts.COSTS, verdicts.WRONG) and self.best.taps != self.configured.taps


def resample_weights(n: int, replicates: int = BOOTSTRAP, seed: str = "doctor") -> torch.Tensor:
    """[replicates, n] counts: how often each sequence is drawn in each bootstrap replicate, by the project's one
    resampler (:func:`vllm_eagle3.tools.bench.stats.draws`; seeded: the same text gives the same verdict)."""
    from vllm_eagle3.tools.bench.stats import draws

    idx = torch.from_numpy(draws(seed, n, resamples=replicates)[0])
    w = torch.zeros(replicates, n, dtype=torch.float64)
    return w.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))


def _interval(point: float, reps: torch.Tensor) -> Interval:
    a = (1 - CONFIDENCE) / 2
    q = torch.quantile(reps, torch.tensor([a, 1 - a], dtype=reps.dtype))
    return Interval(point, float(q[0]), float(q[1]))


def compare(
    configured: WiringChains, best: WiringChains, w: torch.Tensor
) -> tuple[Interval, Interval, Interval, Interval]:
    """(relative AL loss, p0 difference, gain ratio, best's gain) with paired bootstrap intervals over ``w``."""
    anchors = w @ configured.anchors  # same anchors for both wirings
    al_c = 1 + (w @ configured.accepted) / anchors
    al_b = 1 + (w @ best.accepted) / anchors
    p0 = (w @ best.first - w @ configured.first) / anchors
    eps = 1e-12
    loss = _interval(1 - configured.acceptance_length / best.acceptance_length, 1 - al_c / al_b)
    ratio = _interval(
        (configured.acceptance_length - 1) / max(best.acceptance_length - 1, eps),
        (al_c - 1) / (al_b - 1).clamp(min=eps),
    )
    return loss, _interval(best.p0 - configured.p0, p0), ratio, _interval(best.acceptance_length - 1, al_b - 1)


def judge(
    configured: WiringChains,
    candidates: Sequence[WiringChains],
    tolerance: float = TOLERANCE,
    replicates: int = BOOTSTRAP,
) -> Reading:
    """The verdict on ``configured`` against the best of ``candidates`` (which may include it)."""
    pool = list(candidates) + ([configured] if all(c.taps != configured.taps for c in candidates) else [])
    best = max(pool, key=lambda c: (c.acceptance_length, c.p0))
    n = int(configured.anchors.numel())
    w = resample_weights(n, replicates)
    loss, p0, ratio, gain = compare(configured, best, w)
    equivalent = [
        c.label
        for c in pool
        if c.taps != configured.taps  # neither significantly better by > tolerance
        and compare(configured, c, w)[0].low <= tolerance
        and compare(c, configured, w)[0].low <= tolerance
    ]
    more = None
    if n < MIN_SEQUENCES:
        kind, more = verdicts.PENDING, MIN_SEQUENCES / max(n, 1)
    elif gain.high < MIN_GAIN:
        kind = verdicts.NO_WIRING_WORKS
    elif ratio.high < COLLAPSE_RATIO:
        kind = verdicts.WRONG
    elif loss.high <= tolerance:
        kind = verdicts.OK
    elif loss.low > tolerance:
        kind = verdicts.COSTS
    else:
        kind = verdicts.UNDECIDED
        half = (loss.high - loss.low) / 2
        more = (half / max(abs(loss.estimate - tolerance), 1e-9)) ** 2
        more = min(max(more, 1.0), MAX_MORE)
    return Reading(kind, configured, best, loss, p0, ratio, gain, n, more, equivalent)


EXIT_CODES = {
    verdicts.OK: 0,
    verdicts.COSTS: 3,
    verdicts.WRONG: 4,
    verdicts.UNDECIDED: 5,
    verdicts.PENDING: 5,
    verdicts.NO_WIRING_WORKS: 6,
}
"""The doctor's exit status per verdict (1 is an input error, 2 a usage error)."""


def exit_code(kind: str) -> int:
    return EXIT_CODES[verdicts.entry(kind)]


def worst(kinds: Sequence[str]) -> verdicts.Verdict:
    """The most serious of several verdicts (several engine readings of one config; :func:`verdicts.worst`)."""
    return verdicts.worst(kinds)


def needed_tokens(tokens: int, more: float | None) -> int | None:
    return None if more is None else int(math.ceil(tokens * more / 64.0) * 64)
