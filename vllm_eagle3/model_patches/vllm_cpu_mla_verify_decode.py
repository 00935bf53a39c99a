"""vLLM-CPU (default on): verify speculative tokens on the CPU MLA *decode* kernel instead of its prefill path.

Data flow position: the target's attention inside **target forward** (the verification step of EAGLE-3); the taps
and the draft are untouched.

Why: ``vllm/v1/attention/backends/mla/cpu_mla.py`` (vLLM 0.32) keeps the MLA metadata builder's default
``query_len_support = SINGLE_ONLY``, so an EAGLE-3 verification step (k+1 query tokens per request) is classified as a
*prefill with context*: per layer and request, the cached latent KV is gathered and up-projected (``kv_b_proj``)
and attention runs as non-absorbed MHA (SDPA) + LSE merge. A plain decode step runs one ``mla_decode_kvcache_cpu``
call over the latent cache instead. `vllm-eagle3 bench` measured the verification forward at 2.2-5x a decode
forward: served as shipped, EAGLE-3 k=3 was 0.65x of no speculation at concurrency 4 (slower than not speculating).

What this does: a metadata builder with ``query_len_support = VARLEN`` (vLLM then raises the decode threshold to
1 + k, as its GPU MLA backends do, and classifies every request of the batch's reordered decode prefix with query
length <= 1 + k as a decode — verifications with k or fewer drafts, short prompts, resumed preempted requests,
padding rows of length 0) and, once per step at metadata-build time, :func:`expand_decode_rows`: one decode-kernel
row per *query token*, each with its own request's block table and its own causal length (token j of a request with
q tokens and total length S attends to the first S - (q - 1 - j) cached tokens; the cache already holds the new
tokens' latents because vLLM writes the KV cache before attention). Every layer's ``forward_mqa`` then runs the
existing kernel on those rows. No new kernel, no approximation: each row is exactly the causal attention the prefill
path computes, in the weight-absorbed form. Requests longer than 1 + k (prompts, recomputed preempted requests)
stay on vLLM's own prefill path in the same step (mixed batches); there is no batch shape the fast path refuses.
Chunked prefill never reaches this backend: vLLM-CPU disables it for MLA (``platforms/cpu.py``), and a short chunk
with context would be one more row set of the same form.

Measured (k=3, the shipped miniature + head, offline engines with the serve config's options — float32, eager —
held side by side and measured in alternation, 64 greedy tokens, 2 rounds; on 2 shared CPU cores under other load,
so only the ratios mean anything), EAGLE-3 over no
speculation: this path 2.2-2.6x at concurrency 1 and 2.0-2.2x at concurrency 4; ``=0`` (vLLM's own path) 1.3-1.5x and
0.85-0.94x. Greedy tokens identical across the three engines.

Default on, opt-out: ``EAGLE3_CPU_MLA_VERIFY_AS_DECODE=0`` runs vLLM's own path (unset, "" or "1": this path;
anything else is a clear error). The switch is read when a backend hands out its builder (:func:`enabled`), not at
install time: a process that installed it and later forks an engine with ``=0`` gives that engine vLLM's builder.
``forward_mqa`` dispatches on the metadata it is given (rows present: this path; otherwise vLLM's own), so a step is
always computed by the path its metadata was built for. :data:`CALLS` counts what each worker did (tests read it).

Retire when: vLLM's CPU MLA backend declares VARLEN (or UNIFORM plus a fallback) query lengths and verifies
multi-token queries on its decode kernel upstream (``cpu_mla.py`` keeps the builder's SINGLE_ONLY default in 0.33 and
0.34). Written against vLLM 0.32; 0.33's ``cpu_mla.py``, ``MLACommonMetadataBuilder.build/_build_decode``,
``split_decodes_and_prefills`` and the ``forward_mqa`` call site were compared with 0.32's source (identical on
everything this patch touches) but not run here.
"""

from __future__ import annotations

from vllm_eagle3 import envs
from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

