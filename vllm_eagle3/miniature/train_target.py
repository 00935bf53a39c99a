"""Train the miniature target (tokenizer + 61-layer DeepSeek-V3 text model) and write the Kimi checkpoint.

Where it sits: data.py -> tokenizer.py -> this -> export.py (``models/kimi-k25-mini``). Plain
transformers ``DeepseekV3ForCausalLM``, AdamW, bf16 autocast on CUDA, a wall-clock budget with
warm-up and cosine decay over that budget (the GPU lease is timed, not the step count). The curve
(train loss per step, held-out loss / top-1 every ``--eval-every`` steps) goes to ``train_log.json``.

Pitfall guarded: transformers' causal-LM loss shifts ``labels`` itself, so ``labels=input_ids``.

GPU (shipped model): ``python -m vllm_eagle3.miniature.train_target --out OUT --time-budget-s 330``
CPU toy: ``python -m vllm_eagle3.miniature.train_target --out /tmp/t --num-layers 4 --max-steps 20
--batch 4 --seq-len 64 --max-chars 300000 --vocab-size 1024``
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from . import data, export, tokenizer
from .target import TargetShape, count_params, new_text_model, text_config_dict


@torch.no_grad()
def heldout_metrics(model, windows: torch.Tensor, device, batch: int, amp: bool) -> dict[str, float]:
    """Mean next-token loss, perplexity and top-1 accuracy of ``model`` on ``windows`` [n, T]."""
    model.eval()
    tot_loss, tot_correct, tot_n = 0.0, 0, 0
    for i in range(0, windows.shape[0], batch):
        ids = windows[i : i + batch].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=ids).logits.float()
        tgt = ids[:, 1:]
        lg = logits[:, :-1]
        tot_loss += float(torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="sum"))
        tot_correct += int((lg.argmax(-1) == tgt).sum())
        tot_n += tgt.numel()
    model.train()
    loss = tot_loss / tot_n
    return {"loss": loss, "ppl": math.exp(loss), "top1": tot_correct / tot_n, "eval_tokens": tot_n}


def run_progress(step: int, elapsed_s: float, max_steps: int, time_budget_s: float) -> float:
    """Fraction of a training run done: the larger of steps / ``--max-steps`` and seconds / ``--time-budget-s``
    (either may be 0 = not limiting). The run ends at 1.0."""
    return max(step / max_steps if max_steps else 0.0, elapsed_s / time_budget_s if time_budget_s else 0.0)


def set_lr(opt, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def lr_at(progress: float, step: int, lr: float, warmup: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up for ``warmup`` steps, then cosine from ``lr`` to ``min_ratio * lr`` as progress -> 1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(1.0, max(0.0, progress))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the miniature Kimi K2.5 target on Python sources and save it in the Kimi layout.")
    ap.add_argument("--out", type=Path, required=True, help="output folder (becomes models/kimi-k25-mini)")
    ap.add_argument("--roots", nargs="*", type=Path, default=None, help="source folders (default: stdlib + site-packages)")
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    ap.add_argument("--max-chars", type=int, default=40_000_000, help="training characters to tokenize")
    ap.add_argument("--tokenizer-chars", type=int, default=5_000_000, help="characters to learn BPE merges from")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--num-layers", type=int, default=TargetShape.num_layers)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=6e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--time-budget-s", type=float, default=0.0, help="stop after this many seconds of training (0: use --max-steps)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time budget only)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=256, help="held-out windows of --seq-len tokens per evaluation")
    ap.add_argument("--save-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.time_budget_s <= 0 and args.max_steps <= 0:
        ap.error("give --time-budget-s or --max-steps")

    t_start = time.time()
    device = torch.device(args.device)
    amp = device.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
    files = data.source_files(args.roots or data.default_roots())
    train_files, held_files = data.split_files(files, args.heldout_fraction)
    train_texts = data.read_texts(train_files, args.max_chars)
    tok = tokenizer.train_tokenizer(train_texts if args.tokenizer_chars >= args.max_chars else
                                    data.read_texts(train_files, args.tokenizer_chars), args.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_tokenizer(tok, args.out)
    sp = tokenizer.special_ids(tok)
    train_stream = data.encode_texts(tok, train_texts, sp[tokenizer.EOS])
    held_stream = data.encode_texts(tok, data.read_texts(held_files, 2_000_000), sp[tokenizer.EOS])
    held = data.fixed_windows(held_stream, args.seq_len, args.eval_windows)
    print(f"[data] {len(train_files)} train files, {len(held_files)} held-out; train tokens {train_stream.numel():,}, "
          f"held-out tokens {held_stream.numel():,}; prep {time.time() - t_start:.0f}s", flush=True)

    shape = replace(TargetShape(), num_layers=args.num_layers, vocab_size=tok.get_vocab_size())
    model = new_text_model(text_config_dict(shape, bos_id=sp["[BOS]"], eos_id=sp["[EOS]"], pad_id=sp["[PAD]"]), args.seed)
    model.to(device).train()
    n_params = count_params(model)
    print(f"[model] {n_params / 1e6:.2f} M parameters, {shape.num_layers} layers", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay,
                            fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    log: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "params": n_params, "train": [], "eval": []}
    step, tokens_seen = 0, 0
    t0 = time.time()
    while True:
        progress = run_progress(step, time.time() - t0, args.max_steps, args.time_budget_s)
        if progress >= 1.0:
            break
        set_lr(opt, lr_at(progress, step, args.lr, args.warmup))
        ids = data.random_windows(train_stream, args.batch, args.seq_len, gen).to(device, non_blocking=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += ids.numel()
        if step % 10 == 0 or step == 1:
            lv = float(loss.detach())
            log["train"].append({"step": step, "loss": lv, "tokens": tokens_seen, "time_s": time.time() - t0})
            if step % 50 == 0 or step == 1:
                print(f"[train] step {step} loss {lv:.3f} tok/s {tokens_seen / (time.time() - t0):,.0f}", flush=True)
        if step % args.eval_every == 0:
            m = heldout_metrics(model, held, device, 32, amp)
            log["eval"].append({"step": step, "tokens": tokens_seen, "time_s": time.time() - t0, **m})
            print(f"[eval] step {step} held-out loss {m['loss']:.3f} ppl {m['ppl']:.1f} top1 {m['top1']:.3f}", flush=True)

    train_time = time.time() - t0
    # Final numbers on the weights exactly as shipped (rounded to --save-dtype), computed in float32.
    save_dtype = getattr(torch, args.save_dtype)
    state = {k: v.detach().to(save_dtype).float() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    final = heldout_metrics(model.float(), held, device, 32, amp=False)
    log["final"] = {"step": step, "tokens": tokens_seen, "train_time_s": train_time, **final}
    print(f"[final] {step} steps, {tokens_seen:,} tokens in {train_time:.0f}s; held-out ({args.save_dtype} weights, fp32) "
          f"loss {final['loss']:.3f} ppl {final['ppl']:.2f} top1 {final['top1']:.3f}", flush=True)
    export.write_kimi_checkpoint(args.out, state, shape, args.out, dtype=save_dtype)
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"[saved] {args.out} total {time.time() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
