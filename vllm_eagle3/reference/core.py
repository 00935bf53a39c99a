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
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .attention import DraftAttention, MLAAttention, RMSNorm
from .config import WEIGHTS_FILE, DraftConfig


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
        self.fc_norm = (
            nn.ModuleList([RMSNorm(c.target_hidden_size, c.rms_norm_eps) for _ in range(c.num_aux_hidden_states)])
            if c.fc_norm
            else None
        )
        self.midlayer = DraftLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # Shared with the target (not exported); frozen.
        self.embed_tokens = nn.Embedding(c.vocab_size, c.target_hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer(
            "t2d",
            torch.ones(c.vocab_size, dtype=torch.bool)
            if c.draft_vocab_size == c.vocab_size
            else torch.zeros(c.vocab_size, dtype=torch.bool),
        )

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
        query_from: int | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Training-time test: ``steps`` chained draft steps over every anchor of a sequence at once.

        ``taps_concat`` [B, T, n_aux * H] are the target's taps at positions 0..T-1; ``next_ids`` [B, T]
        (or ``next_embeds`` [B, T, H]) are the tokens the draft reads, SHIFTED by one as vLLM feeds them:
        row i holds token i + 1. Step j at anchor i reads ``next[i + j - 1]`` (zero past the end), sits at
        position ``positions[i] + j - 1`` and predicts token i + j + 1. Returns, per step, (draft-vocab
        logits [B, T, Vd], the state fed to the next step [B, T, H]: pre-norm, or post-norm with ``norm_output``);
        rows whose inputs ran past the end are padding. ``query_from`` (one step only): rows from it on are the only
        queries, so attention output, MLP and logits cover them alone (keys and values still cover every row).
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
            if query_from is not None:
                if steps != 1:
                    raise ValueError("query_from scores the first draft step only (steps=1)")
                q, residual = q[:, :, query_from:], residual[:, query_from:]
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

    def save(
        self,
        out_dir: Path,
        aux_layer_ids: Sequence[int],
        extra_config: dict[str, Any] | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """Write ``config.json`` + ``model.safetensors`` (the folder vLLM takes as ``speculative_config.model``)."""
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.config.hf_config(aux_layer_ids, extra_config)
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(self.export_state(dtype), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})

    @classmethod
    def from_dir(
        cls, draft_dir: Path, target_dir: Path | None = None, dtype: torch.dtype = torch.float32
    ) -> "Eagle3Draft":
        """Load a head; with ``target_dir`` also the target's embedding table (vLLM shares it)."""
        from safetensors.torch import load_file

        draft_dir = Path(draft_dir)
        cfg_path = draft_dir / "config.json"
        if not cfg_path.exists():
            raise FileNotFoundError(
                f"{cfg_path} not found; expected an EAGLE-3 head folder such as models/kimi-k25-mini-eagle3"
            )
        draft = cls(DraftConfig.from_hf_config(json.loads(cfg_path.read_text())))
        state = load_file(str(draft_dir / WEIGHTS_FILE))
        # Published MLA heads name the layer ``layers.0.`` (both engines map it and ``midlayer.`` alike).
        state = {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        if "d2t" not in state and draft.config.draft_vocab_size != draft.config.vocab_size:
            raise KeyError(
                f"{draft_dir} has a reduced draft vocab but no d2t: vLLM would map draft id i to target id i"
            )
        missing = set(draft.export_state().keys()) - set(state)
        if missing:
            raise KeyError(
                f"{draft_dir}/{WEIGHTS_FILE} lacks {sorted(missing)}; is it an SGLang/SpecForge-layout EAGLE-3 head?"
            )
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
    files = [
        target_dir / json.loads(index.read_text())["weight_map"][n]
        for n in names
        if index.exists() and n in json.loads(index.read_text())["weight_map"]
    ]
    files = files or sorted(target_dir.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), "pt") as fh:
            for n in names:
                if n in fh.keys():
                    return fh.get_tensor(n).float()
    raise FileNotFoundError(
        f"no embed_tokens weight in {target_dir} (none of {', '.join(names)} in "
        f"{len(files)} safetensors file(s)); pass the target's folder, e.g. models/kimi-k25-mini"
    )