ENV = envs.CPU_MLA_VERIFY_AS_DECODE
_MARK = "_vllm_eagle3_mla_verify_decode"


def opted_out(environ=None) -> bool:
    """Whether :data:`ENV` asks for vLLM's own path ("0"); unset, "" or "1": no (the default). Anything else is a
    clear error."""
    from vllm_eagle3 import envs

    try:
        return not envs.get(ENV, environ)
    except ValueError:
        raise ValueError(
            f"{ENV}={envs.raw(ENV, environ)!r}: use 0 to verify speculative tokens on vLLM-CPU's own MLA "
            "prefill path, 1 or unset for its MLA decode kernel (the default)"
        ) from None


def expand_decode_rows(block_table, seq_lens, query_start_loc):
    """One decode-kernel row per query token, for requests of any query lengths (0 included).

    ``block_table [num_reqs, max_blocks]``, ``seq_lens [num_reqs]`` (total length incl. this step's tokens),
    ``query_start_loc [num_reqs + 1]`` (CPU, starting at 0) in; ``[num_tokens, max_blocks]``, ``[num_tokens]`` out,
    token-major in the order of the query tensor. Token j of request i (q_i tokens) gets request i's block table and
    length ``seq_lens[i] - (q_i - 1 - j)``: causal attention over the cache. A batch of single-token decodes comes
    back unchanged (same tensors)."""
    import torch

    q_lens = query_start_loc[1:] - query_start_loc[:-1]  # [num_reqs]
    num_reqs = q_lens.shape[0]
    if bool((q_lens == 1).all()):
        return block_table, seq_lens
    num_tokens = int(query_start_loc[-1])
    req = torch.repeat_interleave(torch.arange(num_reqs), q_lens.long(), output_size=num_tokens)  # [num_tokens]
    tokens_after = query_start_loc[1:].long()[req] - 1 - torch.arange(num_tokens)  # later tokens of the same request
    rows_seq_lens = (seq_lens.long()[req] - tokens_after).to(seq_lens.dtype)
    return block_table.index_select(0, req.to(block_table.device)), rows_seq_lens


#: What the patched path did in this process. Per metadata build (one per step and KV-cache group that uses CPU
#: MLA): "steps" with decode-kernel requests, of which "verify" had a request with > 1 query token, "varlen" had
#: requests of different query lengths (fewer drafts, short prompts, padding rows), "prompt" held a request with no
#: cached context (a short prompt or a resumed preempted request), "mixed" also had requests on vLLM's prefill path;
#: "prefill_only" steps had none on the decode kernel. Per layer call: "forward" decode-kernel calls. Tests read it
#: from the worker (vllm_eagle3/testing/engine.py worker_mla_verify_calls).
CALLS = {"steps": 0, "verify": 0, "varlen": 0, "prompt": 0, "mixed": 0, "prefill_only": 0, "forward": 0}


def enabled() -> bool:
    """Checked each time a backend hands out its builder, not once at install: a process that installed the switch
    may later start engines with ``=0``, and those must run vLLM's own path."""
    return not opted_out()


def _count(metadata, common) -> None:
    """Update :data:`CALLS` for one built step (CPU tensors: reading them costs no device sync here)."""
    n_dec = metadata.num_decodes
    if n_dec == 0:
        CALLS["prefill_only"] += 1
        return
    qsl = common.query_start_loc_cpu[: n_dec + 1]
    q_lens = qsl[1:] - qsl[:-1]
    CALLS["steps"] += 1
    CALLS["verify"] += int(bool((q_lens > 1).any()))
    CALLS["varlen"] += int(bool((q_lens != q_lens[0]).any()))
    seq_lens = common.seq_lens[:n_dec].cpu()
    CALLS["prompt"] += int(bool(((seq_lens == q_lens) & (q_lens > 0)).any()))
    CALLS["mixed"] += int(metadata.num_prefills > 0)


