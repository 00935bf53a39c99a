"""Train the miniature target (tokenizer + 61-layer DeepSeek-V3 text model) and write the Kimi checkpoint.

Where it sits: data.py -> tokenizer.py -> this -> export.py (``models/kimi-k25-mini``). Plain
transformers ``DeepseekV3ForCausalLM``, AdamW, bf16 autocast on CUDA, a wall-clock budget (the GPU lease
is timed, not the step count) with the schedule of schedule.py. The curve (train loss per step,
held-out loss / top-1 every ``--eval-every`` steps) goes to ``train_log.json``.

Choices that keep a 61-layer model trainable in minutes:
* ``--residual-init scaled``: the projections that write into the residual stream (attention ``o_proj``,
  every MLP / expert ``down_proj``) start at std 0.02 / sqrt(2 * layers), so 61 layers of random
  residual updates do not drown the token embedding at init (GPT-2's scaled init); without it the loss sits on
  the unigram plateau (~6.3) for hundreds of steps;
* ``--moe-impl dense`` (target.use_dense_experts): the same MoE function without transformers' per-expert
  loop and its host syncs;
* the training mix of data.load_training_mix (stdlib-weighted, third-party sources filtered and sampled
  across packages, not the alphabetically first characters);
* ``--init-from`` continues a checkpoint with a fresh optimizer, and ``--compile layers`` uses the fast step of
  step.py (torch.compile per decoder layer, no KV cache during training; step.py's CLI measures the speed-up);
* lr 5e-3 diverges after ~400 steps: use a lower one. The model card (models/kimi-k25-mini/MODEL_CARD.md) has the
  shipped target's own runs and numbers.

Several GPU calls: ``--save-ckpt`` writes model + optimizer + step when the ``wsd`` decay begins (or at the end
without decay); ``--resume`` continues from it with a fresh time budget.

Pitfall guarded: transformers' causal-LM loss shifts ``labels`` itself, so ``labels=input_ids``.

GPU:
``python -m vllm_eagle3.miniature.train_target --out OUT --time-budget-s 480 --tokenizer-from models/kimi-k25-mini``
(the card, models/kimi-k25-mini/MODEL_CARD.md, has the exact commands of the shipped files)
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
from .schedule import lr_at, progress_text, run_progress, set_lr
from .step import COMPILE_MODES, eager, new_optimizer, prepare_for_training, train_step
from .target import TargetShape, count_params, new_text_model, text_config_dict

__all__ = ["heldout_metrics", "lr_at", "main", "run_progress", "set_lr"]  # schedule names re-exported


@torch.no_grad()
def heldout_metrics(model, windows: torch.Tensor, device, batch: int, amp: bool) -> dict[str, float]:
    """Mean next-token loss, perplexity and top-1 accuracy of ``model`` on ``windows`` [n, T]."""
    model.eval()
    with eager():
        out = _heldout(model, windows, device, batch, amp)
    model.train()
    return out


def _heldout(model, windows, device, batch, amp):
    tot_loss, tot_correct, tot_n = 0.0, 0, 0
    for i in range(0, windows.shape[0], batch):
        ids = windows[i : i + batch].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=ids, use_cache=False).logits.float()
        tgt = ids[:, 1:]
        lg = logits[:, :-1]
        tot_loss += float(
            torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="sum")
        )
        tot_correct += int((lg.argmax(-1) == tgt).sum())
        tot_n += tgt.numel()
    loss = tot_loss / tot_n
    return {"loss": loss, "ppl": math.exp(loss), "top1": tot_correct / tot_n, "eval_tokens": tot_n}


@torch.no_grad()
def scale_residual_init(model, num_layers: int, std: float = 0.02) -> int:
    """Re-draw the residual-stream writers (``o_proj``, ``down_proj``, experts' ``down_proj``) with std
    ``std / sqrt(2 * num_layers)``; returns how many tensors."""
    s = std / math.sqrt(2 * num_layers)
    n = 0
    for name, p in model.named_parameters():
        if name.endswith(("self_attn.o_proj.weight", "down_proj.weight", "experts.down_proj")):
            p.normal_(0.0, s)
            n += 1
    return n


def build_tokenizer(args, train_files):
    if args.tokenizer_from:
        tok = tokenizer.load_tokenizer(args.tokenizer_from)
        if tok.get_vocab_size() != args.vocab_size:
            raise SystemExit(
                f"--tokenizer-from {args.tokenizer_from} has {tok.get_vocab_size()} tokens, --vocab-size "
                f"{args.vocab_size}: pass the matching --vocab-size"
            )
        return tok
    return tokenizer.train_tokenizer(data.read_texts(train_files, args.tokenizer_chars), args.vocab_size)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Train the miniature Kimi K2.5 target on Python sources and save it in the Kimi layout."
    )
    ap.add_argument("--out", type=Path, required=True, help="output folder (becomes models/kimi-k25-mini)")
    ap.add_argument(
        "--roots", nargs="*", type=Path, default=None, help="source folders (default: stdlib + site-packages)"
    )
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    ap.add_argument(
        "--stdlib-chars", type=int, default=100_000_000, help="standard-library characters to read (all: 1e8)"
    )
    ap.add_argument("--max-chars", type=int, default=150_000_000, help="third-party (site-packages) characters to read")
    ap.add_argument(
        "--stdlib-weight", type=float, default=0.35, help="share of batch rows drawn from the stdlib stream"
    )
    ap.add_argument("--data-cache", type=Path, default=None, help="keep the tokenized training mix here (reused)")
    ap.add_argument("--tokenizer-chars", type=int, default=5_000_000, help="characters to learn BPE merges from")
    ap.add_argument("--tokenizer-from", type=Path, default=None, help="reuse this model folder's tokenizer (same ids)")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--num-layers", type=int, default=TargetShape.num_layers)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=6e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--schedule", choices=["cosine", "wsd"], default="cosine")
    ap.add_argument("--decay-fraction", type=float, default=0.2, help="wsd: share of this run spent decaying (0: none)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--residual-init", choices=["scaled", "plain"], default="scaled")
    ap.add_argument("--moe-impl", choices=["dense", "loop"], default="dense", help="dense: target.use_dense_experts")
    ap.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        default="none",
        help="layers: torch.compile each decoder layer (step.py; the fast GPU setting)",
    )
    ap.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start from this Kimi-layout model folder's weights (same shape), fresh optimizer",
    )
    ap.add_argument(
        "--time-budget-s", type=float, default=0.0, help="stop after this many seconds of training (0: use --max-steps)"
    )
    ap.add_argument(
        "--max-steps", type=int, default=0, help="stop after this many steps of this run (0: time budget only)"
    )
    ap.add_argument(
        "--total-budget-s",
        type=float,
        default=0.0,
        help="whole-process limit (a timed GPU call): the training budget shrinks by the data preparation "
        "time and 40 s for the final evaluation and export (0: no limit)",
    )
    ap.add_argument(
        "--save-ckpt", type=Path, default=None, help="model+optimizer checkpoint, written when the decay starts"
    )
    ap.add_argument("--resume", type=Path, default=None, help="continue from a --save-ckpt checkpoint")
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
    tok = build_tokenizer(args, train_files)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_tokenizer(tok, args.out)
    sp = tokenizer.special_ids(tok)
    mix, mix_stats = data.cached_training_mix(
        args.data_cache, tok, train_files, sp[tokenizer.EOS], args.stdlib_chars, args.max_chars, args.stdlib_weight
    )
    mix = mix.to(device)
    held_stream = data.encode_texts(tok, data.read_texts(held_files, 2_000_000), sp[tokenizer.EOS])
    held = data.fixed_windows(held_stream, args.seq_len, args.eval_windows)
    print(
        f"[data] {len(train_files)} train files, {len(held_files)} held-out; {mix_stats}; stdlib weight "
        f"{args.stdlib_weight}; held-out tokens {held_stream.numel():,}; prep {time.time() - t_start:.0f}s",
        flush=True,
    )

    shape = replace(TargetShape(), num_layers=args.num_layers, vocab_size=tok.get_vocab_size())
    model = new_text_model(
        text_config_dict(shape, bos_id=sp["[BOS]"], eos_id=sp["[EOS]"], pad_id=sp["[PAD]"]), args.seed
    )
    if args.residual_init == "scaled":
        scale_residual_init(model, shape.num_layers, model.config.initializer_range)
    if args.init_from:
        init = export.kimi_to_text_state(export.read_kimi_state(args.init_from), model.state_dict().keys())
        model.load_state_dict({k: v.float() for k, v in init.items()}, strict=True)
        print(f"[init] weights of {args.init_from} (fresh optimizer)", flush=True)
    model.to(device).train()
    prepare_for_training(model, args.compile, args.moe_impl)
    n_params = count_params(model)
    print(f"[model] {n_params / 1e6:.2f} M parameters, {shape.num_layers} layers; compile {args.compile}", flush=True)
    opt = new_optimizer(model, args.lr, args.weight_decay, device)
    gen = torch.Generator().manual_seed(args.seed)
    log: dict = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "params": n_params,
        "data": mix_stats,
        "train": [],
        "eval": [],
        "runs": [],
    }
    step, tokens_seen, time_before = 0, 0, 0.0
    if args.resume:
        ck = torch.load(args.resume, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        step, tokens_seen, time_before, log = ck["step"], ck["tokens"], ck["time_s"], ck["log"]
        log["args"] = {k: str(v) for k, v in vars(args).items()}
        print(f"[resume] {args.resume}: step {step}, {tokens_seen:,} tokens, {time_before:.0f}s trained", flush=True)
    first_step = step
    saved_ckpt = False
    if args.total_budget_s > 0 and args.time_budget_s > 0:
        left = args.total_budget_s - (time.time() - t_start) - 40.0
        if left < args.time_budget_s:
            print(
                f"[budget] --total-budget-s {args.total_budget_s:.0f}: training for {left:.0f}s instead of "
                f"{args.time_budget_s:.0f}s",
                flush=True,
            )
            args.time_budget_s = max(1.0, left)

    def save_ckpt() -> None:
        run = {
            "from_step": first_step,
            "to_step": step,
            "time_s": time.time() - t0,
            "schedule": args.schedule,
            "lr": args.lr,
            "decay_fraction": args.decay_fraction,
            "resumed": str(args.resume or ""),
            "note": "checkpointed before this run's decay",
        }
        torch.save(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "gen": gen.get_state(),
                "step": step,
                "tokens": tokens_seen,
                "time_s": time_before + time.time() - t0,
                "log": {**log, "runs": [*log["runs"], run]},
            },
            args.save_ckpt,
        )
        print(f"[ckpt] {args.save_ckpt} at step {step}", flush=True)

    t0 = time.time()
    while True:
        progress = run_progress(step - first_step, time.time() - t0, args.max_steps, args.time_budget_s)
        if progress >= 1.0:
            break
        if args.save_ckpt and not saved_ckpt and args.schedule == "wsd" and progress >= 1 - args.decay_fraction:
            save_ckpt()
            saved_ckpt = True
        set_lr(opt, lr_at(progress, step, args.lr, args.warmup, args.min_lr_ratio, args.schedule, args.decay_fraction))
        ids = mix.windows(args.batch, args.seq_len, gen)
        loss = train_step(model, opt, ids, amp)
        step += 1
        tokens_seen += ids.numel()
        if step % 10 == 0 or step == first_step + 1:
            lv = float(loss)
            elapsed = time.time() - t0
            log["train"].append(
                {
                    "step": step,
                    "loss": lv,
                    "tokens": tokens_seen,
                    "time_s": time_before + elapsed,
                    "lr": opt.param_groups[0]["lr"],
                }
            )
            if step % 50 == 0 or step == first_step + 1:
                done = run_progress(step - first_step, elapsed, args.max_steps, args.time_budget_s)
                print(
                    f"[train] step {step} ({progress_text(done, elapsed)}) loss {lv:.3f} "
                    f"lr {opt.param_groups[0]['lr']:.2e} tok/s {tokens_seen / max(1e-9, time_before + elapsed):,.0f}",
                    flush=True,
                )
        if step % args.eval_every == 0:
            m = heldout_metrics(model, held, device, 32, amp)
            log["eval"].append({"step": step, "tokens": tokens_seen, "time_s": time_before + time.time() - t0, **m})
            print(
                f"[eval] step {step} held-out loss {m['loss']:.3f} ppl {m['ppl']:.1f} top1 {m['top1']:.3f}", flush=True
            )

    train_time = time.time() - t0
    log["runs"].append(
        {
            "from_step": first_step,
            "to_step": step,
            "time_s": train_time,
            "schedule": args.schedule,
            "lr": args.lr,
            "decay_fraction": args.decay_fraction,
            "resumed": str(args.resume or ""),
        }
    )
    if args.save_ckpt and not saved_ckpt:
        save_ckpt()
    # Final numbers on the weights exactly as shipped (rounded to --save-dtype), computed in float32.
    save_dtype = getattr(torch, args.save_dtype)
    state = {k: v.detach().to(save_dtype).float() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    torch.backends.cuda.matmul.allow_tf32 = False
    final = heldout_metrics(model.float(), held, device, 32, amp=False)
    log["final"] = {"step": step, "tokens": tokens_seen, "train_time_s": time_before + train_time, **final}
    print(
        f"[final] {step} steps, {tokens_seen:,} tokens in {time_before + train_time:.0f}s; "
        f"held-out ({args.save_dtype} weights, fp32) loss {final['loss']:.3f} ppl {final['ppl']:.2f} "
        f"top1 {final['top1']:.3f}",
        flush=True,
    )
    export.write_kimi_checkpoint(args.out, state, shape, args.out, dtype=save_dtype)
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"[saved] {args.out} total {time.time() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
