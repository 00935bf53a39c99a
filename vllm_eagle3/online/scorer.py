"""Scores a recorded request on every candidate wiring: the draft's first step, teacher-forced, as vLLM runs it.

Data flow position: inside the engine, when a followed request ends (:mod:`vllm_eagle3.online.engine_hook`).
Input: a :class:`vllm_eagle3.online.traces.Trace` (confirmed tokens, the target's taps at each position). Output:
the anchor count and, per candidate, how many anchors the draft's first token equals the token the target produced
there. The head is the plain-PyTorch reference (:class:`vllm_eagle3.reference.Eagle3Draft`, the same forward as vLLM's
``llama_eagle3`` / ``deepseek_eagle3`` first step, held to vLLM by tests/parity/test_draft_parity.py) loaded in
float32 from the served draft's folder, with the target's embedding table (vLLM shares it with the draft). A hub id
(``moonshotai/Kimi-K2.5``) is read from the Hugging Face cache vLLM downloaded it to (:mod:`vllm_eagle3.model_files`);
files not found stop the check at start with one line naming the fix, never the engine.

At row i the draft reads the target's taps at position i (in the candidate's order) and the token at i + 1, attends
causally over the recorded rows, and predicts the token at i + 2. Rows before the first recorded position (a
prefix-cache hit) are not seen by this replay; every candidate is scored on the same rows, so the comparison stays
paired. Queries, MLP and logits are computed from the first anchor row on (keys and values for every row).

Candidates are scored together, as one batch (11 candidates of the shipped miniature: one forward of about 60 ops
instead of 11, 2.5x less time; inside the engine every op also waits for the GIL, so fewer ops matter more there),
in groups whose float32 activations stay under :data:`GROUP_BYTES` (a 2048-position trace of a full-size head is
scored one candidate at a time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from vllm_eagle3.model_files import model_folder
from vllm_eagle3.online.traces import Trace
from vllm_eagle3.reference import Eagle3Draft

GROUP_BYTES = 256 << 20
"""Upper bound on one group's activations (float32 attention scores, fc input, MLP and logits of every candidate)."""


def group_size(config, rows: int, queries: int, candidates: int) -> int:
    """Candidates per batch so that one batch's activations stay under :data:`GROUP_BYTES` (at least one)."""
    c = config
    per = 4 * (
        3 * c.num_attention_heads * queries * rows  # scores, softmax, their grad-free copy
        + rows * (c.num_aux_hidden_states * c.target_hidden_size + 6 * c.hidden_size)  # taps, fc, qkv inputs
        + queries * (3 * c.intermediate_size + c.draft_vocab_size)
    )  # MLP, logits
    return max(1, min(candidates, GROUP_BYTES // max(per, 1)))


class Scorer:
    def __init__(
        self,
        draft: str | Path,
        target: str | Path,
        candidates: Sequence[Sequence[int]],
        *,
        draft_revision: str | None = None,
        target_revision: str | None = None,
        cache_dir: str | Path | None = None,
    ) -> None:
        """``draft`` / ``target``: folders or hub ids, as vLLM's ``speculative_config.model`` / ``--model``
        (``*_revision``: vLLM's revisions; ``cache_dir``: its ``--download-dir``). Raises
        :class:`vllm_eagle3.model_files.ModelFilesNotFound` (the fix in its message) when the files are not here."""
        draft_dir = model_folder(draft, what="draft", revision=draft_revision, cache_dir=cache_dir)
        target_dir = model_folder(target, what="target", revision=target_revision, cache_dir=cache_dir)
        self.head = Eagle3Draft.from_dir(draft_dir, target_dir, dtype=torch.float32)
        self.candidates = [tuple(c) for c in candidates]

    @torch.no_grad()
    def score(self, trace: Trace) -> tuple[int, list[int]]:
        """(anchors, matches per candidate) of one trace; (0, []) when it has no anchor."""
        tokens, taps = trace.materialize()
        t = int(tokens.numel())
        a0, a1 = max(0, trace.prompt_len - 2 - trace.start), t - 2  # anchor rows: labels at a0+2 .. t-1
        if a1 <= a0:
            return 0, []
        head = self.head
        nxt = tokens[1:].long()[None]  # row i reads token i + 1
        positions = (trace.start + torch.arange(t - 1))[None]
        embeds = head.embed_tokens(nxt)
        labels = tokens[a0 + 2 :].long()
        g = group_size(head.config, t - 1, t - 1 - a0, len(self.candidates))
        matches = []
        for first in range(0, len(self.candidates), g):
            group = self.candidates[first : first + g]
            aux = torch.stack([torch.cat([taps[k][: t - 1] for k in cand], -1) for cand in group]).float()
            b = len(group)  # [b, t-1, n * H]
            logits, _ = head.unroll(
                aux, next_embeds=embeds.expand(b, -1, -1), positions=positions.expand(b, -1), query_from=a0
            )[0]
            pred = head.draft_to_target[logits[:, : a1 - a0].argmax(-1)]  # the last row has no label yet
            matches.extend(int(m) for m in (pred == labels).sum(-1).tolist())
        return a1 - a0, matches
