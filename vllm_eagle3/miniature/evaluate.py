"""Offline evaluation of the miniature pair on held-out Python files; writes ``eval.json`` next to the head.

Where it sits: after train_target.py and train_draft.py, on the SHIPPED weights (bf16 files loaded
into float32, float32 arithmetic, TF32 off) so the numbers describe what vLLM-CPU serves in float32.

Measured:
* target: next-token loss, perplexity and top-1 on held-out windows;
* draft: teacher-forced top-1 agreement with the target's greedy token, per unrolled step;
* simulated acceptance, "greedy" (the headline): held-out prompts are continued greedily by the
  target; at every anchor of the continuation the head drafts a chain of k = 1..5 tokens exactly as
  vLLM's proposer does (step 1 on ``fc(taps)``, later steps on its own fed-back state: pre-norm, post-norm
  with ``norm_output``; positions +1, attention over the step-1 cache plus the chain); a draft is accepted
  while it equals the target's greedy token. Per-position acceptance = fraction of anchors whose first j
  drafts were all accepted; acceptance length(k) = 1 + sum of the first k. Also "text": the same chain on held-out text.
* "served_walk": the same greedy chains visited the way a server visits them (draft at the anchor after
  prefill, accept the leading matches a, next anchor a + 1 tokens later): per prompt (drafts, accepted) and
  1 + accepted / drafts, which is what vLLM's ``/metrics`` counters measure. It is lower than the every-anchor
  average when acceptance is uneven: a server drafts more often where drafts fail (short advances).

The prompts and the target's greedy continuations are saved to ``eval_prompts.json`` so serving
tests can replay them (use ``prompt_token_ids``, ``ignore_eos``, temperature 0, float32).

CLI: ``python -m vllm_eagle3.miniature.evaluate --target models/kimi-k25-mini --draft models/kimi-k25-mini-eagle3``
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Sequence

import torch

from vllm_eagle3.resolve import load_spec_yaml

from . import data, export, tokenizer
from vllm_eagle3.reference.acceptance import MAX_K, chain_eval, walk_summary
from vllm_eagle3.reference import Eagle3Draft
from .target import use_dense_experts
from vllm_eagle3.reference.teacher import DEFAULT_SPEC, greedy_continue

__all__ = ["greedy_continue", "main"]  # greedy_continue: re-exported (it lives in teacher.py)


def plot_curves(target_log: dict, draft_log: dict, path: Path) -> bool:
    """Training curves PNG (target loss / held-out loss; draft loss and per-step top-1). False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    tr = target_log.get("train", [])
    ax[0].plot([r["tokens"] / 1e6 for r in tr], [r["loss"] for r in tr], label="train loss")
    ev = target_log.get("eval", [])
    ax[0].plot([r["tokens"] / 1e6 for r in ev], [r["loss"] for r in ev], "o-", label="held-out loss")
    ax[0].set_xlabel("tokens (M)")
    ax[0].set_title("target")
    ax[0].legend()
    ax[0].grid(alpha=0.3)
    dr = draft_log.get("train", [])
    ax[1].plot([r["step"] for r in dr], [r["loss"] for r in dr])
    ax[1].set_xlabel("step")
    ax[1].set_title("draft: weighted TTT loss")
    ax[1].grid(alpha=0.3)
    if dr:
        for j in range(len(dr[-1]["step_top1"])):
            ax[2].plot(
                [r["step"] for r in dr if len(r["step_top1"]) > j],
                [r["step_top1"][j] for r in dr if len(r["step_top1"]) > j],
                label=f"step {j + 1}",
            )
    ax[2].set_xlabel("step")
    ax[2].set_title("draft: train top-1 vs target greedy")
    ax[2].legend()
    ax[2].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return True


