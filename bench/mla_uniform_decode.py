"""EXPERIMENT (benchmark only, not a product patch): let vLLM-CPU's MLA backend verify k+1 speculative tokens per
request on its *decode* kernel instead of its prefill path.

Why: ``vllm/v1/attention/backends/mla/cpu_mla.py`` (vLLM 0.32) keeps the MLA metadata builder's default
``query_len_support = SINGLE_ONLY``, so a speculative verification step (k+1 query tokens per request) is classified
as a *prefill with context*: per layer and request, the cached latent KV is gathered and up-projected
(``kv_b_proj``) and attention runs as non-absorbed MHA (SDPA) + LSE merge of context and new tokens. A plain decode
step instead runs one ``mla_decode_kvcache_cpu`` call over the latent cache. `vllm-eagle3 bench` measured the
verification forward at several times the cost of a 1-token decode forward (see BENCHMARKS.md); that is the largest
cost of EAGLE-3 on this backend.

What this does: a metadata builder with ``query_len_support = UNIFORM`` (vLLM then sets the decode threshold to
1 + k, as its GPU MLA backends do) and a ``forward_mqa`` that runs the existing CPU decode kernel on one row per
*query token*: row j of a request whose total length is S attends to its first S - (q_len - 1 - j) cached tokens —
exactly causal attention over the cache, which already holds the new tokens' latents (vLLM writes the KV cache
before attention). No new kernel.

How it is loaded: ``--worker-extension-cls bench.mla_uniform_decode.StepTimersMlaDecode`` (vLLM imports the
extension in the worker before it builds the model runner and its attention builders; importing this module
applies the change in that worker process only). Used by ``vllm-eagle3 bench --experiment-mla-decode``.
Upstream fix: declare ``UNIFORM`` (or ``VARLEN``) for CPU MLA and expand rows like this in ``CPUMLAImpl``.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder, QueryLenSupport
from vllm.v1.attention.backends.mla import cpu_mla

from vllm_eagle3.bench import StepTimers, expand_decode_rows

_MARK = "_vllm_eagle3_bench_mla_uniform"


class CPUMLAUniformDecodeBuilder(MLACommonMetadataBuilder):
    """MLA metadata builder that classifies uniform multi-token queries (speculative verification) as decodes."""

    query_len_support = QueryLenSupport.UNIFORM


def _apply() -> None:
    impl = cpu_mla.CPUMLAImpl
    if getattr(impl.forward_mqa, _MARK, False):
        return

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
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
                raise RuntimeError(f"non-uniform decode query lengths ({n_tok} tokens, {n_req} requests)")
            block_table, seq_lens = expand_decode_rows(block_table, seq_lens, n_tok // n_req)
        out = torch.zeros(n_tok, num_heads, self.kv_lora_rank, dtype=q.dtype, device=q.device)
        cpu_mla.ops.mla_decode_kvcache_cpu(out, q, kv_c_and_k_pe_cache, self.scale, block_table, seq_lens)
        return out, None

    setattr(forward_mqa, _MARK, True)
    impl.forward_mqa = forward_mqa
    cpu_mla.CPUMLABackend.get_builder_cls = staticmethod(lambda: CPUMLAUniformDecodeBuilder)


class StepTimersMlaDecode(StepTimers):
    """The benchmark's step timers, in a worker whose CPU MLA backend verifies speculative tokens as decodes."""


_apply()
