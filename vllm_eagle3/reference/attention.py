"""The reference EAGLE-3 head's norms, rotary embeddings and attention (Llama MHA and DeepSeek-V2 MLA, naive form).

Data flow position: inside the draft's one decoder layer (``core.py``), on ``cat([embeds, hidden])`` ``[.., 2H]``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .config import DraftConfig


class RMSNorm(nn.Module):
    """vLLM's RMSNorm: float32 statistics; with ``residual`` it adds first and returns (normed, sum)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin ``[..., head_dim / 2]`` for integer ``positions`` (vLLM's default rotary embedding)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of ``x`` [B, heads, T, d] with cos/sin [B, T, d/2] (halves rotate together)."""
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J-style rotation (pairs 2i, 2i+1; vLLM ``is_neox_style=False``, DeepSeek's MLA) of ``x`` [B, h, T, d]."""
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def chained_attention(
    q: torch.Tensor, k1: torch.Tensor, v1: torch.Tensor, diag: Sequence[tuple[torch.Tensor, torch.Tensor]], scale: float
) -> torch.Tensor:
    """Causal attention over step-1 keys ``k1`` plus, per query, the same-index keys of later steps.

    ``q``, ``k1`` [B, h, T, dk], ``v1`` [B, h, T, dv]; ``diag`` holds (k, v) of unrolled steps 2..j at the query's
    own index: in serving, draft step j at anchor i sits at position i + j - 1 and sees the cache of positions <= i
    (step 1) plus the chain's own positions i + 1 .. i + j - 1 (steps 2..j). Returns [B, h, T, dv].
    """
    t, tk = q.shape[2], k1.shape[2]  # fewer queries than keys: the queries are the LAST t rows
    s1 = torch.matmul(q, k1.transpose(-1, -2)) * scale  # [B, h, T, T]
    mask = torch.ones(t, tk, dtype=torch.bool, device=q.device).tril(tk - t)
    s1 = s1.masked_fill(~mask, float("-inf"))
    sd = [((q * k).sum(-1, keepdim=True) * scale) for k, _ in diag]  # each [B, h, T, 1]
    p = torch.softmax(torch.cat([s1, *sd], dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(p[..., :tk], v1)
    for n, (_, v) in enumerate(diag):
        out = out + p[..., tk + n : tk + n + 1] * v
    return out


class DraftAttention(nn.Module):
    """Llama attention whose q/k/v read the 2H-wide ``cat([embeds, hidden])``."""

    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.c = c
        self.scale = c.head_dim**-0.5
        self.q_proj = nn.Linear(c.attn_input_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.attn_input_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.attn_input_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """Rotated q [B, h, T, d] and k, v [B, h, T, d] (kv heads repeated to h)."""
        c = self.c
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = c.num_attention_heads // c.num_key_value_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return q, k, v

    def attend(
        self, q: torch.Tensor, k1: torch.Tensor, v1: torch.Tensor, diag: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ):
        """:func:`chained_attention`, then ``o_proj``: [B, T, H]."""
        out = chained_attention(q, k1, v1, diag, self.scale)
        b, h, t, d = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class MLAAttention(DraftAttention):
    """vLLM's ``DeepseekV2MLAAttention`` with ``input_size = 2H`` (its Eagle3 layer 0), naive (non-absorbed) form.

    The engines run the absorbed form (``w_kc`` folded into q, attention in the 512-wide latent space): the same
    function up to float re-association, which ``tests/parity/test_draft_parity.py`` measures.
    """

    def __init__(self, c: DraftConfig) -> None:
        nn.Module.__init__(self)
        self.c = c
        h, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        self.scale = qk**-0.5
        self.q_a_proj = nn.Linear(c.attn_input_size, c.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = nn.Linear(c.q_lora_rank, h * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.attn_input_size, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, h * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * c.v_head_dim, c.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """q, k [B, h, T, nope + rope] (rope part rotated, k_pe shared by the heads) and v [B, h, T, v_head_dim]."""
        c = self.c
        b, t, _ = x.shape
        h, nope, rope = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, t, h, nope + rope).transpose(1, 2)
        kv_c, k_pe = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(kv_c)).view(b, t, h, nope + c.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([nope, c.v_head_dim], dim=-1)
        q_nope, q_pe = q.split([nope, rope], dim=-1)
        cos, sin = rope_cos_sin(positions, rope, c.rope_theta, q.dtype)
        q_pe = apply_rope_interleaved(q_pe, cos, sin)
        k_pe = apply_rope_interleaved(k_pe[:, None], cos, sin).expand(b, h, t, rope)
        return torch.cat([q_nope, q_pe], dim=-1), torch.cat([k_nope, k_pe], dim=-1), v
