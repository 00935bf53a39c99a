"""Where the time of one engine step goes: plain decode vs EAGLE-3 verify, on the real vLLM engine (offline ``LLM``).

Data flow position: around the whole pipeline (target forward -> taps -> draft -> proposer), measured from inside
the worker. Nothing here changes what the engine computes.

One process holds one engine per configuration (no speculation, and one per draft head) with the serve config's
options (float32, eager, max_model_len 1024, text only), and feeds them the same greedy requests, concurrency by
concurrency, round by round, alternating engines: the machine is shared, so only ratios and fractions measured side
by side mean anything. In each worker, wrappers time every step (``execute_model`` + ``sample_tokens``) and its parts:
the target forward (``_model_forward``), the sampler / rejection sampler (``_sample``), the draft (``propose_draft_
token_ids``, k draft forwards) and the rest (input preparation, bookkeeping: Python per step); module hooks split the
target forward into MLA attention (the kernel, the projections), MoE (router, routed experts, shared expert), the
dense MLP, norms, and the logits. Steps are classified: ``decode`` (every request 1 token), ``verify`` (every request
1 + its drafts), anything with a prompt is left out. Optionally (``--torch-profile N``) the first N steady steps of
each (engine, concurrency) run under ``torch.profiler`` and the top ops by self CPU time are reported.

    python -m vllm_eagle3.tools.bench.profile_step --heads none,llama,mla --concurrency 1,4,16 --rounds 2
    python -m vllm_eagle3.tools.bench.profile_step --heads none,llama --concurrency 16 --torch-profile 3 --json out.json

Engines are started like the tests start them (vllm_eagle3/tools/engine.py); wrap the command in the machine's
engine-slot script when others share it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
HEADS = {  # name -> (draft folder, capture spec)
    "llama": (REPO / "models" / "kimi-k25-mini-eagle3", REPO / "configs" / "kimi_k25_eagle3.yaml"),
    "mla": (REPO / "models" / "kimi-k25-mini-eagle3-mla", REPO / "configs" / "kimi_k25_eagle3.yaml"),
}
PARTS = ("forward", "sample", "draft")

# module class name -> category inside the target forward (outermost match wins; nested ones are split out below)
MODULE_CATEGORIES = {
    "DeepseekV2MLAAttention": "attention",
    "MLAAttention": "attention.kernel",  # the attention layer proper (cache write + MLA kernel / prefill path)
    "DeepseekV2MoE": "moe",
    "GateLinear": "moe.router",
    "ReplicatedLinear": None,  # resolved by attribute name (the MoE gate is a ReplicatedLinear named 'gate')
    "SharedFusedMoE": "moe.experts",
    "FusedMoE": "moe.experts",
    "DeepseekV2MLP": "mlp",  # dense MLP (layer 0) or the MoE's shared expert (counted under moe.shared)
    "RMSNorm": "norm",
}


# ----------------------------------------------------------------------------------------------- worker side

class _Recorder:
    """Per-step timings collected in the worker (one instance per worker process)."""

    def __init__(self, num_spec: int, torch_profile_steps: int):
        self.num_spec = num_spec
        self.torch_profile_steps = torch_profile_steps
        self.steps: list[dict] = []
        self.current: dict | None = None
        self.label = ""
        self.module_t: dict[str, float] = {}
        self.profiled: dict[str, int] = {}
        self.op_tables: dict[str, dict[str, float]] = {}
        self.prof = None


_REC: _Recorder | None = None


def _step_kind(so) -> str:
    spec = getattr(so, "scheduled_spec_decode_tokens", {}) or {}
    if getattr(so, "scheduled_new_reqs", None):
        return "prefill"
    kind = "decode"
    for req_id, n in so.num_scheduled_tokens.items():
        drafts = len(spec.get(req_id, ()))
        if n != 1 + drafts:
            return "prefill"
        if drafts:
            kind = "verify"
    return kind


def _wrap(obj, name: str, part: str) -> None:
    original = getattr(obj, name)

    def timed(*args, **kwargs):
        rec = _REC
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            if rec is not None and rec.current is not None:
                rec.current[part] = rec.current.get(part, 0.0) + time.perf_counter() - t0

    setattr(obj, name, timed)


def _module_hooks(model) -> int:
    """Forward pre/post hooks timing the categories of :data:`MODULE_CATEGORIES` (inclusive times)."""
    import torch.nn as nn

    count = 0
    for qual, module in model.named_modules():
        cls = type(module).__name__
        cat = MODULE_CATEGORIES.get(cls, "absent")
        if cat == "absent" and cls.endswith("MLAAttention") and cls != "DeepseekV2MLAAttention":
            cat = "attention.kernel"
        if cls == "ReplicatedLinear" or cls == "GateLinear":
            cat = "moe.router" if qual.endswith(".gate") else None
        if cls == "DeepseekV2MLP" and ".shared_experts" in qual:
            cat = "moe.shared"
        if cat in ("absent", None):
            continue
        if ".layers." not in qual and cat != "norm":
            continue
        if cat == "norm" and not qual.endswith(("layernorm", ".norm")):
            cat = "attention.norm"  # q_a/kv_a layernorms inside the attention
        starts: list[float] = []

        def pre(mod, args, _starts=starts):
            _starts.append(time.perf_counter())

        def post(mod, args, out, _starts=starts, _cat=cat):
            dt = time.perf_counter() - _starts.pop()
            rec = _REC
            if rec is not None and rec.current is not None:
                m = rec.current.setdefault("modules", {})
                m[_cat] = m.get(_cat, 0.0) + dt

        assert isinstance(module, nn.Module)
        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        count += 1
    return count


def worker_install(worker, num_spec: int, torch_profile_steps: int, module_hooks: bool = True) -> str:
    """``collective_rpc`` target: install the step timers in this worker (idempotent)."""
    global _REC
    if _REC is not None:
        return "already installed"
    runner = worker.model_runner
    _REC = _Recorder(num_spec, torch_profile_steps)
    original_execute, original_sample = runner.execute_model, runner.sample_tokens

    def execute_model(scheduler_output, *args, **kwargs):
        rec = _REC
        so = scheduler_output
        rec.current = {"label": rec.label, "kind": _step_kind(so), "tokens": so.total_num_scheduled_tokens,
                       "reqs": len(so.num_scheduled_tokens)}
        if (rec.current["kind"] != "prefill" and rec.torch_profile_steps
                and rec.profiled.get(rec.label, 0) < rec.torch_profile_steps and rec.prof is None):
            import torch.profiler as tp

            rec.prof = tp.profile(activities=[tp.ProfilerActivity.CPU])
            rec.prof.__enter__()
        rec.current["t0"] = time.perf_counter()
        out = original_execute(scheduler_output, *args, **kwargs)
        rec.current["execute"] = time.perf_counter() - rec.current["t0"]
        if out is not None or rec.current["tokens"] == 0:  # no sample_tokens call follows
            _finish(rec)
        return out

    def sample_tokens(*args, **kwargs):
        rec = _REC
        t0 = time.perf_counter()
        out = original_sample(*args, **kwargs)
        if rec.current is not None:
            rec.current["sample_tokens"] = time.perf_counter() - t0
            sampled = getattr(out, "sampled_token_ids", None)
            if isinstance(sampled, list):  # synchronous scheduling: tokens emitted per request this step
                rec.current["emitted"] = sum(len(x) for x in sampled)
            _finish(rec)
        return out

    runner.execute_model, runner.sample_tokens = execute_model, sample_tokens
    _wrap(runner, "_model_forward", "forward")
    _wrap(runner, "_sample", "sample")
    if hasattr(runner, "propose_draft_token_ids"):
        _wrap(runner, "propose_draft_token_ids", "draft")
    hooks = _module_hooks(runner.get_model()) if module_hooks else 0
    import torch

    return f"timers installed in pid {os.getpid()}, {hooks} module hooks, {torch.get_num_threads()} torch threads"


def _finish(rec: _Recorder) -> None:
    cur = rec.current
    cur["end"] = time.perf_counter()
    cur["start"] = cur.pop("t0")
    cur["total"] = cur["end"] - cur["start"]
    rec.current = None
    if rec.prof is not None:
        rec.prof.__exit__(None, None, None)
        table = rec.op_tables.setdefault(f"{cur['label']}|{cur['kind']}", {})
        for evt in rec.prof.key_averages():
            table[evt.key] = table.get(evt.key, 0.0) + evt.self_cpu_time_total / 1e6
        table["__total__"] = table.get("__total__", 0.0) + cur["total"]
        rec.profiled[rec.label] = rec.profiled.get(rec.label, 0) + 1
        rec.prof = None
        cur["profiled"] = True
    rec.steps.append(cur)


def worker_set_label(worker, label: str) -> None:
    _REC.label = label


def worker_collect(worker) -> dict:
    """``collective_rpc`` target: the steps and op tables recorded so far (then cleared)."""
    out = {"steps": _REC.steps, "ops": _REC.op_tables}
    _REC.steps, _REC.op_tables = [], {}
    return out


# ----------------------------------------------------------------------------------------------- driver side

def _prompts(n: int) -> list[list[int]]:
    items = json.loads((HEADS["llama"][0] / "eval_prompts.json").read_text())["items"]
    return [items[i % len(items)]["prompt_token_ids"] for i in range(n)]


def _start(label: str, k: int, args):
    from vllm_eagle3.tools.engine import start_engine

    head, _, k_text = label.partition("@")
    k = int(k_text) if k_text else k
    kwargs = dict(max_model_len=1024, disable_log_stats=False, max_num_seqs=max(args.concurrency))
    if head == "none":
        engine = start_engine(TARGET, None, **kwargs)
    else:
        draft, spec = HEADS[head]
        engine = start_engine(TARGET, draft, env={"EAGLE3_SPEC": str(spec)}, num_speculative_tokens=k,
                              **kwargs)
    installed = engine.llm.collective_rpc(worker_install, args=(0 if head == "none" else k, args.torch_profile,
                                                                 args.module_hooks))
    print(f"[profile_step] {label}: engine ready in {engine.startup_s:.0f} s; {installed}", file=sys.stderr)
    return engine


def _run(engine, label: str, conc: int, max_tokens: int, rnd: int) -> dict:
    from vllm import SamplingParams

    engine.llm.collective_rpc(worker_set_label, args=(label,))
    prompts = _prompts(conc + rnd)[rnd:]  # a different prompt set each round
    t0 = time.perf_counter()
    outs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                               use_tqdm=False)
    wall = time.perf_counter() - t0
    return {"wall": wall, "tokens": [list(o.outputs[0].token_ids) for o in outs]}


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def summarize(steps: list[dict]) -> dict:
    """Median per-step times of the steady steps (decode or verify) and the median parts and module times."""
    steady = [s for s in steps if s["kind"] != "prefill" and not s.get("profiled")]
    if not steady:
        return {}
    every = [s for s in steps if s["kind"] != "prefill"]
    emitted = sum(s.get("emitted", 0) for s in every)
    out = {"n": len(steady), "kind": steady[0]["kind"], "tokens": _median([s["tokens"] for s in steady]),
           "tau_steps": emitted / max(1, sum(s["reqs"] for s in every)),
           "total": _median([s["total"] for s in steady])}
    for part in PARTS:
        out[part] = _median([s.get(part, 0.0) for s in steady])
    out["other"] = _median([s["total"] - sum(s.get(p, 0.0) for p in PARTS) for s in steady])
    # outside the worker: end of one steady step to the start of the next (engine core scheduling, IPC, output
    # processing in the engine core); the front end (this process) runs concurrently
    out["gap"] = _median([b["start"] - a["end"] for a, b in zip(steps, steps[1:])
                          if a["kind"] != "prefill" and b["kind"] != "prefill" and not a.get("profiled")])
    cats = sorted({c for s in steady for c in s.get("modules", {})})
    out["modules"] = {c: _median([s.get("modules", {}).get(c, 0.0) for s in steady]) for c in cats}
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m vllm_eagle3.tools.bench.profile_step", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Reports medians over steady steps; ratios are measured in one process, "
                                       "engines alternating, so they hold on a shared machine.")
    p.add_argument("--heads", default="none,llama", help="comma list of engines: none (no speculation), "
                   f"{', '.join(HEADS)} (EAGLE-3 with that head), HEAD@K for K drafts (e.g. llama@2); "
                   "default none,llama")
    p.add_argument("--concurrency", default="1,4,16", help="comma list of concurrent requests (default 1,4,16)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3, help="drafts per step (default 3)")
    p.add_argument("--max-tokens", type=int, default=48, help="output tokens per request (default 48)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over all (concurrency, engine) cells (default 2)")
    p.add_argument("--torch-profile", type=int, default=0, metavar="N",
                   help="also run the first N steady steps of each cell under torch.profiler (default 0: off)")
    p.add_argument("--no-module-hooks", dest="module_hooks", action="store_false",
                   help="leave out the per-module timers (~1,100 Python calls per target forward, a fixed cost that "
                        "pulls step ratios toward 1); the forward / sample / draft / other split stays")
    p.add_argument("--top-ops", type=int, default=15, help="ops listed per profiled cell (default 15)")
    p.add_argument("--json", type=Path, default=None, help="write the raw summary here")
    args = p.parse_args(argv)
    args.heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    bad = [h for h in args.heads if h != "none" and (h.partition("@")[0] not in HEADS
                                                     or not h.partition("@")[2] in ("", "1", "2", "3", "4", "5"))]
    if bad:
        p.error(f"unknown head(s) {bad}: use none or one of {sorted(HEADS)}, optionally @K with K in 1..5")
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency {args.concurrency!r}: give integers, e.g. 1,4,16")
    if any(c < 1 for c in args.concurrency) or args.rounds < 1 or args.max_tokens < 8:
        p.error("--concurrency >= 1, --rounds >= 1 and --max-tokens >= 8")
    return args


def main(argv: list[str] | None = None) -> int:
    if __name__ == "__main__":  # worker functions must be pickled by reference to this module, not by value
        from vllm_eagle3.tools.bench import profile_step

        return profile_step.main(argv)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for k, v in {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                 "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}.items():
        os.environ.setdefault(k, v)
    from vllm_eagle3.tools.serve.cli import openmp_env

    os.environ.update(openmp_env())  # as `vllm-eagle3 serve` runs it (Intel OpenMP preloaded)
    from vllm_eagle3.tools.engine import stop_engine

    engines = {}
    try:
        for head in args.heads:
            engines[head] = _start(head, args.num_speculative_tokens, args)
        for head, engine in engines.items():  # warm-up: one short run per engine and concurrency
            for c in args.concurrency:
                _run(engine, "warmup", c, 8, 0)
        results: dict = {}
        for rnd in range(args.rounds):
            for c in args.concurrency:
                for head, engine in engines.items():
                    r = _run(engine, f"{head}|c{c}", c, args.max_tokens, rnd + 1)
                    cell = results.setdefault(f"{head}|c{c}", {"wall": [], "tokens": []})
                    cell["wall"].append(r["wall"])
                    cell["tokens"].append(r["tokens"])
                    print(f"[profile_step] round {rnd + 1} c={c} {head}: {r['wall']:.1f} s", file=sys.stderr)
        collected = {head: engine.llm.collective_rpc(worker_collect)[0] for head, engine in engines.items()}
    finally:
        for engine in engines.values():
            stop_engine(engine)
    report = build_report(args, results, collected)
    print(render(report, args))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def build_report(args, results, collected) -> dict:
    report: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "cells": {}, "ops": {}}
    for head, data in collected.items():
        for c in args.concurrency:
            label = f"{head}|c{c}"
            steps = [s for s in data["steps"] if s["label"] == label]
            cell = summarize(steps)
            res = results[label]
            # vLLM's spec-decode counters live in one per-process registry: with several engines in this process
            # they are not per engine, so the acceptance length comes from the worker (tokens emitted per request
            # per steady step; the last step of a request may emit more than max_tokens keeps: a slight overestimate)
            cell["tau"] = cell.get("tau_steps", float("nan"))

            cell["wall_per_request_token"] = _median(res["wall"]) / (args.max_tokens * c)
            if head != "none":
                base = results[f"none|c{c}"]["tokens"] if "none" in collected else None
                cell["greedy_identical"] = None if base is None else res["tokens"] == base
            report["cells"][label] = cell
        for key, table in data["ops"].items():
            total = table.pop("__total__")
            top = sorted(table.items(), key=lambda kv: -kv[1])[:args.top_ops]
            report["ops"][f"{head}|{key}"] = {"step_total_s": total, "top": top}
    return report


def render(report: dict, args) -> str:
    lines = ["per-step medians; every time in units of the no-speculation decode step at the same concurrency "
             "(measured alternately in this process); est. speedup = tau x (decode step + gap) / (spec step + gap)",
             ""]
    head_row = ("engine", "c", "kind", "tokens", "step", "forward", "sample", "draft", "other", "gap", "tau",
                "est. speedup", "greedy =")
    lines.append(" | ".join(head_row))
    for c in args.concurrency:
        base = report["cells"].get(f"none|c{c}", {}).get("total")
        for head in args.heads:
            cell = report["cells"].get(f"{head}|c{c}")
            if not cell or "total" not in cell:
                continue
            unit = base or cell["total"]
            base_gap = report["cells"].get(f"none|c{c}", {}).get("gap", 0.0)
            est = (cell["tau"] * (unit + base_gap) / (cell["total"] + cell["gap"])
                   if base and head != "none" else None)
            row = [head, str(c), cell["kind"], f"{cell['tokens']:.0f}", f"{cell['total'] / unit:.2f}"]
            row += [f"{cell[p] / unit:.2f}" for p in (*PARTS, "other", "gap")]
            row += [f"{cell['tau']:.2f}", f"{est:.2f}" if est else "-",
                    str(cell.get("greedy_identical", "-"))]
            lines.append(" | ".join(row))
    lines += ["", "target forward split (fraction of the step; inclusive module times):"]
    for label, cell in report["cells"].items():
        if "modules" in cell:
            mods = ", ".join(f"{k} {v / cell['total']:.2f}" for k, v in cell["modules"].items())
            lines.append(f"  {label} {cell.get('kind')}: {mods}")
    for label, ops in report["ops"].items():
        lines += ["", f"torch.profiler {label}: top ops by self CPU time, fraction of the profiled steps' time"]
        for name, t in ops["top"]:
            lines.append(f"  {t / ops['step_total_s']:.3f}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
