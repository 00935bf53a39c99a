"""The doctor's verdict statistics (vllm_eagle3/tools/doctor/stats.py) on synthetic chain matches, no model.

The bug it guards: on the shipped pair the doctor answered "inconclusive" and printed config lines for an
unconfirmed neighbour wiring ([embed, 4, 31] at 0.593 vs 0.580 top-1), so a user following it would rewrite a
correct config. Verdicts must be in acceptance terms: OK when the configured wiring is within the tolerance of the
best (interchangeable neighbours included), costs only when significantly worse, wrong when acceptance collapses,
undecided (with the text needed) only when the interval straddles the tolerance; a config to adopt only when the
better wiring is significantly better. The words are those of vllm_eagle3.verdicts (the watch's and the check's).
"""

from __future__ import annotations

import pytest
import torch

from vllm_eagle3 import verdicts
from vllm_eagle3.tools.doctor import stats as S

pytestmark = pytest.mark.unit

K = 3


def matches(
    n_seq: int, anchors: int, p: float, seed: int, base: torch.Tensor | None = None, flip: float = 0.0
) -> torch.Tensor:
    """[N, A, 5] bool chains: each step accepted with probability p (independently), or ``base`` with a fraction
    ``flip`` of its anchors redrawn (a correlated neighbour wiring: same hard positions)."""
    g = torch.Generator().manual_seed(seed)
    fresh = torch.rand(n_seq, anchors, 5, generator=g) < p
    if base is None:
        return fresh
    redraw = torch.rand(n_seq, anchors, 1, generator=g) < flip
    return torch.where(redraw, fresh, base)


def chains(taps, m) -> S.WiringChains:
    return S.WiringChains.from_matches(taps, str(taps), "test", m, K)


def test_acceptance_length_matches_the_model_card_definition():
    """AL(k) = 1 + sum of the first k per-position acceptances (acceptance.ChainStats), p0 = first step."""
    from vllm_eagle3.reference.acceptance import ChainStats

    m = matches(12, 50, 0.6, 0)
    stats = ChainStats()
    stats.add(m.reshape(-1, 5))
    c = chains((0, 3, 31), m)
    assert c.acceptance_length == pytest.approx(stats.acceptance_length(K))
    assert c.p0 == pytest.approx(stats.per_position()[0])


def test_the_right_wiring_and_an_interchangeable_neighbour_are_ok_and_nothing_to_adopt():
    """The shipped pair's case: a +-1 neighbour that agrees on most anchors scores a hair higher by chance."""
    right = matches(32, 120, 0.6, 1)
    neighbour = matches(32, 120, 0.6, 2, base=right, flip=0.08)
    v = S.judge(chains((0, 3, 31), right), [chains((0, 4, 31), neighbour), chains((0, 3, 31), right)])
    assert v.kind == verdicts.OK, v
    assert v.loss.high <= S.TOLERANCE and not v.best_is_better
    assert S.exit_code(v.kind) == 0


def test_a_significantly_worse_wiring_costs_and_names_the_better_one():
    good = matches(40, 120, 0.6, 3)
    worse = matches(40, 120, 0.45, 4, base=good, flip=0.5)
    v = S.judge(chains((0, 2, 30), worse), [chains((0, 3, 31), good)])
    assert v.kind == verdicts.COSTS and v.loss.low > S.TOLERANCE and v.best_is_better
    assert v.best.taps == (0, 3, 31)
    assert S.exit_code(v.kind) == 3


def test_the_incident_wiring_is_wrong():
    """Taps [3, 31, 59] for a head trained on [embed, 3, 31]: ~0.1 % position-0 acceptance."""
    good = matches(32, 120, 0.6, 5)
    incident = matches(32, 120, 0.001, 6)
    v = S.judge(chains((3, 31, 59), incident), [chains((0, 3, 31), good)])
    assert v.kind == verdicts.WRONG and v.gain_ratio.high < verdicts.COLLAPSE_RATIO and v.best_is_better
    assert S.exit_code(v.kind) == 4


