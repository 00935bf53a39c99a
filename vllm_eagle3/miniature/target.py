"""The miniature target: a Kimi K2.5-shaped DeepSeek-V3 text model (MLA + MoE) and its configs.

Where it sits: ``TargetShape`` fixes the dimensions (61 layers like Kimi K2.5, dense first layer,
kv_lora_rank 512 + rope 64 = 576 as vLLM's CPU MLA backend requires); ``text_config_dict`` and
``kimi_config_dict`` produce the ``config.json`` that vLLM (``KimiK25ForConditionalGeneration``) and
transformers (``Kimi_K25ForConditionalGeneration``) both read; ``new_text_model`` builds the
transformers ``DeepseekV3ForCausalLM`` that train_target.py trains. The text model is what carries
the taps: tap k = hidden state entering decoder layer k = HF ``output_hidden_states[k]``.

CLI: ``python -m vllm_eagle3.miniature.target --help`` prints the config and parameter count.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any, Sequence

# vLLM's CPU MLA backend accepts only kv_lora_rank + qk_rope_head_dim == 576 (cpu_mla.py).
CPU_MLA_LATENT = 576


@dataclass(frozen=True)
class TargetShape:
    """Dimensions of the miniature target. Defaults are the shipped model."""

    num_layers: int = 61
    hidden_size: int = 128
    num_heads: int = 2
    q_lora_rank: int | None = 128
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 64
    v_head_dim: int = 64
    dense_intermediate_size: int = 384
    moe_intermediate_size: int = 48
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1
    vocab_size: int = 4096
    max_position_embeddings: int = 4096
    rope_theta: float = 10_000.0
    # Tiny MoonViT vision tower (random weights: it makes the checkpoint Kimi-shaped, it is not trained).
    vision_hidden: int = 64
    vision_layers: int = 1
    vision_heads: int = 2
    vision_patch: int = 14

    def __post_init__(self) -> None:
        if self.kv_lora_rank + self.qk_rope_head_dim != CPU_MLA_LATENT:
            raise ValueError(
                f"kv_lora_rank + qk_rope_head_dim = {self.kv_lora_rank + self.qk_rope_head_dim}, but vLLM's CPU MLA "
                f"backend needs {CPU_MLA_LATENT}: use kv_lora_rank 512 with qk_rope_head_dim 64"
            )
        if not 0 < self.first_k_dense_replace < self.num_layers:
            raise ValueError(f"first_k_dense_replace={self.first_k_dense_replace} must be in 1..num_layers-1 (Kimi: 1)")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ValueError("num_experts_per_tok cannot exceed n_routed_experts")


def text_config_dict(shape: TargetShape, *, bos_id: int, eos_id: int, pad_id: int | None = None) -> dict[str, Any]:
    """The DeepSeek-V3 ``text_config`` (keys read by transformers 5 and by vLLM's deepseek_v2.py)."""
    return {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.dense_intermediate_size,
        "moe_intermediate_size": shape.moe_intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_heads,
        "n_shared_experts": shape.n_shared_experts,
        "n_routed_experts": shape.n_routed_experts,
        "num_experts_per_tok": shape.num_experts_per_tok,
        "first_k_dense_replace": shape.first_k_dense_replace,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
        # vLLM reads these (transformers 5's DeepseekV3Config has no such fields; they ride along).
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "q_lora_rank": shape.q_lora_rank,
        "kv_lora_rank": shape.kv_lora_rank,
        "qk_rope_head_dim": shape.qk_rope_head_dim,
        "qk_nope_head_dim": shape.qk_nope_head_dim,
        "v_head_dim": shape.v_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "rope_interleave": True,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }


def vision_config_dict(shape: TargetShape) -> dict[str, Any]:
    """A one-block MoonViT config (``Kimi_K25VisionConfig`` fields; vLLM's kimi_k25_vit reads the same)."""
    return {
        "model_type": "kimi_k25_vision",
        "patch_size": shape.vision_patch,
        "pos_emb_height": 8,
        "pos_emb_width": 8,
        "pos_emb_time": 4,
        "num_attention_heads": shape.vision_heads,
        "num_hidden_layers": shape.vision_layers,
        "hidden_size": shape.vision_hidden,
        "intermediate_size": 2 * shape.vision_hidden,
        "hidden_act": "gelu_pytorch_tanh",
        "merge_kernel_size": [2, 2],
        "mm_projector_type": "patchmerger",
        "projector_ln_eps": 1e-5,
    }


def kimi_config_dict(shape: TargetShape, special: dict[str, int]) -> dict[str, Any]:
    """The top-level ``config.json`` of the miniature (``KimiK25ForConditionalGeneration``)."""
    media_pad = special["<|media_pad|>"]
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text_config_dict(
            shape, bos_id=special["[BOS]"], eos_id=special["[EOS]"], pad_id=special["[PAD]"]
        ),
        "vision_config": vision_config_dict(shape),
        "projection_hidden_size": shape.vision_hidden,
        "projection_layer_norm_eps": 1e-5,
        "image_token_id": media_pad,
        "media_placeholder_token_id": media_pad,  # read by vLLM's EAGLE proposer for Kimi targets
        "video_token_id": special["<|kimi_k25_video_placeholder|>"],
        "vision_start_token_id": special["<|media_begin|>"],
        "vision_end_token_id": special["<|media_end|>"],
        "bos_token_id": special["[BOS]"],
        "eos_token_id": special["[EOS]"],
        "pad_token_id": special["[PAD]"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


def preprocessor_config_dict(shape: TargetShape) -> dict[str, Any]:
    """``preprocessor_config.json``: vLLM's Kimi image processor reads ``media_proc_cfg``."""
    return {
        "media_proc_cfg": {
            "in_patch_limit": 1024,
            "patch_size": shape.vision_patch,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "merge_kernel_size": 2,
            "fixed_output_tokens": None,
            "patch_limit_on_one_side": 64,
            "in_patch_limit_each_frame": 1024,
            "in_patch_limit_video": None,
            "sample_fps": 2.0,
            "max_num_frames_each_video": None,
            "temporal_merge_kernel_size": 4,
            "timestamp_mode": "hh:mm:ss.fff",
            "config_type": "image",
        }
    }


def hf_text_config(text_cfg: dict[str, Any]):
    """A transformers ``DeepseekV3Config`` from the ``text_config`` dict (extra vLLM keys kept as attributes)."""
    from transformers import DeepseekV3Config

    cfg = dict(text_cfg)
    cfg.pop("model_type", None)
    extras = {k: cfg.pop(k) for k in ("topk_method", "scoring_func", "moe_layer_freq") if k in cfg}
    cfg.pop("rope_theta", None)  # transformers 5 reads rope_parameters
    config = DeepseekV3Config(**cfg)
    for k, v in extras.items():
        setattr(config, k, v)
    return config


def new_text_model(text_cfg: dict[str, Any], seed: int = 0):
    """A freshly initialised transformers ``DeepseekV3ForCausalLM`` for ``text_cfg`` (float32)."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    config = hf_text_config(text_cfg)
    config._attn_implementation = "sdpa"
    return DeepseekV3ForCausalLM(config)


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' ``DeepseekV3Experts.forward`` computed densely: every expert on every token, weighted by
    the router's top-k weights scattered into [T, E] (zero for experts not chosen), so the same function.

    Why: the stock forward loops over the experts hit, with a ``nonzero`` host sync per MoE layer and a
    gather per expert; at this size (8 experts of 48) one [T, H] x [H, E * 2I] matmul and one [T, E * I] x
    [E * I, H] matmul are far cheaper on a GPU, and they have static shapes (no syncs).
    """
    import torch

    t, h = hidden_states.shape
    e, two_i, _ = self.gate_up_proj.shape
    weights = torch.zeros(t, e, dtype=top_k_weights.dtype, device=hidden_states.device)
    weights = weights.scatter(1, top_k_index, top_k_weights)
    gate_up = torch.nn.functional.linear(hidden_states, self.gate_up_proj.reshape(e * two_i, h)).view(t, e, two_i)
    gate, up = gate_up.chunk(2, dim=-1)
    act = self.act_fn(gate) * up * weights[..., None].to(up.dtype)  # [T, E, I]
    down = self.down_proj.permute(1, 0, 2).reshape(h, e * (two_i // 2))  # [H, E * I]
    return torch.nn.functional.linear(act.reshape(t, -1), down).to(hidden_states.dtype)


def use_dense_experts(model) -> int:
    """Switch every MoE experts module of ``model`` to :func:`dense_experts_forward`; returns how many."""
    import types

    n = 0
    for mod in model.modules():
        if type(mod).__name__ == "DeepseekV3Experts":
            mod.forward = types.MethodType(dense_experts_forward, mod)
            n += 1
    return n


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Print the miniature target's text config and parameter count.")
    ap.add_argument("--num-layers", type=int, default=TargetShape.num_layers)
    ap.add_argument("--build", action="store_true", help="also build the model and count parameters")
    args = ap.parse_args(argv)
    shape = TargetShape(num_layers=args.num_layers)
    cfg = text_config_dict(shape, bos_id=0, eos_id=1, pad_id=2)
    print(json.dumps(asdict(shape), indent=2))
    if args.build:
        print(f"parameters: {count_params(new_text_model(cfg)) / 1e6:.2f} M")


if __name__ == "__main__":
    main()
