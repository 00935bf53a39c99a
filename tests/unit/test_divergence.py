"""The bf16 criterion's arithmetic (vllm_eagle3/tools/divergence.py) on hand-made logits: a divergence is explained
only when both tokens are the float32 top-2 and their gap is within the bound.

Guards issue 25.3: "greedy speculative == plain" cannot be asserted in bf16; what replaces it must still fail on a
wrong token. The engine-level check (and a planted verify off-by-one it catches) is tests/e2e/test_bf16.py.
"""

import pytest
import torch

from vllm_eagle3.tools.divergence import first_divergence, judge, pair_noise

pytestmark = pytest.mark.unit

VOCAB = 8


def logits_with(top1: int, top2: int, gap: float):
    """A float32 logits function whose next-token top-2 is (top1, top2) with ``gap`` between them, everywhere."""

    def logits(ids):
        row = torch.zeros(VOCAB)
        row[top1], row[top2] = 5.0, 5.0 - gap
        return row

    return logits


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 4, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 9]) is None  # common length only


def test_identical_outputs_have_no_divergence():
    r = judge([[0]], [[1, 2, 3]], [[1, 2, 3]], logits_with(1, 2, 0.1), bound=0.5)
    assert r.divergences == [] and r.per_1000_tokens == 0 and r.largest_gap == 0 and not r.violations


def test_a_near_tie_swap_is_explained():
    r = judge([[0], [0]], [[1, 4, 9], [1, 2]], [[1, 3, 7], [1, 2]], logits_with(3, 4, 0.05), bound=0.5)
    (d,) = r.divergences
    assert (d.prompt, d.position, d.spec_token, d.plain_token) == (0, 1, 4, 3) and d.explained, d
    assert r.per_1000_tokens == pytest.approx(1000 / 5) and r.largest_gap == pytest.approx(0.05, abs=1e-5)
    assert "1 of 2 prompts diverge" in r.summary() and "0 not explained" in r.summary()


def test_a_token_outside_the_top2_is_a_violation():
    r = judge([[0]], [[1, 6]], [[1, 3]], logits_with(3, 4, 0.05), bound=0.5)
    (d,) = r.violations
    assert "not the float32 top-2 [3, 4]" in d.why


def test_a_swap_far_from_a_tie_is_a_violation():
    r = judge([[0]], [[4]], [[3]], logits_with(3, 4, 2.0), bound=0.5)
    (d,) = r.violations
    assert "gap 2.0000 > bound 0.5: not a near-tie" in d.why


def test_the_shared_prefix_is_what_the_logits_see():
    seen = []

    def logits(ids):
        seen.append(list(ids))
        return logits_with(3, 4, 0.1)(ids)

    judge([[7, 8]], [[1, 2, 4]], [[1, 2, 3]], logits, bound=0.5)
    assert seen == [[7, 8, 1, 2]]


def test_pair_noise():
    f32 = torch.tensor([[3.0, 1.0, 0.5], [0.0, 2.0, 1.75], [1.0, 0.0, 0.0]])  # float32 top-2 gaps 2.0, 0.25, 1.0
    # position 0: bf16 keeps the order, gap 2.0625 vs 2.0; position 1: bf16 SWAPS tokens 1 and 2 (gap -0.125 vs
    # +0.25: moved by 0.375, though its own top-2 gap is 0.125); position 2: float32's 2nd token not returned.
    bf16 = [{0: -0.1, 1: -2.1625}, {2: -0.5, 1: -0.625}, {0: -0.1}]
    worst, n = pair_noise(bf16, f32)
    assert n == 2 and worst == pytest.approx(0.375)