def test_too_little_text_is_undecided_and_says_how_much_more():
    """A slightly worse wiring measured on little text, judged with a tolerance equal to its measured loss: the
    interval straddles the tolerance by construction."""
    good = matches(10, 30, 0.6, 7)
    near = matches(10, 30, 0.45, 8, base=good, flip=0.25)
    tol = near_loss(near, good)
    assert tol > 0
    v = S.judge(chains((0, 2, 30), near), [chains((0, 3, 31), good)], tolerance=tol)
    assert v.kind == verdicts.UNDECIDED, v
    assert v.more_text is not None and v.more_text > 1
    assert not v.best_is_better
    assert S.exit_code(v.kind) == 5
    assert S.needed_tokens(1280, v.more_text) > 1280


def near_loss(m, best) -> float:
    """The relative acceptance-length loss of ``m`` against ``best`` (point estimate)."""
    return 1 - chains((0,), m).acceptance_length / chains((1,), best).acceptance_length


def test_an_untrained_head_is_no_wiring_works():
    a = matches(16, 60, 0.005, 9)
    b = matches(16, 60, 0.005, 10)
    v = S.judge(chains((0, 3, 31), a), [chains((0, 4, 31), b)])
    assert v.kind == verdicts.NO_WIRING_WORKS
    assert S.exit_code(v.kind) == 6


def test_exit_codes_are_distinct_and_worst_wins():
    kinds = [verdicts.OK, verdicts.COSTS, verdicts.WRONG, verdicts.UNDECIDED, verdicts.NO_WIRING_WORKS]
    assert len({S.exit_code(k) for k in kinds}) == len(kinds)
    assert S.exit_code(verdicts.OK) == 0 and all(S.exit_code(k) not in (0, 1, 2) for k in kinds[1:])
    assert S.exit_code(verdicts.PENDING) == S.exit_code(verdicts.UNDECIDED)
    assert S.worst([verdicts.OK, verdicts.WRONG, verdicts.COSTS]) == verdicts.WRONG
    assert (
        S.worst([verdicts.OK, verdicts.UNDECIDED]) == verdicts.UNDECIDED
        and S.worst([verdicts.OK, verdicts.PENDING]) == verdicts.PENDING
    )


def test_too_few_sequences_are_pending():
    """Guards: a verdict from a bootstrap over fewer sequences than it can resample meaningfully: pending (the
    check's word for fewer requests than its minimum), with the text needed."""
    good = matches(S.MIN_SEQUENCES - 2, 60, 0.6, 13)
    v = S.judge(chains((0, 2, 30), matches(S.MIN_SEQUENCES - 2, 60, 0.001, 14)), [chains((0, 3, 31), good)])
    assert v.kind == verdicts.PENDING and v.more_text == S.MIN_SEQUENCES / (S.MIN_SEQUENCES - 2)


def test_the_bootstrap_is_paired_and_seeded():
    """Pairing: a neighbour identical on 95 % of anchors has a far narrower loss interval than the anchors'
    own spread would give; seeding: the same matches give the same verdict."""
    right = matches(24, 100, 0.55, 11)
    neighbour = matches(24, 100, 0.55, 12, base=right, flip=0.05)
    v1 = S.judge(chains((0, 3, 31), right), [chains((0, 4, 31), neighbour)])
    v2 = S.judge(chains((0, 3, 31), right), [chains((0, 4, 31), neighbour)])
    assert v1.loss == v2.loss
    w = S.resample_weights(24)
    al = 1 + (w @ chains((0, 3, 31), right).accepted) / (w @ chains((0, 3, 31), right).anchors)
    unpaired_width = 2 * float(al.std() / al.mean()) * 1.96
    assert v1.loss.high - v1.loss.low < unpaired_width / 2
