"""Write a Kimi K2.5 checkpoint in the layout SGLang 0.5.23 loads (the original Moonshot layout), same tensors.

Where this sits: test fixture step before ``runner.py``. The project's Kimi checkpoints (``vllm_eagle3.testing.tiny``,
the shipped miniature) are written from transformers' ``Kimi_K25ForConditionalGeneration`` with the names vLLM's
loader accepts. SGLang's ``KimiK25ForConditionalGeneration.load_weights`` reads the ORIGINAL checkpoint names
instead (``vision_tower.encoder.blocks.N.wqkv``, ``mm_projector.proj.0``, ...). This module only renames, and fuses
q/k/v into ``wqkv`` (concatenated in q, k, v order, which is how SGLang's fused ``qkv_proj`` is laid out); every
value is copied bit for bit, so the parity test compares the same weights in every engine. The language model's
names are the same in both layouts. Runs in either venv (torch + safetensors only).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

#: transformers/vLLM name -> original Kimi name, applied in order on name prefixes/suffixes within a block.
_VISION_LAYER = re.compile(r"^vision_tower\.layers\.(\d+)\.(.+)$")
_LAYER_RENAMES = {
    "norm1.": "norm0.",  # transformers: norm1 before attention; original: norm0
    "norm2.": "norm1.",  # transformers: norm2 before the MLP; original: norm1
    "mlp.fc1.": "mlp.fc0.",
    "mlp.fc2.": "mlp.fc1.",
    "attn.proj.": "wo.",
}
_PREFIX_RENAMES = (
    ("vision_tower.final_layernorm.", "vision_tower.encoder.final_layernorm."),
    ("vision_tower.patch_embed.pos_emb.position_embeddings", "vision_tower.patch_embed.pos_emb.weight"),
    ("mm_projector.in_proj.", "mm_projector.proj.0."),
    ("mm_projector.out_proj.", "mm_projector.proj.2."),
)


def sglang_names(state: dict) -> dict:
    """Rename (and fuse q/k/v of) a Kimi K2.5 state dict in vLLM's layout into the layout SGLang loads."""
    import torch

    out: dict = {}
    qkv: dict[tuple[int, str], dict[str, "torch.Tensor"]] = {}
    for name, tensor in state.items():
        m = _VISION_LAYER.match(name)
        if m:
            idx, rest = int(m.group(1)), m.group(2)
            part = re.match(r"^attn\.([qkv])_proj\.(weight|bias)$", rest)
            if part:
                qkv.setdefault((idx, part.group(2)), {})[part.group(1)] = tensor
                continue
            for old, new in _LAYER_RENAMES.items():
                if rest.startswith(old):
                    rest = new + rest[len(old) :]
                    break
            out[f"vision_tower.encoder.blocks.{idx}.{rest}"] = tensor
            continue
        for old, new in _PREFIX_RENAMES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        out[name] = tensor
    for (idx, kind), parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise ValueError(f"vision layer {idx} {kind}: found only {sorted(parts)} of q/k/v projections")
        out[f"vision_tower.encoder.blocks.{idx}.wqkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], 0)
    return {k: v.contiguous() for k, v in out.items()}


def write_sglang_layout(src: str | Path, dst: str | Path) -> Path:
    """Copy checkpoint folder ``src`` to ``dst`` with ``model.safetensors`` renamed by :func:`sglang_names`."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors") and item.name != "model.safetensors.index.json":
            shutil.copy2(item, dst / item.name)
    state: dict = {}
    for shard in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    save_file(sglang_names(state), str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst
