"""The reference EAGLE-3 head's shape (``DraftConfig``), read from and written to a draft folder's config.json.

Data flow position: the draft side (taps -> fc -> decoder layer -> lm_head). ``core.py`` builds the head from it;
the miniature's trainer writes it, the wiring doctor reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


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
            raise ValueError(
                f"draft arch {self.arch!r} is not one of {sorted(ARCHITECTURES)} "
                "(llama: LlamaForCausalLMEagle3, mla: Eagle3DeepseekV2ForCausalLM)"
            )
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
                raise ValueError(
                    f"MLA draft q_lora_rank {self.q_lora_rank}: SGLang 0.5.23's Eagle3 MLA layer requires "
                    "a q_lora_rank (kimi_k25_eagle3.py 'Eagle3 MLA layer requires q_lora_rank'); "
                    "use e.g. 128"
                )
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
            cfg.update(
                q_lora_rank=self.q_lora_rank,
                kv_lora_rank=self.kv_lora_rank,
                qk_nope_head_dim=self.qk_nope_head_dim,
                qk_rope_head_dim=self.qk_rope_head_dim,
                v_head_dim=self.v_head_dim,
            )
        cfg.update(
            {
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
            }
        )
        if self.fc_norm:
            cfg["fc_norm"] = True
        if self.norm_output:
            cfg["norm_output"] = True
        cfg.update(extra or {})
        return cfg

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "DraftConfig":
        arch_name = (cfg.get("architectures") or [ARCHITECTURES["llama"]])[0]
        by_name = {v: k for k, v in ARCHITECTURES.items()} | {
            "Eagle3DeepseekV3ForCausalLM": "mla",
            "Eagle3LlamaForCausalLM": "llama",
        }
        if arch_name not in by_name:
            raise ValueError(
                f"draft architecture {arch_name!r} is not an EAGLE-3 head this code runs (one of {sorted(by_name)})"
            )
        on = [o for o in UNSUPPORTED_OPTIONS if cfg.get(o) or (cfg.get("eagle_config") or {}).get(o)]
        if on:
            raise ValueError(
                f"draft config sets {on}: the training/evaluation code implements fc_norm and norm_output "
                "only; it would compute another function than the engines"
            )
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
