"""The target's training step, made fast, and a CLI that times it.

Where it sits: train_target.py calls :func:`prepare_for_training` once and :func:`train_step` per batch;
``python -m vllm_eagle3.miniature.step`` times the same two functions for several batch sizes and compile
modes on random weights (the GPU-lease profiling call) and prints tokens/s, ms per step and peak memory.

What makes a plain transformers training step slow on this model (tens of thousands of tokens/s for 28 M
parameters on an H200):
* transformers' ``DeepseekV3ForCausalLM`` builds a ``DynamicCache`` when ``use_cache`` is not given, so every
  training forward concatenated each layer's latent KV into a cache nobody reads -> ``use_cache=False``;
* 61 layers of hidden size 128 are hundreds of tiny element-wise kernels (RMSNorm in float32, rope
  interleave, router, SiLU gates) that each re-read the activations -> ``compile="layers"`` compiles each
  decoder layer with torch.compile (regional compilation: the 60 MoE layers share one compiled graph, so it
  compiles in seconds, not the minutes a 61-layer unrolled graph takes);
* transformers' per-expert MoE loop syncs the host per layer -> target.use_dense_experts (same function).
Evaluation runs the same layers eagerly (``torch.compiler.set_stance("force_eager")``), so a held-out batch
of another shape never triggers a recompile.

CLI: ``python -m vllm_eagle3.miniature.step --batch 192 384 --compile none layers`` (CPU toy:
``--num-layers 2 --seq-len 32 --batch 2 --steps 2 --device cpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from dataclasses import replace
from typing import Sequence

import torch

from .target import TargetShape, new_text_model, text_config_dict, use_dense_experts

COMPILE_MODES = ("none", "layers", "model")


def prepare_for_training(model, compile_mode: str = "none", moe_impl: str = "dense"):
    """Dense MoE (``moe_impl="dense"``) and torch.compile per decoder layer or of the whole model; returns ``model``."""
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile mode {compile_mode!r}; use one of {COMPILE_MODES}")
    if moe_impl == "dense":
        use_dense_experts(model)
    if compile_mode == "layers":
        # One compiled graph per distinct layer kind (dense layer 0, MoE layers 1..60), not per layer.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        for layer in model.model.layers:
            layer.compile()
    elif compile_mode == "model":
        model.compile()
    return model


def eager() -> contextlib.AbstractContextManager:
    """Run compiled modules eagerly (evaluation, generation: other shapes, no recompiles)."""
    return torch.compiler.set_stance("force_eager")


def train_step(
    model, opt, ids: torch.Tensor, amp: bool, clip: float = 1.0, use_cache: bool | None = False
) -> torch.Tensor:
    """One AdamW step of next-token loss on ``ids`` [B, T]; returns the loss as a device tensor (no host sync).

    transformers' causal-LM loss shifts ``labels`` itself, so ``labels=input_ids``. ``use_cache=None`` is the
    plain call (transformers then fills a KV cache), kept only to time it against the fast step.
    """
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=amp):
        loss = model(input_ids=ids, labels=ids, use_cache=use_cache).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.detach()


def new_optimizer(model, lr: float, weight_decay: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (betas 0.9 / 0.95), fused on CUDA (one kernel for all ~1,400 tensors)."""
    return torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay, fused=device.type == "cuda"
    )


def time_config(
    batch: int,
    seq_len: int,
    compile_mode: str,
    steps: int,
    warmup: int,
    num_layers: int,
    device: torch.device,
    moe_impl: str = "dense",
    use_cache: bool | None = False,
) -> dict:
    """Tokens/s of :func:`train_step` for one configuration on random weights (first ``warmup`` steps, where
    compilation happens, are timed separately)."""
    amp = device.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats()
    shape = replace(TargetShape(), num_layers=num_layers)
    model = new_text_model(text_config_dict(shape, bos_id=0, eos_id=1, pad_id=2)).to(device).train()
    prepare_for_training(model, compile_mode, moe_impl)
    opt = new_optimizer(model, 1e-4, 0.01, device)
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(13, shape.vocab_size, (batch, seq_len), device=device, generator=gen)
    sync = torch.cuda.synchronize if amp else (lambda: None)
    t0 = time.time()
    for _ in range(warmup):
        loss = train_step(model, opt, ids, amp, use_cache=use_cache)
    sync()
    t_warm = time.time() - t0
    t0 = time.time()
    for _ in range(steps):
        loss = train_step(model, opt, ids, amp, use_cache=use_cache)
    sync()
    dt = (time.time() - t0) / steps
    out = {
        "batch": batch,
        "seq_len": seq_len,
        "compile": compile_mode,
        "moe": moe_impl,
        "use_cache": use_cache,
        "ms_per_step": 1e3 * dt,
        "tok_per_s": batch * seq_len / dt,
        "warmup_s": t_warm,
        "loss": float(loss),
    }
    if amp:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del model, opt
    if amp:
        torch.cuda.empty_cache()
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Time the miniature target's training step (tokens/s) per batch size and compile mode."
    )
    ap.add_argument("--batch", type=int, nargs="+", default=[192])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--compile", nargs="+", choices=COMPILE_MODES, default=["none", "layers"])
    ap.add_argument("--moe-impl", choices=["dense", "loop"], default="dense")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--num-layers", type=int, default=TargetShape.num_layers)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--legacy-cache", action="store_true", help="time the plain call (KV cache filled)")
    ap.add_argument("--json", default=None, help="append one JSON line per configuration to this file")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    for mode in args.compile:
        for b in args.batch:
            try:
                r = time_config(
                    b,
                    args.seq_len,
                    mode,
                    args.steps,
                    args.warmup,
                    args.num_layers,
                    device,
                    args.moe_impl,
                    None if args.legacy_cache else False,
                )
            except torch.OutOfMemoryError:
                r = {"batch": b, "compile": mode, "error": "out of memory"}
                torch.cuda.empty_cache()
            print(json.dumps(r), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
