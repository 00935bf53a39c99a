"""Checkpoint layout of the miniature: transformers' in-memory names <-> the original Kimi K2.5 layout.

Where it sits: between training (transformers ``DeepseekV3ForCausalLM`` state dicts, in-memory names)
and serving. The shipped folder uses the layout of Moonshot's own Kimi K2.5 checkpoints, which vLLM's
``KimiK25ForConditionalGeneration`` loads unmodified and which transformers' ``kimi_k25`` conversion
mapping was written to read:

    language_model.model.layers.N.*            (text decoder; MoE experts one per module)
    language_model.lm_head.weight
    vision_tower.encoder.blocks.N.{wqkv,wo,norm0,norm1,mlp.fc0,mlp.fc1}.*
    vision_tower.encoder.final_layernorm.*
    vision_tower.patch_embed.{proj.*,pos_emb.weight}
    mm_projector.{pre_norm,proj.0,proj.2}.*

Why not ``save_pretrained``: transformers 5.19 writes a Kimi K2.5 model back under names neither it
nor vLLM maps (``language_model.model.blocks.N``, ``self_wqkv``, ``model.mm_projector.pre_norm``,
``vision_tower.encoder.patch_embed``). This module writes the original layout itself (two-way:
``text_state_to_kimi`` and ``kimi_to_text_state``), sharded below 16 MB per file.

CLI: ``python -m vllm_eagle3.miniature.export --check DIR`` loads DIR with transformers'
``Kimi_K25ForConditionalGeneration`` and with ``load_text_model`` and compares the logits.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

import torch

from .target import TargetShape, kimi_config_dict, preprocessor_config_dict

_FUSED_GATE_UP = re.compile(r"^(.*\.mlp\.experts)\.gate_up_proj$")
_FUSED_DOWN = re.compile(r"^(.*\.mlp\.experts)\.down_proj$")
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def text_state_to_kimi(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``DeepseekV3ForCausalLM`` state dict -> ``language_model.*`` keys of the Kimi layout.

    Fused expert tensors (transformers 5: ``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj``
    [E, H, I]) are split into one ``experts.e.{gate,up,down}_proj.weight`` per expert.
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name == "lm_head.weight":
            out["language_model.lm_head.weight"] = t
            continue
        if not name.startswith("model."):
            raise KeyError(f"unexpected text-model weight {name!r}; expected model.* or lm_head.weight")
        base = "language_model." + name
        if m := _FUSED_GATE_UP.match(base):
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{m.group(1)}.{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif m := _FUSED_DOWN.match(base):
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[base] = t
    return out


def kimi_to_text_state(kimi: dict[str, torch.Tensor], expected_keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """Inverse of ``text_state_to_kimi`` for a model whose state dict has ``expected_keys``.

    Re-fuses per-expert weights when the model holds fused expert tensors.
    """
    text: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in kimi.items():
        if not name.startswith("language_model."):
            continue
        name = name[len("language_model.") :]
        if m := _EXPERT.match(name):
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
        else:
            text[name] = t
    expected = set(expected_keys)
    for prefix, per in experts.items():
        ids = sorted(per)
        if f"{prefix}.gate_up_proj" in expected:
            text[f"{prefix}.gate_up_proj"] = torch.stack(
                [torch.cat([per[e]["gate_proj"], per[e]["up_proj"]], 0) for e in ids]
            )
            text[f"{prefix}.down_proj"] = torch.stack([per[e]["down_proj"] for e in ids])
        else:
            for e in ids:
                for k, v in per[e].items():
                    text[f"{prefix}.{e}.{k}.weight"] = v
    missing = expected - set(text)
    extra = set(text) - expected
    if missing or extra:
        raise KeyError(
            f"Kimi checkpoint does not match the text model: missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(extra)[:5]}; was it written by vllm_eagle3.miniature.export for the same TargetShape?"
        )
    return text


def random_vision_state(shape: TargetShape, text_hidden: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random one-block MoonViT tower + patch-merger projector, in the original Kimi layout."""
    g = torch.Generator().manual_seed(seed)
    h, p = shape.vision_hidden, shape.vision_patch
    merged = 4 * h  # merge_kernel_size 2x2

    def w(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g) * 0.02

    sd = {
        "vision_tower.patch_embed.proj.weight": w(h, 3, p, p),
        "vision_tower.patch_embed.proj.bias": torch.zeros(h),
        "vision_tower.patch_embed.pos_emb.weight": w(8, 8, h),
        "vision_tower.encoder.final_layernorm.weight": torch.ones(h),
        "vision_tower.encoder.final_layernorm.bias": torch.zeros(h),
        "mm_projector.pre_norm.weight": torch.ones(h),
        "mm_projector.pre_norm.bias": torch.zeros(h),
        "mm_projector.proj.0.weight": w(merged, merged),
        "mm_projector.proj.0.bias": torch.zeros(merged),
        "mm_projector.proj.2.weight": w(text_hidden, merged),
        "mm_projector.proj.2.bias": torch.zeros(text_hidden),
    }
    for i in range(shape.vision_layers):
        b = f"vision_tower.encoder.blocks.{i}"
        sd.update(
            {
                f"{b}.wqkv.weight": w(3 * h, h),
                f"{b}.wqkv.bias": torch.zeros(3 * h),
                f"{b}.wo.weight": w(h, h),
                f"{b}.wo.bias": torch.zeros(h),
                f"{b}.norm0.weight": torch.ones(h),
                f"{b}.norm0.bias": torch.zeros(h),
                f"{b}.norm1.weight": torch.ones(h),
                f"{b}.norm1.bias": torch.zeros(h),
                f"{b}.mlp.fc0.weight": w(2 * h, h),
                f"{b}.mlp.fc0.bias": torch.zeros(2 * h),
                f"{b}.mlp.fc1.weight": w(h, 2 * h),
                f"{b}.mlp.fc1.bias": torch.zeros(h),
            }
        )
    return sd