def update_served_walk(args) -> None:
    """``--walk-only``: served-walk simulation on the saved prompts + greedy continuations; eval.json updated."""
    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device)
    spec = load_spec_yaml(args.spec)
    target = export.load_text_model(args.target, dtype=torch.float32, device=device)
    use_dense_experts(target)  # the same MoE function, without a host sync per layer
    draft = Eagle3Draft.from_dir(args.draft, target_dir=args.target).to(device)
    items = json.loads((args.draft / "eval_prompts.json").read_text())["items"]
    plen = {len(it["prompt_token_ids"]) for it in items}
    if len(plen) != 1:
        raise SystemExit(f"eval_prompts.json: prompts of different lengths {sorted(plen)}; re-run the full evaluation")
    seqs = torch.tensor([it["prompt_token_ids"] + it["continuation_token_ids"] for it in items], device=device)
    _, _, match = chain_eval(target, draft, seqs, spec, plen.pop() - 1, args.batch)
    out = args.out or (args.draft / "eval.json")
    result = json.loads(out.read_text())
    result["simulated_acceptance"]["served_walk"] = walk_summary(match, range(1, MAX_K + 1))
    result["setup"]["served_walk_device"] = str(device)
    out.write_text(json.dumps(result, indent=1) + "\n")
    walk = result["simulated_acceptance"]["served_walk"]
    print(
        f"[walk] {len(items)} prompts; served-walk acceptance length k=1..{MAX_K} "
        f"{[round(walk[str(k)]['acceptance_length'], 3) for k in range(1, MAX_K + 1)]}; {time.time() - t0:.0f}s"
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Evaluate the miniature target and its EAGLE-3 head on held-out text; write eval.json."
    )
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    ap.add_argument("--roots", nargs="*", type=Path, default=None)
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    ap.add_argument(
        "--windows", type=int, default=128, help="held-out text windows for perplexity / top-1 / text acceptance"
    )
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=64, help="held-out prompts continued greedily")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None, help="eval.json path (default: DRAFT/eval.json)")
    ap.add_argument(
        "--walk-only",
        action="store_true",
        help="only (re)compute simulated_acceptance.served_walk from DRAFT/eval_prompts.json (no text "
        "evaluation, no generation: CPU-friendly) and update eval.json in place",
    )
    args = ap.parse_args(argv)
    if args.walk_only:
        return update_served_walk(args)

    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    spec = load_spec_yaml(args.spec)
    target = export.load_text_model(args.target, dtype=torch.float32, device=device)
    use_dense_experts(target)  # the same MoE function, without a host sync per layer
    draft = Eagle3Draft.from_dir(args.draft, target_dir=args.target).to(device)
    tok = tokenizer.load_tokenizer(args.target)
    eot = tokenizer.special_ids(tok)[tokenizer.EOS]
    _, held_files = data.split_files(data.source_files(args.roots or data.default_roots()), args.heldout_fraction)
    held = data.encode_texts(tok, data.read_texts(held_files, 3_000_000), eot)
    windows = data.fixed_windows(held, args.seq_len, args.windows).to(device)

    # Target perplexity / top-1 on held-out text.
    nll, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, windows.shape[0], args.batch):
            ids = windows[i : i + args.batch]
            lg = target(input_ids=ids).logits[:, :-1].float()
            nll += float(
                torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
            )
            correct += int((lg.argmax(-1) == ids[:, 1:]).sum())
            n += ids[:, 1:].numel()
    target_metrics = {"heldout_loss": nll / n, "perplexity": math.exp(nll / n), "top1": correct / n, "tokens": n}

    text_stats, text_top1, _ = chain_eval(target, draft, windows, spec, 0, args.batch)
    # Greedy continuations of held-out prompts (taken from the held-out stream after the windows).
    start = windows.numel()
    plen = args.prompt_len
    avail = (held.numel() - start) // plen
    src = held[start : start + min(args.prompts, avail) * plen] if avail >= 1 else held[: args.prompts * plen]
    prompts = src.view(-1, plen).long().to(device)
    seqs = greedy_continue(target, prompts, args.new_tokens, args.batch, progress="eval")
    greedy_stats, greedy_top1, greedy_match = chain_eval(target, draft, seqs, spec, plen - 1, args.batch)
    gold = seqs[:, plen:]
    in_vocab = float(draft.t2d[gold].float().mean())

    result = {
        "target": target_metrics,
        "draft": {
            "teacher_forced_top1_per_step_text": text_top1,
            "teacher_forced_top1_per_step_greedy": greedy_top1,
            "teacher_forced_top1": text_top1[0],
            "greedy_tokens_in_draft_vocab": in_vocab,
        },
        "simulated_acceptance": {
            "greedy": greedy_stats.summary(),
            "text": text_stats.summary(),
            "served_walk": walk_summary(greedy_match, range(1, MAX_K + 1)),
        },
        "setup": {
            "taps": spec.label(),
            "dtype": "float32 (bf16 weights)",
            "device": str(device),
            "windows": int(windows.shape[0]),
            "seq_len": args.seq_len,
            "prompts": int(prompts.shape[0]),
            "prompt_len": plen,
            "new_tokens": args.new_tokens,
            "max_k": MAX_K,
            "definition": "acceptance_length[k] = 1 + sum_{j<=k} per_position_acceptance[j]; "
            "per_position_acceptance[j] = fraction of anchors whose first j chained drafts all equal "
            "the target's greedy tokens",
        },
    }
    out = args.out or (args.draft / "eval.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    replay = {
        "note": "prompt_token_ids -> target greedy continuation_token_ids (float32, no EOS stop); "
        "replay with temperature 0, ignore_eos, max_tokens=len(continuation)",
        "items": [
            {
                "prompt_token_ids": p.tolist(),
                "prompt": tok.decode(p.tolist(), skip_special_tokens=False),
                "continuation_token_ids": s[plen:].tolist(),
            }
            for p, s in zip(prompts.cpu(), seqs.cpu())
        ],
    }
    (out.parent / "eval_prompts.json").write_text(json.dumps(replay) + "\n")
    tl = Path(args.target) / "train_log.json"
    dl = Path(args.draft) / "train_log.json"
    if tl.exists() and dl.exists():
        plot_curves(json.loads(tl.read_text()), json.loads(dl.read_text()), out.parent / "training_curves.png")
    g = result["simulated_acceptance"]["greedy"]
    print(
        f"[eval] target ppl {target_metrics['perplexity']:.2f} top1 {target_metrics['top1']:.3f}; draft top1 (text) "
        f"{[round(x, 3) for x in text_top1]}; "
        f"greedy per-position {[round(x, 3) for x in g['per_position_acceptance']]}; "
        f"acceptance length k=1..5 {[round(v, 3) for v in g['acceptance_length'].values()]}; "
        f"in-draft-vocab {in_vocab:.3f}; {time.time() - t0:.0f}s",
        flush=True,
    )


if __name__ == "__main__":
    main()
