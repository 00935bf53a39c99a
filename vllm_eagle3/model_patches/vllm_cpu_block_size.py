"""vLLM-CPU: let the CPU attention backend declare kernel block sizes in multiples of 16, not 32.

Why: a DeepSeek/Kimi target uses CPU_MLA, which only supports block size 16; a Llama-style EAGLE-3 draft
uses CPU_ATTN, whose ``get_supported_kernel_block_sizes`` declares ``MultipleOf(32)``. vLLM then finds no
common block size and refuses to start:
``ValueError: No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])``
(``vllm/v1/worker/utils.py``). The CPU attention kernels already handle 16-token blocks
(``cpu_attn._get_attn_isa`` selects the "vec16" ISA for them), so declaring ``MultipleOf(16)`` is all that
is missing; with it, greedy output with the draft equals the non-speculative output (tests/e2e).

Retire when: vLLM's ``CPUAttentionBackend.get_supported_kernel_block_sizes`` declares 16-token blocks
upstream (vllm/v1/attention/backends/cpu_attn.py); re-check on every supported vLLM version.

Only applied on the CPU platform: GPU backends are untouched.
"""

from __future__ import annotations

from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

_MARK = "_vllm_eagle3_block_size_16"


def _apply() -> str:
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    current = CPUAttentionBackend.get_supported_kernel_block_sizes
    if getattr(current, _MARK, False):  # patched already (e.g. by another copy of this module)
        return "already declared MultipleOf(16)"
    before = current()

    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        return [MultipleOf(16)]

    setattr(get_supported_kernel_block_sizes, _MARK, True)
    CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(get_supported_kernel_block_sizes)
    return f"CPUAttentionBackend.get_supported_kernel_block_sizes: {before} -> [MultipleOf(16)]"


PATCH = Patch(
    name="vllm_cpu_block_size",
    engine="vllm",
    supported=supported_vllm_before("0.34"),
    retire_when="vLLM's CPU_ATTN declaring 16-token kernel blocks (v1/attention/backends/cpu_attn.py)",
    apply_fn=_apply,
    needed_fn=vllm_cpu_only,
)
