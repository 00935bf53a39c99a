"""Simulated EAGLE-3 acceptance: chains drafted exactly as vLLM's proposer drafts them, scored as a server scores them.

Where it sits: evaluate.py's engine room. ``chain_eval`` runs the target (teacher.target_outputs) and the head
(draft.Eagle3Draft.unroll) over sequences and records, per anchor, which of the k = 1..MAX_K chained drafts
equal the target's greedy tokens. Two summaries of those matches:

* ``ChainStats``: every anchor counted once (per-position acceptance j = fraction of anchors whose first j
  drafts were all accepted; acceptance length(k) = 1 + sum of the first k);
* ``served_walk`` / ``walk_summary``: the anchors a greedy server visits (draft after prefill, accept the
  leading matches a, draft again a + 1 tokens later), pooled as 1 + accepted / drafts, which is what vLLM's
  ``/metrics`` counters measure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .core import Eagle3Draft
from .teacher import shifted, target_outputs

MAX_K = 5


@dataclass
class ChainStats:
    """Counts for simulated chain acceptance: ``accepted_at[j]`` anchors whose first j+1 drafts all matched."""

    anchors: int = 0
    accepted_at: list[int] = field(default_factory=list)

    def add(self, match: torch.Tensor) -> None:
        """``match`` [N, k] bool: draft step j matched the target's greedy token, per anchor."""
        run = match.long().cumprod(dim=1)
        if not self.accepted_at:
            self.accepted_at = [0] * match.shape[1]
        for j in range(match.shape[1]):
            self.accepted_at[j] += int(run[:, j].sum())
        self.anchors += match.shape[0]

    def per_position(self) -> list[float]:
        return [a / max(1, self.anchors) for a in self.accepted_at]

    def acceptance_length(self, k: int) -> float:
        """Mean tokens per target forward with k drafts: 1 (bonus) + accepted drafts."""
        return 1.0 + sum(self.per_position()[:k])

    def summary(self) -> dict[str, Any]:
        pp = self.per_position()
        return {
            "anchors": self.anchors,
            "per_position_acceptance": pp,
            "acceptance_length": {str(k): self.acceptance_length(k) for k in range(1, len(pp) + 1)},
        }


def served_walk(match: torch.Tensor, k: int) -> tuple[int, int]:
    """(drafts, accepted drafts) of ONE sequence served greedily with ``k`` draft tokens, as vLLM does it.

    ``match`` [A, >= k] bool: row i = the chain drafted at the i-th anchor after the prompt (anchor 0 = the
    proposal right after prefill), column j = its (j+1)-th draft equals the target's greedy token. vLLM drafts
    at anchor 0, accepts the leading matches ``a``, emits ``a + 1`` tokens (the bonus token is the target's),
    and drafts next at anchor ``i + a + 1``. Unlike the every-anchor average (:class:`ChainStats`), this visits
    the anchors a server visits: hard stretches (short advances) get more drafts, so it is what served
    ``/metrics`` counters estimate. Anchors whose chain runs past the known continuation end the walk.
    """
    drafts = accepted = 0
    i = 0
    while i < match.shape[0]:
        a = int(match[i, :k].long().cumprod(0).sum())
        drafts += 1
        accepted += a
        i += a + 1
    return drafts, accepted


def walk_summary(matches: torch.Tensor, ks: Sequence[int]) -> dict[str, Any]:
    """:func:`served_walk` for every sequence of ``matches`` [N, A, K] and every k: per-sequence (drafts,
    accepted) and the pooled acceptance length 1 + accepted / drafts (what vLLM's counters give)."""
    out: dict[str, Any] = {}
    for k in ks:
        per = [served_walk(m, k) for m in matches]
        d, a = sum(x for x, _ in per), sum(y for _, y in per)
        out[str(k)] = {
            "drafts": d,
            "accepted": a,
            "acceptance_length": 1.0 + a / max(1, d),
            "per_sequence": [list(x) for x in per],
        }
    return out


@torch.no_grad()
def chain_eval(target, draft: Eagle3Draft, seqs: torch.Tensor, spec, first_anchor: int, batch: int):
    """(ChainStats over anchors first_anchor..T-1-MAX_K, per-step top-1 agreement over all valid rows,
    per-sequence matches [N, anchors, MAX_K] bool for :func:`served_walk`)."""
    stats = ChainStats()
    agree = [0] * MAX_K
    count = [0] * MAX_K
    matches = []
    d2t_ids = draft.draft_to_target
    for i in range(0, seqs.shape[0], batch):
        ids = seqs[i : i + batch]
        t = ids.shape[1]
        taps, logits = target_outputs(target, ids, spec)
        greedy = logits.argmax(-1)  # row r: target's token r + 1
        outs = draft.unroll(taps, shifted(ids), MAX_K)
        preds = [d2t_ids[dl.argmax(-1)] for dl, _ in outs]  # step j at row r predicts token r + j + 1
        for j, pj in enumerate(preds, start=1):
            ok = pj[:, first_anchor : t - j] == greedy[:, first_anchor + j :]
            agree[j - 1] += int(ok.sum())
            count[j - 1] += ok.numel()
        last = t - MAX_K  # anchors r with r + MAX_K <= t - 1
        match = torch.stack(
            [preds[j - 1][:, first_anchor:last] == greedy[:, first_anchor + j : last + j] for j in range(1, MAX_K + 1)],
            dim=-1,
        )  # [B, anchors, K]
        stats.add(match.reshape(-1, MAX_K))
        matches.append(match.cpu())
    return stats, [a / max(1, c) for a, c in zip(agree, count)], torch.cat(matches)
