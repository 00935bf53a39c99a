"""Builders for tiny random checkpoints: a DeepSeek-V3 target, a Kimi K2.5 target and a Llama-style EAGLE-3 draft.

Data flow position: test fixtures. The targets are the real architectures vLLM and SGLang serve (MLA + MoE,
Kimi's vision tower), only small; the parity tests compare their taps against transformers'
``output_hidden_states`` for the same weights, so the weights are written by transformers itself.

Every builder is deterministic: the same ``seed`` (and library versions) writes the same tensors. Each writes
a folder vLLM loads offline: ``config.json``, ``model.safetensors`` and a byte-level tokenizer whose ids
0..255 are the UTF-8 bytes (so a prompt's ids are its bytes), followed by a few special tokens.

Shapes chosen for vLLM-CPU: its MLA backend requires ``kv_lora_rank + qk_rope_head_dim == 576`` (512 + 64);
transformers 5's ``DeepseekV3Config`` has no ``topk_method`` / ``scoring_func``, which vLLM reads, so they are
written into ``config.json`` ("noaux_tc", "sigmoid": what DeepSeek-V3 and transformers' implementation do).

Usage::

    from vllm_eagle3.testing.tiny import build_deepseek_v3, build_kimi_k25, build_eagle3_draft
    target = build_deepseek_v3(tmp / "dsv3", num_layers=32)
    draft = build_eagle3_draft(tmp / "draft", target, aux_ids=[0, 3, 31])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

SPECIAL_TOKENS = ("<|endoftext|>", "<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>")
"""Appended after the 256 byte tokens, in this order (ids 256..260)."""

EOS_ID = 256
MEDIA_PAD_ID = 256 + SPECIAL_TOKENS.index("<|media_pad|>")

DEFAULT_TEXT: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=64,
    kv_lora_rank=512,  # CPU MLA: kv_lora_rank + qk_rope_head_dim must be 576
    qk_rope_head_dim=64,
    qk_nope_head_dim=64,
    v_head_dim=64,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    bos_token_id=EOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=EOS_ID,
    tie_word_embeddings=False,
    initializer_range=0.1,  # 0.02 (the default) makes a random model repeat one token; 0.1 gives varied output
)
"""The text model of every tiny target (DeepSeek-V3 and Kimi K2.5's ``text_config``), num_hidden_layers aside."""

VLLM_ONLY_TEXT_KEYS = dict(topk_method="noaux_tc", scoring_func="sigmoid")


def write_tokenizer(folder: str | Path, vocab_size: int = DEFAULT_TEXT["vocab_size"]) -> None:
    """A byte-level tokenizer (no merges): token id b < 256 is byte b; then :data:`SPECIAL_TOKENS`, then
    ``<|extra_i|>`` fillers up to ``vocab_size`` so every id a random model emits can be detokenized."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()  # byte -> printable char, as GPT-2's byte-level BPE
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        list(SPECIAL_TOKENS) + [f"<|extra_{i}|>" for i in range(vocab_size - 256 - len(SPECIAL_TOKENS))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(str(folder))


def _patch_json(path: Path, update: dict[str, Any], under: str | None = None) -> None:
    cfg = json.loads(path.read_text())
    (cfg[under] if under else cfg).update(update)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def deepseek_v3_config(num_layers: int = 32, **overrides: Any):
    from transformers import DeepseekV3Config

    kw = {**DEFAULT_TEXT, "num_hidden_layers": num_layers, **overrides}
    cfg = DeepseekV3Config(**kw)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    return cfg


def build_deepseek_v3(folder: str | Path, num_layers: int = 32, seed: int = 0, **overrides: Any) -> Path:
    """A random DeepSeek-V3 (MLA + MoE) causal LM in float32, written by transformers, loadable by vLLM."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    folder = Path(folder)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(deepseek_v3_config(num_layers, **overrides)).to(torch.float32).eval()
    model.save_pretrained(str(folder))
    _patch_json(folder / "config.json", {**VLLM_ONLY_TEXT_KEYS, "dtype": "float32"})
    write_tokenizer(folder, model.config.vocab_size)
    return folder


KIMI_VISION = dict(
    patch_size=14,
    pos_emb_height=16,
    pos_emb_width=16,
    pos_emb_time=4,
    num_attention_heads=2,
    num_hidden_layers=1,
    hidden_size=64,
    intermediate_size=128,
    merge_kernel_size=[2, 2],
)

KIMI_MEDIA_PROC_CFG = dict(
    patch_size=14,
    merge_kernel_size=2,
    in_patch_limit=1024,
    patch_limit_on_one_side=64,
    in_patch_limit_each_frame=1024,
    in_patch_limit_video=4096,
    fixed_output_tokens=None,
    temporal_merge_kernel_size=4,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)
"""``preprocessor_config.json``'s ``media_proc_cfg`` (read by vLLM's Kimi K2.5 vision processor)."""

KIMI_RENAMES = (
    # name in transformers' saved Kimi_K25 checkpoint -> the name vLLM's KimiK25 loader expects
    ("language_model.model.blocks.", "language_model.model.layers."),
    ("model.mm_projector.pre_norm.", "mm_projector.pre_norm."),
    ("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed."),
)


def kimi_k25_config(num_layers: int = 32, **text_overrides: Any):
    from transformers import Kimi_K25Config

    text = {**DEFAULT_TEXT, "num_hidden_layers": num_layers, **text_overrides, "model_type": "deepseek_v3"}
    cfg = Kimi_K25Config(
        text_config=text,
        vision_config=dict(KIMI_VISION),
        projection_hidden_size=64,
        image_token_id=MEDIA_PAD_ID,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["KimiK25ForConditionalGeneration"]
    return cfg


def kimi_state_dict_for_vllm(state: dict) -> dict:
    """Rename a transformers-saved Kimi K2.5 checkpoint's tensors to the names vLLM's loader reads."""
    out = {}
    for name, tensor in state.items():
        for old, new in KIMI_RENAMES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        out[name] = tensor.contiguous()
    return out


def build_kimi_k25(folder: str | Path, num_layers: int = 32, seed: int = 0, **text_overrides: Any) -> Path:
    """A random Kimi K2.5 (DeepSeek-V3 text model + 1-layer vision tower), float32, loadable by vLLM.

    transformers' ``Kimi_K25ForConditionalGeneration`` is saved to ``folder/hf`` (its own format, read back by
    :func:`load_kimi_k25_hf`); ``folder`` gets the same tensors renamed for vLLM (:data:`KIMI_RENAMES`), plus
    ``media_placeholder_token_id`` (read by vLLM's EAGLE proposer) and a ``preprocessor_config.json``.
    """
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Kimi_K25ForConditionalGeneration

    folder = Path(folder)
    hf_dir = folder / "hf"
    torch.manual_seed(seed)
    cfg = kimi_k25_config(num_layers, **text_overrides)
    model = Kimi_K25ForConditionalGeneration(cfg).to(torch.float32).eval()
    model.save_pretrained(str(hf_dir))
    cfg.save_pretrained(str(folder))
    state: dict = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    save_file(kimi_state_dict_for_vllm(state), str(folder / "model.safetensors"), metadata={"format": "pt"})
    # vLLM's class name (model.save_pretrained rewrote cfg.architectures to transformers' Kimi_K25...; that name
    # would send vLLM to its generic Transformers backend instead of KimiK25ForConditionalGeneration).
    _patch_json(
        folder / "config.json",
        {
            "media_placeholder_token_id": MEDIA_PAD_ID,
            "dtype": "float32",
            "architectures": ["KimiK25ForConditionalGeneration"],
        },
    )
    _patch_json(folder / "config.json", {**VLLM_ONLY_TEXT_KEYS, "dtype": "float32"}, under="text_config")
    (folder / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": KIMI_MEDIA_PROC_CFG}, indent=2))
    write_tokenizer(folder, cfg.text_config.vocab_size)
    return folder


def load_kimi_k25_hf(folder: str | Path):
    """The transformers model for a folder written by :func:`build_kimi_k25` (from its ``hf`` copy)."""
    import torch
    from transformers import Kimi_K25ForConditionalGeneration

    return Kimi_K25ForConditionalGeneration.from_pretrained(str(Path(folder) / "hf"), dtype=torch.float32).eval()


def build_eagle3_draft(
    folder: str | Path,
    target: str | Path,
    aux_ids: Sequence[int],
    seed: int = 0,
    draft_vocab_size: int | None = None,
    nested_ids: bool = True,
    top_level_ids: bool = True,
) -> Path:
    """A random Llama-style EAGLE-3 draft head (``LlamaForCausalLMEagle3``) for ``target``.

    ``aux_ids`` are written verbatim as ``eagle_aux_hidden_state_layer_ids`` (top level and/or nested in
    ``eagle_config``): any list, in any convention — the builder does not interpret them. ``fc`` is
    ``[H, len(aux_ids) * H]``; ``d2t`` (draft id -> target id offset) and ``t2d`` (target-vocab mask) map a
    reduced draft vocabulary (default: half the target's) onto a seeded random subset of target ids.
    Weights are small random values; the draft proposes poorly, which is fine: speculative greedy output
    must equal the target's whatever the draft proposes.
    """
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tcfg = json.loads((Path(target) / "config.json").read_text())
    text = tcfg.get("text_config") or tcfg
    H, V = int(text["hidden_size"]), int(text["vocab_size"])
    heads, head_dim, inter = 2, H // 2, 2 * H
    dv = draft_vocab_size or V // 2
    n = len(aux_ids)
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(torch.float32)

    target_ids = torch.sort(torch.randperm(V, generator=g)[:dv]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[target_ids] = True
    weights = {
        "fc.weight": rnd(H, n * H),
        "midlayer.input_layernorm.weight": torch.ones(H),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "midlayer.self_attn.q_proj.weight": rnd(heads * head_dim, 2 * H),
        "midlayer.self_attn.k_proj.weight": rnd(heads * head_dim, 2 * H),
        "midlayer.self_attn.v_proj.weight": rnd(heads * head_dim, 2 * H),
        "midlayer.self_attn.o_proj.weight": rnd(H, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rnd(inter, H),
        "midlayer.mlp.up_proj.weight": rnd(inter, H),
        "midlayer.mlp.down_proj.weight": rnd(H, inter),
        "norm.weight": torch.ones(H),
        "lm_head.weight": rnd(dv, H),
        "d2t": (target_ids - torch.arange(dv)).to(torch.int64),
        "t2d": t2d,
    }
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "target_hidden_size": H,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": head_dim,
        "num_hidden_layers": 1,
        "vocab_size": V,
        "draft_vocab_size": dv,
        "max_position_embeddings": int(text.get("max_position_embeddings", 1024)),
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": text.get("bos_token_id", EOS_ID),
        "eos_token_id": text.get("eos_token_id", EOS_ID),
        "torch_dtype": "float32",
        "eagle_config": {"use_aux_hidden_state": True},
    }
    if top_level_ids:
        cfg["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    if nested_ids:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return folder


def write_spec_yaml(
    path: str | Path,
    taps: Sequence[int | str],
    num_layers: int | None = None,
    draft_ids_convention: str | None = "vllm",
) -> Path:
    """A capture-spec YAML (``taps: [embed, 3, 31]``) as ``EAGLE3_SPEC`` reads it."""
    path = Path(path)
    items = ", ".join("embed" if t in (0, "embed") else str(t) for t in taps)
    lines = [f"taps: [{items}]"]
    if num_layers is not None:
        lines.append(f"num_layers: {num_layers}")
    if draft_ids_convention is not None:
        lines.append(f"draft_ids_convention: {draft_ids_convention}")
    path.write_text("\n".join(lines) + "\n")
    return path


def build_eagle3_echo_draft(folder: str | Path, target: str | Path, aux_ids: Sequence[int], slot: int = 0) -> Path:
    """An EAGLE-3 draft (``LlamaForCausalLMEagle3``) for ``target`` whose proposals are set by one aux slot: it
    proposes, for every draft step, the token whose embedding the target handed it in aux slot ``slot`` (the spec's
    ``embed`` tap). At position t the aux list is the target's state for token t while the draft's input token is
    t+1, so it proposes x[t+2] = x[t]: accepted wherever the target's greedy output repeats a token or alternates two.

    Built on :func:`build_eagle3_draft` (full draft vocabulary, no ``d2t``/``t2d``): ``fc`` copies slot ``slot``
    into the residual (``[0 .. I .. 0]``), the midlayer's ``o_proj`` and ``down_proj`` are zero (attention and MLP
    add nothing), and ``lm_head`` rows are the target's input embeddings scaled to unit RMS, so after the final
    RMSNorm the largest logit is the embedded token itself (Cauchy-Schwarz; the rows are distinct). A draft fed the
    wrong tensor in that slot (a reordered or wrong aux list) proposes tokens from a hidden state instead, and is
    then almost never accepted.
    """
    import torch
    from safetensors.torch import load_file, save_file

    from vllm_eagle3.reference.core import load_target_embedding

    tcfg = json.loads((Path(target) / "config.json").read_text())
    V = int((tcfg.get("text_config") or tcfg)["vocab_size"])
    folder = build_eagle3_draft(folder, target, aux_ids, draft_vocab_size=V)
    weights = load_file(str(folder / "model.safetensors"))
    for key in ("d2t", "t2d"):
        weights.pop(key)
    emb = load_target_embedding(Path(target))
    assert emb.shape[0] == V, f"{target}'s embed_tokens has {emb.shape[0]} rows, its config {V}"
    H = emb.shape[1]
    fc = torch.zeros(H, len(aux_ids) * H)
    fc[:, slot * H : (slot + 1) * H] = torch.eye(H)
    weights["fc.weight"] = fc
    weights["midlayer.self_attn.o_proj.weight"].zero_()
    weights["midlayer.mlp.down_proj.weight"].zero_()
    # eps: the pad token's embedding row is all zeros (padding_idx); its lm_head row stays zero, not NaN
    weights["lm_head.weight"] = (emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + 1e-6)).contiguous()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