def save_sharded(state: dict[str, torch.Tensor], out_dir: Path, max_shard_bytes: int = 15 * 2**20) -> list[str]:
    """Write ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``; returns file names."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(state):
        t = state[name].contiguous()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    n = len(shards)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map = {}
    total = 0
    for fname, shard in zip(names, shards):
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        for k, t in shard.items():
            weight_map[k] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names


def write_kimi_checkpoint(
    out_dir: Path,
    text_state: dict[str, torch.Tensor],
    shape: TargetShape,
    tokenizer_dir: Path,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """Write the whole Kimi K2.5-layout folder: weights, configs, tokenizer."""
    from .tokenizer import load_tokenizer, special_ids

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("model*.safetensors*"):
        old.unlink()
    special = special_ids(load_tokenizer(tokenizer_dir))
    state = text_state_to_kimi({k: v.detach().cpu() for k, v in text_state.items()})
    state.update(random_vision_state(shape, shape.hidden_size))
    state = {k: v.to(dtype) for k, v in state.items()}
    save_sharded(state, out_dir)
    cfg = kimi_config_dict(shape, special)
    cfg["torch_dtype"] = cfg["dtype"] = str(dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out_dir / "preprocessor_config.json").write_text(json.dumps(preprocessor_config_dict(shape), indent=2) + "\n")
    gen = {
        "bos_token_id": special["[BOS]"],
        "eos_token_id": special["[EOS]"],
        "pad_token_id": special["[PAD]"],
        "do_sample": False,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if Path(tokenizer_dir).resolve() != out_dir.resolve():
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tokenizer_dir) / f, out_dir / f)


def read_kimi_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (sharded or single-file) safetensors checkpoint."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors in {model_dir}; is this a miniature target folder (models/kimi-k25-mini)?"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def read_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((Path(model_dir) / "config.json").read_text())


def load_text_model(model_dir: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """The text model of a Kimi-layout miniature as a transformers ``DeepseekV3ForCausalLM`` (eval mode)."""
    from .target import new_text_model

    cfg = read_config(model_dir)
    model = new_text_model(cfg["text_config"])
    text = kimi_to_text_state(read_kimi_state(model_dir), model.state_dict().keys())
    model.load_state_dict({k: v.float() for k, v in text.items()}, strict=True)
    return model.to(device=device, dtype=dtype).eval()


def check_with_transformers(model_dir: Path, num_tokens: int = 16) -> float:
    """Load ``model_dir`` with transformers' Kimi K2.5 class; max |logit difference| against ``load_text_model``.

    Raises if transformers reports missing or unexpected weights.
    """
    from transformers import Kimi_K25ForConditionalGeneration

    hf, info = Kimi_K25ForConditionalGeneration.from_pretrained(
        str(model_dir), dtype=torch.float32, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise RuntimeError(f"transformers could not load {model_dir} cleanly: {bad}")
    ours = load_text_model(model_dir)
    ids = torch.randint(20, ours.config.vocab_size, (1, num_tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = hf.eval()(input_ids=ids).logits
        b = ours(input_ids=ids).logits
    return float((a - b).abs().max())


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Check that a miniature Kimi K2.5 folder loads in transformers and matches load_text_model."
    )
    ap.add_argument("--check", type=Path, required=True, help="target folder, e.g. models/kimi-k25-mini")
    args = ap.parse_args(argv)
    diff = check_with_transformers(args.check)
    print(
        f"transformers Kimi_K25ForConditionalGeneration loaded {args.check}; "
        f"max |logit diff| vs load_text_model = {diff:.3e}"
    )
    if diff > 1e-3:
        raise SystemExit("logits differ: the layout conversion is wrong")


if __name__ == "__main__":
    main()