def apply_now() -> str:
    """Install the switch on ``CPUMLABackend.get_builder_cls`` and ``CPUMLAImpl.forward_mqa`` (idempotent): while
    :func:`enabled`, the VARLEN row-expanding builder; otherwise vLLM's own builder."""
    import dataclasses

    import torch
    from vllm.model_executor.layers.attention.mla_attention import (
        MLACommonDecodeMetadata,
        MLACommonMetadataBuilder,
        QueryLenSupport,
    )
    from vllm.v1.attention.backends.mla import cpu_mla

    impl, backend = cpu_mla.CPUMLAImpl, cpu_mla.CPUMLABackend
    if getattr(impl.forward_mqa, _MARK, False):
        return "already installed"
    original_forward, original_builder = impl.forward_mqa, backend.get_builder_cls

    @dataclasses.dataclass
    class CPUMLARowsDecodeMetadata(MLACommonDecodeMetadata):
        """vLLM's decode metadata plus one kernel row per decode query token (:func:`expand_decode_rows`)."""

        row_block_table: torch.Tensor = None  # [num_decode_tokens, max_blocks] int32
        row_seq_lens: torch.Tensor = None  # [num_decode_tokens] int32

    class CPUMLAVarlenDecodeBuilder(MLACommonMetadataBuilder):
        """Classifies every request with <= 1 + k query tokens as a decode and expands it into kernel rows."""

        query_len_support = QueryLenSupport.VARLEN

        def _build_decode(
            self,
            block_table_tensor,
            seq_lens_device,
            max_seq_len,
            query_start_loc_cpu,
            query_start_loc_device,
            num_decode_tokens,
            max_query_len,
            dcp_tot_seq_lens_device,
        ):
            bt, sl = expand_decode_rows(
                block_table_tensor.to(torch.int32), seq_lens_device.to(torch.int32), query_start_loc_cpu
            )
            if bt.shape[0] != num_decode_tokens:
                raise RuntimeError(
                    f"{_MARK}: {bt.shape[0]} kernel rows for {num_decode_tokens} decode tokens; "
                    f"report this batch, and set {ENV}=0 to use vLLM's own path meanwhile"
                )
            return CPUMLARowsDecodeMetadata(
                block_table=block_table_tensor,
                seq_lens=seq_lens_device,
                dcp_tot_seq_lens=dcp_tot_seq_lens_device,
                row_block_table=bt,
                row_seq_lens=sl,
            )

        def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
            metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
            _count(metadata, common_attn_metadata)
            return metadata

    def get_builder_cls():
        return CPUMLAVarlenDecodeBuilder if enabled() else original_builder()

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        decode = attn_metadata.decode
        if not isinstance(decode, CPUMLARowsDecodeMetadata):  # built by vLLM's own builder
            return original_forward(self, q, kv_c_and_k_pe_cache, attn_metadata, layer)
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        q = q.contiguous()  # [num_decode_tokens, num_heads, kv_lora_rank + rope]
        out = torch.zeros(q.shape[0], q.shape[1], self.kv_lora_rank, dtype=q.dtype, device=q.device)
        cpu_mla.ops.mla_decode_kvcache_cpu(
            out, q, kv_c_and_k_pe_cache, self.scale, decode.row_block_table, decode.row_seq_lens
        )
        CALLS["forward"] += 1
        return out, None

    setattr(forward_mqa, _MARK, True)
    impl.forward_mqa = forward_mqa
    backend.get_builder_cls = staticmethod(get_builder_cls)
    return (
        "switch installed: unless EAGLE3_CPU_MLA_VERIFY_AS_DECODE=0, CPU MLA declares VARLEN query lengths "
        "and runs every request of <= 1 + k tokens on mla_decode_kvcache_cpu, one causal row per token"
    )


PATCH = Patch(
    name="vllm_cpu_mla_verify_decode",
    engine="vllm",
    supported=supported_vllm_before("0.34"),
    retire_when="vLLM's CPU MLA backend verifying multi-token queries on its decode kernel (cpu_mla.py)",
    apply_fn=apply_now,
    needed_fn=vllm_cpu_only,
)
