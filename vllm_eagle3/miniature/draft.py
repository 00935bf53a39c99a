"""The EAGLE-3 draft head in plain PyTorch, computing exactly what vLLM's draft classes compute.

Two architectures, one code path (``DraftConfig.arch``):

* ``llama``: vLLM 0.32 ``model_executor/models/llama_eagle3.py`` (``LlamaForCausalLMEagle3``; SGLang's
  ``llama_eagle3.py`` loads the same folder);
* ``mla``: vLLM 0.32 ``model_executor/models/deepseek_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``, config
  ``model_type: deepseek_v2``), the layout SGLang 0.5.23's Kimi K2.5 MLA draft (``kimi_k25_eagle3.py``,
  ``Eagle3MLAModel``) also loads: DeepSeek-V2 multi-latent attention whose down projections read the 2H-wide
  ``cat([embeds, hidden])``.

Where it sits: target forward -> taps ``cat([tap 0, tap 3, tap 31])`` (``[..., n * H]``) -> [``fc_norm``: one
RMSNorm per tap chunk] -> ``fc`` -> one decoder layer whose attention input is ``cat([input_layernorm(embed(next
token)), hidden_norm(fc output)])`` (``[..., 2 * H]``) -> final ``norm`` -> ``lm_head`` over the reduced draft
vocabulary -> ``d2t`` maps draft ids to target ids (target id = draft id + d2t[draft id]).

The layer (both engines, ``norm_before_residual`` false, no ``norm_before_fc``):

* ``embeds = input_layernorm(embeds)``; ``residual = hidden``; ``hidden = hidden_norm(hidden)``;
  attention on ``cat([embeds, hidden])``; ``post_attention_layernorm(attn, residual)`` adds the residual
  first and returns ``(norm(attn + residual), attn + residual)``; MLP; ``norm(mlp, residual)`` returns
  ``(post-norm, pre-norm)``. Logits come from the post-norm state; the proposer feeds back as ``hidden_states`` of
  the next draft step the PRE-norm state (``aux_output = hidden_prenorm``), or the POST-norm state when the config
  says ``norm_output: true`` (EAGLE-3.1; read by vLLM's ``deepseek_eagle3.py`` and ``llama_eagle3.py`` and by
  SGLang's ``kimi_k25_eagle3.py``).
* ``fc_norm: true`` (EAGLE-3.1, the published ``kimi-k2.x-eagle3.1-mla`` heads): ``combine_hidden_states``
  normalises each of the n tap chunks with its own RMSNorm (``fc_norm.{i}.weight``) before ``fc``.
* Llama attention: rotary embedding neox style over the whole head. MLA attention (vLLM ``DeepseekV2MLAAttention``,
  computed here in its naive, non-absorbed form): ``q = q_b_proj(q_a_layernorm(q_a_proj(x)))`` split per head into
  ``[q_nope, q_pe]``; ``kv_a_proj_with_mqa(x) = [kv_c (kv_lora_rank), k_pe (rope dim, one head shared)]``;
  ``kv_b_proj(kv_a_layernorm(kv_c))`` per head ``[k_nope, v]``; rotary embedding GPT-J style (interleaved pairs,
  vLLM's ``is_neox_style=False``) on ``q_pe`` / ``k_pe`` only; scale ``(qk_nope + qk_rope) ** -0.5``.
  Positions of step j are the anchor's + (j - 1).
* The first step receives ``fc(taps)``; later steps receive the previous step's fed-back state as is.
* Token inputs are shifted by one: at target position i the draft sees ``embed(token i+1)``.

Export layout (SGLang / SpecForge; vLLM loads it): ``fc.weight``, [``fc_norm.{i}.weight``],
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t`` (int64), ``t2d`` (bool), and the attention: Llama
``midlayer.self_attn.{q,k,v,o}_proj.weight`` (q/k/v in_features = 2H); MLA ``midlayer.self_attn.{q_a_proj,
q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}.weight`` (q_a / kv_a in_features =
2H; vLLM fuses q_a + kv_a into ``fused_qkv_a_proj``, SGLang into ``fused_qkv_a_proj_with_mqa``, both from these
names; both map ``midlayer.`` themselves). No ``embed_tokens``: vLLM shares the target's; this module takes it from
the target folder (``Eagle3Draft.from_dir(draft_dir, target_dir)``).

Public API used by the wiring doctor::

    draft = Eagle3Draft.from_dir("models/kimi-k25-mini-eagle3", target_dir="models/kimi-k25-mini")
    logits = draft(taps_concat, input_ids=next_ids)          # [T, vocab], -inf outside the draft vocab
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

WEIGHTS_FILE = "model.safetensors"

ARCHITECTURES = {"llama": "LlamaForCausalLMEagle3", "mla": "Eagle3DeepseekV2ForCausalLM"}
"""Draft architecture -> the ``architectures`` entry vLLM 0.32 and SGLang 0.5.23 load it as."""
MODEL_TYPES = {"llama": "llama", "mla": "deepseek_v2"}
"""``model_type`` of each: vLLM rewrites a ``deepseek_v3`` draft to DeepSeek MTP (``config/speculative.py``)."""
UNSUPPORTED_OPTIONS = ("norm_before_fc", "norm_before_residual", "use_aux_norm")
"""EAGLE-3.1 options this code does not implement (a head using them is refused, not silently mis-run)."""


@dataclass(frozen=True)
class DraftConfig:
    """Shape of the head. ``hidden_size`` must equal the target's (the embedding table is shared).

    ``arch`` picks the attention (``llama`` | ``mla``); the ``q_lora_rank`` .. ``v_head_dim`` fields are MLA's
    (ignored by ``llama``), ``num_key_value_heads`` / ``head_dim`` Llama's. ``fc_norm`` / ``norm_output`` are the
    EAGLE-3.1 options both engines read (see the module docstring).
    """

    hidden_size: int
    target_hidden_size: int
    num_aux_hidden_states: int
    vocab_size: int
    draft_vocab_size: int
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 512
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 4096
    arch: str = "llama"
    q_lora_rank: int = 128
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 64
    fc_norm: bool = False
    norm_output: bool = False

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"draft arch {self.arch!r} is not one of {sorted(ARCHITECTURES)} "
                             "(llama: LlamaForCausalLMEagle3, mla: Eagle3DeepseekV2ForCausalLM)")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(
                f"draft hidden_size {self.hidden_size} != target hidden {self.target_hidden_size}: vLLM shares the "
                "target's embed_tokens with a head that has none, so they must match"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must lie in 1..vocab_size ({self.vocab_size})")
        if self.arch == "mla":
            if self.q_lora_rank <= 0:
                raise ValueError(f"MLA draft q_lora_rank {self.q_lora_rank}: SGLang 0.5.23's Eagle3 MLA layer requires "
                                 "a q_lora_rank (kimi_k25_eagle3.py 'Eagle3 MLA layer requires q_lora_rank'); use e.g. 128")
            if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim <= 0:
                raise ValueError(f"qk_rope_head_dim {self.qk_rope_head_dim} must be a positive even number")

    @property
    def attn_input_size(self) -> int:
        """Width of what the draft's attention projections read: ``cat([embeds, hidden])``."""
        return 2 * self.hidden_size

    def hf_config(self, aux_layer_ids: Sequence[int], extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """``config.json`` in the SGLang/SpecForge layout; ``aux_layer_ids`` go top-level and nested."""
        ids = [int(i) for i in aux_layer_ids]
        if len(ids) != self.num_aux_hidden_states:
            raise ValueError(f"{len(ids)} aux layer ids for a head with fc fan-in of {self.num_aux_hidden_states} taps")
        cfg: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.arch]],
            "model_type": MODEL_TYPES[self.arch],
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.target_hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads if self.arch == "llama" else self.num_attention_heads,
        }
        if self.arch == "llama":
            cfg["head_dim"] = self.head_dim
        else:
            cfg.update(q_lora_rank=self.q_lora_rank, kv_lora_rank=self.kv_lora_rank,
                       qk_nope_head_dim=self.qk_nope_head_dim, qk_rope_head_dim=self.qk_rope_head_dim,
                       v_head_dim=self.v_head_dim)
        cfg.update({
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "eagle_aux_hidden_state_layer_ids": ids,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        })
        if self.fc_norm:
            cfg["fc_norm"] = True
        if self.norm_output:
            cfg["norm_output"] = True
        cfg.update(extra or {})
        return cfg

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "DraftConfig":
        arch_name = (cfg.get("architectures") or [ARCHITECTURES["llama"]])[0]
        by_name = {v: k for k, v in ARCHITECTURES.items()} | {"Eagle3DeepseekV3ForCausalLM": "mla",
                                                                "Eagle3LlamaForCausalLM": "llama"}
        if arch_name not in by_name:
            raise ValueError(f"draft architecture {arch_name!r} is not an EAGLE-3 head this code runs "
                             f"(one of {sorted(by_name)})")
        on = [o for o in UNSUPPORTED_OPTIONS if cfg.get(o) or (cfg.get("eagle_config") or {}).get(o)]
        if on:
            raise ValueError(f"draft config sets {on}: the training/evaluation code implements fc_norm and norm_output "
                             "only; it would compute another function than the engines")
        eagle = cfg.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") or cfg.get("eagle_aux_hidden_state_layer_ids")
        n_aux = cfg.get("num_aux_hidden_states") or (len(ids) if ids else 3)
        heads = cfg["num_attention_heads"]
        rope = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10_000.0))
        arch = by_name[arch_name]
        mla = {}
        if arch == "mla":
            mla = {k: cfg[k] for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
            mla["q_lora_rank"] = cfg.get("q_lora_rank") or 0
        return cls(
            hidden_size=cfg["hidden_size"],
            target_hidden_size=cfg.get("target_hidden_size", cfg["hidden_size"]),
            num_aux_hidden_states=n_aux,
            vocab_size=cfg["vocab_size"],
            draft_vocab_size=cfg.get("draft_vocab_size") or cfg["vocab_size"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads", heads) if arch == "llama" else heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            arch=arch,
            fc_norm=bool(cfg.get("fc_norm", False)),
            norm_output=bool(cfg.get("norm_output", False)),
            **mla,
        )


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


def chained_attention(q: torch.Tensor, k1: torch.Tensor, v1: torch.Tensor,
                      diag: Sequence[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """Causal attention over step-1 keys ``k1`` plus, per query, the same-index keys of later steps.

    ``q``, ``k1`` [B, h, T, dk], ``v1`` [B, h, T, dv]; ``diag`` holds (k, v) of unrolled steps 2..j at the query's
    own index: in serving, draft step j at anchor i sits at position i + j - 1 and sees the cache of positions <= i
    (step 1) plus the chain's own positions i + 1 .. i + j - 1 (steps 2..j). Returns [B, h, T, dv].
    """
    t = q.shape[2]
    s1 = torch.matmul(q, k1.transpose(-1, -2)) * scale  # [B, h, T, T]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    s1 = s1.masked_fill(~mask, float("-inf"))
    sd = [((q * k).sum(-1, keepdim=True) * scale) for k, _ in diag]  # each [B, h, T, 1]
    p = torch.softmax(torch.cat([s1, *sd], dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(p[..., :t], v1)
    for n, (_, v) in enumerate(diag):
        out = out + p[..., t + n : t + n + 1] * v
    return out


class DraftAttention(nn.Module):
    """Llama attention whose q/k/v read the 2H-wide ``cat([embeds, hidden])``."""

    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.c = c
        self.scale = c.head_dim ** -0.5
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

    def attend(self, q: torch.Tensor, k1: torch.Tensor, v1: torch.Tensor, diag: Sequence[tuple[torch.Tensor, torch.Tensor]]):
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
        self.scale = qk ** -0.5
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


class DraftMLP(nn.Module):
    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """vLLM's Eagle3 decoder layer with ``layer_idx == 0`` (the only layer, ``midlayer``): ``LlamaDecoderLayer`` or,
    for ``arch == "mla"``, ``DeepseekV2Eagle3DecoderLayer`` (MLA attention, dense MLP); the norms are the same."""

    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = MLAAttention(c) if c.arch == "mla" else DraftAttention(c)
        self.mlp = DraftMLP(c)

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor):
        """(cat([input_layernorm(embeds), hidden_norm(hidden)]) [B, T, 2H], residual = hidden)."""
        residual = hidden
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1), residual

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor):
        """post-attention norm (adds residual), MLP; returns (mlp_out, residual)."""
        h, residual = self.post_attention_layernorm(attn_out, residual)
        return self.mlp(h), residual


class Eagle3Draft(nn.Module):
    """EAGLE-3 head: taps -> [fc_norm] -> fc -> midlayer -> norm -> lm_head (draft vocab) -> d2t -> target vocab."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(c.num_aux_hidden_states * c.target_hidden_size, c.hidden_size, bias=False)
        # EAGLE-3.1 fc_norm: one RMSNorm per tap chunk before fc (vLLM combine_hidden_states, SGLang Eagle3MLAModel).
        self.fc_norm = nn.ModuleList([RMSNorm(c.target_hidden_size, c.rms_norm_eps)
                                      for _ in range(c.num_aux_hidden_states)]) if c.fc_norm else None
        self.midlayer = DraftLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # Shared with the target (not exported); frozen.
        self.embed_tokens = nn.Embedding(c.vocab_size, c.target_hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool) if c.draft_vocab_size == c.vocab_size
                             else torch.zeros(c.vocab_size, dtype=torch.bool))

    # ---- vocabulary ------------------------------------------------------------------------------
    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Use ``target_ids`` (distinct target token ids) as the draft vocabulary, sorted ascending."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).unique(sorted=True)
        if ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"{ids.numel()} distinct ids for draft_vocab_size {self.config.draft_vocab_size}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_to_target(self) -> torch.Tensor:
        """Target id of each draft id (``arange + d2t``), as vLLM's ``compute_logits`` maps them."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def to_target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Scatter draft-vocab logits into the target vocab, ``-inf`` elsewhere (vLLM ``compute_logits``)."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        out[..., self.draft_to_target] = draft_logits
        return out

    # ---- forward -----------------------------------------------------------------------------------
    def unroll(
        self,
        taps_concat: torch.Tensor,
        next_ids: torch.Tensor | None = None,
        steps: int = 1,
        next_embeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Training-time test: ``steps`` chained draft steps over every anchor of a sequence at once.

        ``taps_concat`` [B, T, n_aux * H] are the target's taps at positions 0..T-1; ``next_ids`` [B, T]
        (or ``next_embeds`` [B, T, H]) are the tokens the draft reads, SHIFTED by one as vLLM feeds them:
        row i holds token i + 1. Step j at anchor i reads ``next[i + j - 1]`` (zero past the end), sits at
        position ``positions[i] + j - 1`` and predicts token i + j + 1. Returns, per step, (draft-vocab
        logits [B, T, Vd], the state fed to the next step [B, T, H]: pre-norm, or post-norm with ``norm_output``);
        rows whose inputs ran past the end are padding.
        """
        if next_embeds is None:
            if next_ids is None:
                raise ValueError("pass next_ids or next_embeds (the target's tokens shifted by one)")
            next_embeds = self.embed_tokens(next_ids)
        b, t, _ = taps_concat.shape
        if positions is None:
            positions = torch.arange(t, device=taps_concat.device).expand(b, t)
        layer = self.midlayer
        hidden = self.combine_hidden_states(taps_concat.to(self.fc.weight.dtype))  # [B, T, H]
        k1 = v1 = None
        diag: list[tuple[torch.Tensor, torch.Tensor]] = []
        outs = []
        for j in range(1, steps + 1):
            emb = torch.zeros_like(next_embeds)
            if j - 1 < t:
                emb[:, : t - (j - 1)] = next_embeds[:, j - 1 :]
            x, residual = layer.attn_input(emb.to(hidden.dtype), hidden)  # [B, T, 2H]
            q, k, v = layer.self_attn.qkv(x, positions + (j - 1))
            if j == 1:
                k1, v1 = k, v
            else:
                diag.append((k, v))
            attn = layer.self_attn.attend(q, k1, v1, diag)
            h, residual = layer.finish(attn, residual)
            post, pre = self.norm(h, residual)
            hidden = post if self.config.norm_output else pre  # what the proposer feeds the next step
            outs.append((self.lm_head(post), hidden))
        return outs

    def combine_hidden_states(self, taps_concat: torch.Tensor) -> torch.Tensor:
        """vLLM's ``combine_hidden_states``: [fc_norm per tap chunk] then ``fc``; [..., n * H] -> [..., H]."""
        if self.fc_norm is not None:
            chunks = taps_concat.chunk(self.config.num_aux_hidden_states, dim=-1)
            taps_concat = torch.cat([norm(x) for norm, x in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(taps_concat)

    def forward(
        self,
        taps_concat: torch.Tensor,
        input_ids: torch.Tensor | None = None,
        input_embeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """First draft step, teacher-forced and causal, as vLLM runs it after a target forward.

        ``taps_concat`` [T, n_aux * H] or [B, T, n_aux * H]; ``input_ids`` [T] / [B, T] are the tokens the
        draft reads at each position, i.e. the target's tokens SHIFTED by one (token i + 1 at row i; vLLM
        puts the just-sampled token in the last row). Returns logits over the TARGET vocab (``-inf`` outside
        the draft vocab), [T, V] or [B, T, V].
        """
        squeeze = taps_concat.dim() == 2
        if squeeze:
            taps_concat = taps_concat[None]
            input_ids = None if input_ids is None else input_ids[None]
            input_embeds = None if input_embeds is None else input_embeds[None]
            positions = None if positions is None else positions[None]
        logits, _ = self.unroll(taps_concat, input_ids, steps=1, next_embeds=input_embeds, positions=positions)[0]
        out = self.to_target_logits(logits)
        return out[0] if squeeze else out

    # ---- save / load -------------------------------------------------------------------------------
    def export_state(self, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
        """Tensors in the SGLang/SpecForge layout (no embed_tokens)."""
        sd = {}
        for k, v in self.state_dict().items():
            if k.startswith("embed_tokens."):
                continue
            sd[k] = v if k in ("d2t", "t2d") else v.to(dtype)
        return {k: v.contiguous() for k, v in sd.items()}

    def save(self, out_dir: Path, aux_layer_ids: Sequence[int], extra_config: dict[str, Any] | None = None,
             dtype: torch.dtype = torch.bfloat16) -> None:
        """Write ``config.json`` + ``model.safetensors`` (the folder vLLM takes as ``speculative_config.model``)."""
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.config.hf_config(aux_layer_ids, extra_config)
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(self.export_state(dtype), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})

    @classmethod
    def from_dir(cls, draft_dir: Path, target_dir: Path | None = None, dtype: torch.dtype = torch.float32) -> "Eagle3Draft":
        """Load a head; with ``target_dir`` also the target's embedding table (vLLM shares it)."""
        from safetensors.torch import load_file

        draft_dir = Path(draft_dir)
        cfg_path = draft_dir / "config.json"
        if not cfg_path.exists():
            raise FileNotFoundError(f"{cfg_path} not found; expected an EAGLE-3 head folder such as models/kimi-k25-mini-eagle3")
        draft = cls(DraftConfig.from_hf_config(json.loads(cfg_path.read_text())))
        state = load_file(str(draft_dir / WEIGHTS_FILE))
        # Published MLA heads name the layer ``layers.0.`` (both engines map it and ``midlayer.`` alike).
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        if "d2t" not in state and draft.config.draft_vocab_size != draft.config.vocab_size:
            raise KeyError(f"{draft_dir} has a reduced draft vocab but no d2t: vLLM would map draft id i to target id i")
        missing = set(draft.export_state().keys()) - set(state)
        if missing:
            raise KeyError(f"{draft_dir}/{WEIGHTS_FILE} lacks {sorted(missing)}; is it an SGLang/SpecForge-layout EAGLE-3 head?")
        draft.load_state_dict({k: v for k, v in state.items()}, strict=False)
        if target_dir is not None:
            draft.embed_tokens.weight.data.copy_(load_target_embedding(Path(target_dir)))
        return draft.to(dtype).eval()


def load_target_embedding(target_dir: Path) -> torch.Tensor:
    """The target's ``embed_tokens`` (Kimi layout ``language_model.model.embed_tokens.weight``)."""
    from safetensors import safe_open

    target_dir = Path(target_dir)
    index = target_dir / "model.safetensors.index.json"
    names = ("language_model.model.embed_tokens.weight", "model.embed_tokens.weight")
    files = [target_dir / json.loads(index.read_text())["weight_map"][n] for n in names
             if index.exists() and n in json.loads(index.read_text())["weight_map"]]
    files = files or sorted(target_dir.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), "pt") as fh:
            for n in names:
                if n in fh.keys():
                    return fh.get_tensor(n).float()
    raise KeyError(f"no embed_tokens weight in {target_dir}; pass the miniature target folder (models/kimi-k25-mini)")
