"""What the target hands its EAGLE-3 head: taps + logits, the head's shifted token inputs, greedy continuations.

Where it sits: between the trained target (export.load_text_model) and both users of its outputs,
train_draft.py (distillation batches, self-distillation data) and acceptance.py / evaluate.py (chains
drafted on held-out text and on the target's greedy output). Kept in one module so neither of those
imports the other.

* ``target_outputs``: tap k = the hidden state entering decoder layer k = HF ``output_hidden_states[k]``,
  concatenated in the capture spec's order (the order the head's ``fc`` was trained on);
* ``shifted``: row i -> token i + 1, what vLLM feeds the draft at position i;
* ``greedy_continue``: the target's argmax continuation (KV-cached, tested equal to full recomputation).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from vllm_eagle3.spec import CaptureSpec

DEFAULT_SPEC = Path(__file__).resolve().parents[2] / "configs" / "kimi_k25_eagle3.yaml"


def target_outputs(model, ids: torch.Tensor, spec: CaptureSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(taps ``cat([hidden_states[t] for t in spec.taps])`` [B, T, n * H], logits [B, T, V]) of the target."""
    spec.check_num_layers(model.config.num_hidden_layers)
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    taps = torch.cat([out.hidden_states[t] for t in spec.taps], dim=-1)
    return taps.float(), out.logits.float()


def shifted(ids: torch.Tensor) -> torch.Tensor:
    """Row i -> token i + 1 (what vLLM feeds the draft); the last row gets 0 (padding)."""
    return torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)


@torch.no_grad()
def greedy_continue(
    model,
    prompts: torch.Tensor,
    new_tokens: int,
    batch: int,
    use_cache: bool = True,
    progress: str | None = None,
    time_budget_s: float = 0.0,
) -> torch.Tensor:
    """[N, P + new_tokens]: prompts followed by the target's argmax tokens (no EOS stop).

    ``use_cache`` decodes one token per forward over transformers' KV cache (the fast path, used for training
    data); ``False`` re-runs the whole sequence per token (the reference the cached path is tested against).
    ``progress`` (a label) prints one line per batch. ``time_budget_s`` (> 0) starts no new batch after that many
    seconds: N is then the prompts of the batches done.
    """
    outs = []
    t0 = time.time()
    for i in range(0, prompts.shape[0], batch):
        if time_budget_s and time.time() - t0 > time_budget_s:
            print(
                f"[{progress or 'greedy'}] time budget {time_budget_s:.0f}s reached after {i} of "
                f"{prompts.shape[0]} prompts",
                flush=True,
            )
            break
        seq = prompts[i : i + batch]
        if use_cache:
            out = model(input_ids=seq, use_cache=True)
            tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
            for _ in range(new_tokens - 1):
                out = model(input_ids=tokens[-1], past_key_values=out.past_key_values, use_cache=True)
                tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
            seq = torch.cat([seq, *tokens[:new_tokens]], dim=1)
        else:
            for _ in range(new_tokens):
                nxt = model(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)
                seq = torch.cat([seq, nxt], dim=1)
        outs.append(seq)
        if progress:
            done = min(i + batch, prompts.shape[0])
            print(
                f"[{progress}] {done}/{prompts.shape[0]} prompts continued by {new_tokens} greedy tokens "
                f"({time.time() - t0:.0f}s)",
                flush=True,
            )
    return torch.cat(outs)
