"""Distil the miniature target into its EAGLE-3 head, from taps ``cat([embed, 3, 31])``.

One code path for every head: ``--arch llama`` (``LlamaForCausalLMEagle3``) or ``--arch mla``
(``Eagle3DeepseekV2ForCausalLM``), with the EAGLE-3.1 options ``--fc-norm`` / ``--norm-output``; the fan-in is
the spec's number of taps (``configs/kimi_k25_eagle3_4tap.yaml``: 4). See draft.py for what each computes.

Where it sits: models/kimi-k25-mini (export.load_text_model) -> per batch, one target forward with
``output_hidden_states`` gives the taps of the capture spec (tap k = ``hidden_states[k]``, order as in
the spec) and the target's logits -> ``Eagle3Draft.unroll`` runs EAGLE-3's training-time test
(``--ttt-steps`` chained steps, each feeding the draft's own state back: pre-norm, post-norm with
``--norm-output``) -> loss: cross
entropy against the target's next-token distribution restricted to the draft vocabulary (the draft
learns the TARGET's predictions, not the text), step j weighted ``--step-decay ** (j - 1)``.

Self-distillation (``--greedy-prompts N``): N prompts from the TRAINING split are continued greedily by the
target, and ``--greedy-fraction`` of every batch is drawn from those sequences. That is the distribution the
served draft meets (it drafts after the target's own greedy tokens, not after human text), and it is EAGLE's
"regenerate the data with the target" step. Held-out files are never used.

Text rows and generation prompts come from data.load_training_mix (the target's training mix; ``--data-cache``
reuses the target run's tokenized copy). The draft vocabulary is the ``--draft-vocab-size`` most frequent tokens of
that text, or (``--vocab-greedy-weight w``) of a blend weighing the target's greedy tokens by ``w``.
The config's ids are written in the spec file's ``draft_ids_convention`` (configs/kimi_k25_eagle3.yaml:
SGLang-legacy, so taps (0, 3, 31) become ``[-1, 2, 30]``).

GPU: ``python -m vllm_eagle3.miniature.train_draft --target models/kimi-k25-mini --out models/kimi-k25-mini-eagle3
--time-budget-s 170 --evaluate``; the MLA head: add ``--arch mla --fc-norm --norm-output --num-heads 2``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from vllm_eagle3.conventions import taps_to_ids
from vllm_eagle3.resolve import load_spec_file

from . import data, export, tokenizer
from vllm_eagle3.reference import ARCHITECTURES, DraftConfig, Eagle3Draft
from .schedule import lr_at, progress_text, run_progress, set_lr
from .target import use_dense_experts
from vllm_eagle3.reference.teacher import DEFAULT_SPEC, greedy_continue, shifted, target_outputs

__all__ = ["DEFAULT_SPEC", "main", "shifted", "target_outputs", "ttt_loss"]  # teacher names re-exported


def choose_draft_vocab(
    stream: torch.Tensor,
    vocab_size: int,
    draft_vocab_size: int,
    greedy: torch.Tensor | None = None,
    greedy_weight: float = 0.0,
) -> tuple[torch.Tensor, float, float]:
    """The ``draft_vocab_size`` ids of highest frequency, and the fractions of text and greedy tokens they cover.

    Frequency is ``(1 - greedy_weight) * share in the text stream + greedy_weight * share in ``greedy`` (the
    target's own generated tokens)``. With weight 0 this is the text's most frequent tokens: on the shipped
    target they covered 97.5 % of text but only 83.9 % of the target's greedy tokens, and a token outside the
    draft vocabulary can never be accepted. The greedy coverage is NaN when no greedy tokens are given.
    """
    if not 0.0 <= greedy_weight <= 1.0:
        raise ValueError(f"greedy_weight must lie in [0, 1], got {greedy_weight}")
    text_counts = torch.bincount(stream.long().flatten(), minlength=vocab_size).double()
    freq = text_counts / text_counts.sum()
    greedy_counts = None
    if greedy is not None and greedy.numel():
        greedy_counts = torch.bincount(greedy.long().flatten(), minlength=vocab_size).double()
        freq = (1.0 - greedy_weight) * freq + greedy_weight * greedy_counts / greedy_counts.sum()
    elif greedy_weight:
        raise ValueError("greedy_weight > 0 needs the greedy tokens (--greedy-prompts)")
    top = freq.topk(draft_vocab_size).indices.sort().values
    text_cov = float(text_counts[top].sum() / text_counts.sum())
    greedy_cov = float(greedy_counts[top].sum() / greedy_counts.sum()) if greedy_counts is not None else float("nan")
    return top, text_cov, greedy_cov


def ttt_loss(
    draft: Eagle3Draft, taps: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor, steps: int, step_decay: float
) -> tuple[torch.Tensor, list[float], list[float]]:
    """Weighted loss over ``steps`` unrolled steps; per-step loss and top-1 agreement with the target.

    Step j at row i predicts the token the target predicts at row i + j, so rows i <= T - 1 - j count.
    """
    t = ids.shape[1]
    outs = draft.unroll(taps, shifted(ids), steps)
    d2t_ids = draft.draft_to_target
    total = taps.new_zeros(())
    losses, accs = [], []
    for j, (dl, _) in enumerate(outs, start=1):
        if t - j <= 0:
            break
        tl = logits[:, j:]  # [B, T-j, V]
        p = torch.softmax(tl[..., d2t_ids], dim=-1)
        logp = F.log_softmax(dl[:, : t - j].float(), dim=-1)
        loss = -(p * logp).sum(-1).mean()
        total = total + (step_decay ** (j - 1)) * loss
        acc = (d2t_ids[dl[:, : t - j].argmax(-1)] == tl.argmax(-1)).float().mean()
        losses.append(float(loss.detach()))
        accs.append(float(acc))
    return total, losses, accs


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the miniature's EAGLE-3 head on the target's own hidden states.")
    ap.add_argument("--target", type=Path, required=True, help="Kimi-layout target folder (models/kimi-k25-mini)")
    ap.add_argument("--out", type=Path, required=True, help="output folder (models/kimi-k25-mini-eagle3)")
    ap.add_argument(
        "--spec", type=Path, default=DEFAULT_SPEC, help="capture-spec YAML (taps and the config's id convention)"
    )
    ap.add_argument("--roots", nargs="*", type=Path, default=None)
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    ap.add_argument(
        "--stdlib-chars", type=int, default=100_000_000, help="standard-library characters (data.load_training_mix)"
    )
    ap.add_argument("--max-chars", type=int, default=150_000_000, help="third-party characters")
    ap.add_argument("--stdlib-weight", type=float, default=0.35, help="share of text rows and prompts from the stdlib")
    ap.add_argument("--data-cache", type=Path, default=None, help="keep the tokenized training mix here (reused)")
    ap.add_argument(
        "--arch",
        choices=sorted(ARCHITECTURES),
        default="llama",
        help="draft architecture: llama (LlamaForCausalLMEagle3) or mla (Eagle3DeepseekV2ForCausalLM, "
        "DeepSeek-V2 multi-latent attention as vLLM's deepseek_eagle3.py / "
        "SGLang's kimi_k25_eagle3.py)",
    )
    ap.add_argument("--fc-norm", action="store_true", help="EAGLE-3.1 fc_norm: RMSNorm per tap chunk before fc")
    ap.add_argument(
        "--norm-output",
        action="store_true",
        help="EAGLE-3.1 norm_output: feed the POST-norm state to the next draft step",
    )
    ap.add_argument("--q-lora-rank", type=int, default=128, help="mla: q down-projection rank")
    ap.add_argument(
        "--kv-lora-rank",
        type=int,
        default=512,
        help="mla: latent KV rank (vLLM-CPU's MLA kernel needs kv_lora_rank + qk_rope_head_dim = 576)",
    )
    ap.add_argument("--qk-nope-head-dim", type=int, default=64)
    ap.add_argument("--qk-rope-head-dim", type=int, default=64)
    ap.add_argument("--v-head-dim", type=int, default=64)
    ap.add_argument("--draft-vocab-size", type=int, default=2048)
    ap.add_argument(
        "--vocab-greedy-weight",
        type=float,
        default=0.0,
        help="weight of the target's greedy tokens (vs training text) when choosing the draft vocabulary "
        "by frequency; needs --greedy-prompts (0: text frequency only)",
    )
    ap.add_argument("--intermediate-size", type=int, default=512)
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--ttt-steps", type=int, default=5)
    ap.add_argument("--step-decay", type=float, default=0.8)
    ap.add_argument(
        "--greedy-prompts",
        type=int,
        default=0,
        help="training prompts continued greedily by the target for self-distillation (0: text only)",
    )
    ap.add_argument("--greedy-prompt-len", type=int, default=64)
    ap.add_argument(
        "--greedy-fraction",
        type=float,
        default=0.5,
        help="share of every batch drawn from the target's greedy continuations",
    )
    ap.add_argument("--greedy-batch", type=int, default=512, help="prompts per generation forward")
    ap.add_argument(
        "--greedy-time-budget-s",
        type=float,
        default=0.0,
        help="stop generating after this many seconds (the batches done so far are used; 0: no limit)",
    )
    ap.add_argument(
        "--greedy-cache",
        type=Path,
        default=None,
        help="torch file of the greedy continuations: read if it exists "
        "(same target, prompts and lengths), else generated and written there "
        "(two heads on one target generate once)",
    )
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--time-budget-s", type=float, default=0.0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--evaluate", action="store_true", help="run evaluate.py on the saved head afterwards")
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--eval-windows", type=int, default=128)
    args = ap.parse_args(argv)
    if args.time_budget_s <= 0 and args.max_steps <= 0:
        ap.error("give --time-budget-s or --max-steps")
    if args.greedy_prompts and not 0 < args.greedy_prompt_len < args.seq_len:
        ap.error(f"--greedy-prompt-len must lie in 1..{args.seq_len - 1} (--seq-len {args.seq_len})")
    if not 0.0 <= args.greedy_fraction <= 1.0:
        ap.error("--greedy-fraction must lie in [0, 1]")
    if not 0.0 <= args.vocab_greedy_weight <= 1.0:
        ap.error("--vocab-greedy-weight must lie in [0, 1]")
    if args.vocab_greedy_weight and not args.greedy_prompts:
        ap.error("--vocab-greedy-weight needs --greedy-prompts (the greedy tokens it weighs)")

    t_start = time.time()
    device = torch.device(args.device)
    amp = device.type == "cuda"
    torch.manual_seed(args.seed)
    spec_file = load_spec_file(args.spec)
    spec = spec_file.spec
    target = export.load_text_model(args.target, device=device)
    use_dense_experts(target)
    for p in target.parameters():
        p.requires_grad_(False)
    tcfg = target.config
    num_layers = tcfg.num_hidden_layers
    spec.check_num_layers(num_layers)
    convention = spec_file.draft_ids_convention or "vllm"
    ids_in_config = taps_to_ids(spec.taps, convention, num_layers)

    tok = tokenizer.load_tokenizer(args.target)
    eot = tokenizer.special_ids(tok)[tokenizer.EOS]
    train_files, _ = data.split_files(data.source_files(args.roots or data.default_roots()), args.heldout_fraction)
    mix, mix_stats = data.cached_training_mix(
        args.data_cache, tok, train_files, eot, args.stdlib_chars, args.max_chars, args.stdlib_weight
    )
    print(
        f"[data] {mix_stats}; taps {spec.label()} written as {convention} ids {list(ids_in_config)}; "
        f"prep {time.time() - t_start:.0f}s",
        flush=True,
    )

    greedy = None
    n_greedy = 0
    if args.greedy_prompts:
        pgen = torch.Generator().manual_seed(args.seed + 2)
        prompts = mix.windows(args.greedy_prompts, args.greedy_prompt_len, pgen).to(device)
        t_gen = time.time()
        cached = torch.load(args.greedy_cache) if args.greedy_cache and args.greedy_cache.exists() else None
        if (
            cached is not None
            and cached.shape[1] == args.seq_len
            and torch.equal(cached[:, : args.greedy_prompt_len], prompts[: cached.shape[0]].cpu())
        ):
            greedy = cached
            print(f"[data] greedy continuations read from {args.greedy_cache}", flush=True)
        else:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                greedy = greedy_continue(
                    target,
                    prompts,
                    args.seq_len - args.greedy_prompt_len,
                    args.greedy_batch,
                    progress="self-distill",
                    time_budget_s=args.greedy_time_budget_s,
                ).cpu()
            if args.greedy_cache:  # written whole, then renamed: a second head may be waiting for it
                torch.save(greedy, args.greedy_cache.with_suffix(".tmp"))
                args.greedy_cache.with_suffix(".tmp").replace(args.greedy_cache)
        n_greedy = round(args.batch * args.greedy_fraction)
        print(
            f"[data] {greedy.shape[0]:,} greedy sequences of {greedy.shape[1]} tokens in {time.time() - t_gen:.0f}s; "
            f"{n_greedy} of every {args.batch} training rows come from them",
            flush=True,
        )
    generated = None if greedy is None else greedy[:, args.greedy_prompt_len :]
    vocab_ids, coverage, greedy_coverage = choose_draft_vocab(
        mix.tokens, tcfg.vocab_size, args.draft_vocab_size, generated, args.vocab_greedy_weight
    )
    print(
        f"[data] draft vocab {args.draft_vocab_size} (greedy weight {args.vocab_greedy_weight}) covers "
        f"{coverage:.4f} of the training text and {greedy_coverage:.4f} of the target's greedy tokens",
        flush=True,
    )

    cfg = DraftConfig(
        hidden_size=tcfg.hidden_size,
        target_hidden_size=tcfg.hidden_size,
        num_aux_hidden_states=spec.num_taps,
        vocab_size=tcfg.vocab_size,
        draft_vocab_size=args.draft_vocab_size,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_heads,
        head_dim=args.head_dim,
        intermediate_size=args.intermediate_size,
        rms_norm_eps=tcfg.rms_norm_eps,
        max_position_embeddings=tcfg.max_position_embeddings,
        arch=args.arch,
        q_lora_rank=args.q_lora_rank,
        kv_lora_rank=args.kv_lora_rank,
        qk_nope_head_dim=args.qk_nope_head_dim,
        qk_rope_head_dim=args.qk_rope_head_dim,
        v_head_dim=args.v_head_dim,
        fc_norm=args.fc_norm,
        norm_output=args.norm_output,
    )
    draft = Eagle3Draft(cfg)
    draft.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.detach().float().cpu())
    draft.set_draft_vocab(vocab_ids)
    draft.to(device).train()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + 1)
    log: dict = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "draft_vocab_coverage": coverage,
        "draft_vocab_greedy_coverage": greedy_coverage,
        "data": mix_stats,
        "greedy_sequences": 0 if greedy is None else int(greedy.shape[0]),
        "params": sum(p.numel() for p in params),
        "train": [],
    }
    step, t0 = 0, time.time()
    while True:
        progress = run_progress(step, time.time() - t0, args.max_steps, args.time_budget_s)
        if progress >= 1.0:
            break
        set_lr(opt, lr_at(progress, step, args.lr, args.warmup))
        ids = mix.windows(args.batch - n_greedy, args.seq_len, gen)
        if n_greedy:
            ids = torch.cat([ids, greedy[torch.randint(0, greedy.shape[0], (n_greedy,), generator=gen)]])
        ids = ids.to(device)
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            taps, logits = target_outputs(target, ids, spec)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            loss, losses, accs = ttt_loss(draft, taps, ids, logits, args.ttt_steps, args.step_decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 10 == 0 or step == 1:
            log["train"].append(
                {
                    "step": step,
                    "loss": float(loss.detach()),
                    "step_losses": losses,
                    "step_top1": accs,
                    "time_s": time.time() - t0,
                }
            )
            if step % 100 == 0 or step == 1:
                elapsed = time.time() - t0
                done = run_progress(step, elapsed, args.max_steps, args.time_budget_s)
                print(
                    f"[train] step {step} ({progress_text(done, elapsed)}) loss {float(loss.detach()):.3f} "
                    f"top1/step {[round(a, 3) for a in accs]}",
                    flush=True,
                )
    log["final"] = {"steps": step, "train_time_s": time.time() - t0, "tokens": step * args.batch * args.seq_len}
    extra = {
        "vllm_eagle3": {
            "taps": spec.label(),
            "ids_convention": convention,
            "spec": args.spec.name,
            "target": args.target.name,
            "trained_with": "vllm_eagle3.miniature.train_draft",
        }
    }
    draft.save(args.out, ids_in_config, extra)
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"[saved] {args.out}: {step} steps in {time.time() - t0:.0f}s", flush=True)
    if args.evaluate:
        from . import evaluate

        del target
        evaluate.main(
            [
                "--target",
                str(args.target),
                "--draft",
                str(args.out),
                "--spec",
                str(args.spec),
                "--device",
                args.device,
                "--prompts",
                str(args.eval_prompts),
                "--windows",
                str(args.eval_windows),
                "--heldout-fraction",
                str(args.heldout_fraction),
            ]
            + (["--roots", *map(str, args.roots)] if args.roots else [])
        )


if __name__ == "__main__":
    main()
