"""vLLM-CPU (opt-in): verify speculative tokens on the CPU MLA *decode* kernel instead of its prefill path.

Why: ``vllm/v1/attention/backends/mla/cpu_mla.py`` (vLLM 0.32) keeps the MLA metadata builder's default
``query_len_support = SINGLE_ONLY``, so an EAGLE-3 verification step (k+1 query tokens per request) is classified as a
*prefill with context*: per layer and request, the cached latent KV is gathered and up-projected (``kv_b_proj``)
and attention runs as non-absorbed MHA (SDPA) + LSE merge. A plain decode step runs one ``mla_decode_kvcache_cpu``
call over the latent cache instead. `vllm-eagle3 bench` measured the verification forward at 2.2-5x a decode
forward, the largest cost of EAGLE-3 on this backend (BENCHMARKS.md, finding 3).

What this does: a metadata builder with ``query_len_support = UNIFORM`` (vLLM then sets the decode threshold to
1 + k, as its GPU MLA backends do) and a ``forward_mqa`` that runs the existing CPU decode kernel on one row per
*query token* (:func:`expand_decode_rows`): row j of a request of total length S attends to its first
S - (q_len - 1 - j) cached tokens, i.e. causal attention over the cache, which already holds the new tokens'
latents (vLLM writes the KV cache before attention). No new kernel. Measured (BENCHMARKS.md, k=3): EAGLE-3 speedup
1.74 / 1.51 / 1.22x at concurrency 1 / 4 / 16 instead of 1.11 / 0.82 / 0.51, greedy text unchanged.

Opt-in: set ``VLLM_EAGLE3_CPU_MLA_VERIFY_AS_DECODE=1`` (every vLLM process reads it; workers inherit it). It changes
which attention path runs, so it is off unless asked for. What the plugin installs is a switch read at every use
(:func:`enabled`), not at install time: a process that started an opted-in engine and later forks engines without
the variable must give those vLLM's own path; tests/e2e/test_mla_verify_decode.py checks greedy output
with it equals the target's greedy output. A batch whose decode requests have different query lengths cannot be
expanded: that raises, it is never computed approximately.

Retire when: vLLM's CPU MLA backend declares UNIFORM (or VARLEN) query lengths and verifies on its decode kernel
upstream; re-check on every supported vLLM version.
"""

from __future__ import annotations

import os

from model_patches import Patch, vllm_cpu_only

ENV = "VLLM_EAGLE3_CPU_MLA_VERIFY_AS_DECODE"
_MARK = "_vllm_eagle3_mla_verify_decode"


def opted_in(environ=None) -> bool:
    """Whether :data:`ENV` asks for the patch ("1"); "", "0" or unset: no. Anything else is a clear error."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}={value!r}: use 1 to verify speculative tokens on vLLM-CPU's MLA decode kernel, "
                         "0 or unset for vLLM's own path")
    return value == "1"


def expand_decode_rows(block_table, seq_lens, q_len: int):
    """One decode row per query token: a request of total length S verifying ``q_len`` tokens becomes ``q_len``
    single-query rows sharing its block table; row j attends to the first S - (q_len - 1 - j) cached tokens
    (causal). ``[num_reqs, max_blocks]``, ``[num_reqs]`` in; ``[num_reqs * q_len, ...]`` out."""
    import torch

    bt = block_table.repeat_interleave(q_len, dim=0)
    offsets = torch.arange(q_len - 1, -1, -1, dtype=seq_lens.dtype, device=seq_lens.device)
    sl = (seq_lens.view(-1, 1) - offsets.view(1, -1)).reshape(-1)
    return bt, sl


#: Forward calls through the patched path in this process: "expanded" verified several tokens per request on the
#: decode kernel, "decode" were plain 1-token decodes. Tests read it from the worker.
CALLS = {"expanded": 0, "decode": 0}
_FORCED = False


def enabled() -> bool:
    """Checked at every use, not once at install: a process that installed the switch (e.g. the test process that
    started an opted-in engine) may later fork engines without the variable, and those must run vLLM's own path."""
    return _FORCED or opted_in()


def apply_now(force: bool = False) -> str:
    """Install the switch on ``CPUMLABackend.get_builder_cls`` and ``CPUMLAImpl.forward_mqa`` (idempotent): while
    :func:`enabled`, a UNIFORM builder and the row-expanding decode; otherwise vLLM's own builder and forward.
    ``force`` enables it in this process whatever the environment says (the benchmark's worker extension)."""
    global _FORCED
    import torch
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder, QueryLenSupport
    from vllm.v1.attention.backends.mla import cpu_mla

    _FORCED = _FORCED or force
    impl, backend = cpu_mla.CPUMLAImpl, cpu_mla.CPUMLABackend
    if getattr(impl.forward_mqa, _MARK, False):
        return "already installed"
    original_forward, original_builder = impl.forward_mqa, backend.get_builder_cls

    class CPUMLAUniformDecodeBuilder(MLACommonMetadataBuilder):
        """Classifies uniform multi-token queries (speculative verification) as decodes."""

        query_len_support = QueryLenSupport.UNIFORM

    def get_builder_cls():
        return CPUMLAUniformDecodeBuilder if enabled() else original_builder()

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        if not enabled():
            return original_forward(self, q, kv_c_and_k_pe_cache, attn_metadata, layer)
        assert attn_metadata.decode is not None
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        q = q.contiguous()  # [num_decode_tokens, num_heads, kv_lora_rank + rope]
        n_tok, num_heads, _ = q.shape
        block_table = attn_metadata.decode.block_table.to(torch.int32)
        seq_lens = attn_metadata.decode.seq_lens.to(torch.int32)
        n_req = seq_lens.shape[0]
        if n_tok != n_req:
            if n_tok % n_req:
                raise RuntimeError(f"{_MARK}: non-uniform decode query lengths ({n_tok} tokens for {n_req} "
                                   f"requests); unset {ENV} to use vLLM's own path")
            block_table, seq_lens = expand_decode_rows(block_table, seq_lens, n_tok // n_req)
            CALLS["expanded"] += 1
        else:
            CALLS["decode"] += 1
        out = torch.zeros(n_tok, num_heads, self.kv_lora_rank, dtype=q.dtype, device=q.device)
        cpu_mla.ops.mla_decode_kvcache_cpu(out, q, kv_c_and_k_pe_cache, self.scale, block_table, seq_lens)
        return out, None

    setattr(forward_mqa, _MARK, True)
    impl.forward_mqa = forward_mqa
    backend.get_builder_cls = staticmethod(get_builder_cls)
    return ("switch installed: while enabled, CPU MLA declares UNIFORM query lengths and verifies speculative "
            "tokens on mla_decode_kvcache_cpu, one row per token")


PATCH = Patch(
    name="vllm_cpu_mla_verify_decode",
    engine="vllm",
    supported=("0.32.",),
    retire_when="vLLM's CPU MLA backend verifying multi-token queries on its decode kernel (cpu_mla.py)",
    apply_fn=apply_now,
    needed_fn=vllm_cpu_only,
)
