"""The command line of ``vllm-eagle3 bench`` (``make bench``): a :class:`~.plan.Plan` from ``--plan`` and the flags
that grow or shrink it, run (``run.py``), the results file, then ``BENCHMARKS.md``, the plot and the advice from it,
all in ``--out-dir`` (default outside the repository); ``--publish`` also writes them where the repository keeps them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from vllm_eagle3.tools import OUTPUT_HOME, REPO, machine
from vllm_eagle3.tools.bench import advise, plan as plans, report, report_adaptive, report_soak

DEFAULT_SERVE_CONFIG = "configs/serve_kimi_k25_mini.yaml"
DEFAULT_CAPTURE_SPEC = "configs/kimi_k25_eagle3.yaml"
DEFAULT_PROMPTS = "models/kimi-k25-mini-eagle3/eval_prompts.json"
DOCS = {
    "md": "BENCHMARKS.md",
    "png": "docs/bench.png",
    "json": "bench/results.json",
    "soak": "bench/soak.json",
    "adaptive": "bench/adaptive/results.json",
    "adaptive_bf16": "bench/adaptive-bf16/results.json",
}
ADAPTIVE = ("adaptive", "adaptive_bf16")  # the adaptive-k runs the repository's page shows: CPU_MLA f32, AMX_MLA bf16
PUBLISHED = {
    "default": "the repository's BENCHMARKS.md, bench/results.json and docs/bench.png",
    "shipped": "bench/shipped-<host kind>/ (and the repository's BENCHMARKS.md lists it)",
}
"""The plans the repository keeps a run of, and where ``--publish`` puts it (:func:`published`)."""


def default_out_dir(plan: str) -> Path:
    """Where a run writes when ``--out-dir`` is not given: outside the repository, one folder per plan."""
    return OUTPUT_HOME / f"bench-{plan}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 bench",
        description="EAGLE-3 vs no speculation on vLLM's OpenAI server (the shipped miniature), with 95% intervals: "
        "concurrency 1/4/16, eager and compiled, the MLA opt-out, plugin vs native capture, the SGLang "
        "default wiring (taps 3/31/59), the draft/verify split, advice. Default plan ~1 h on a quiet "
        "2-core box (--dry-run prints the estimate); run it alone on the machine (make bench).",
    )
    p.add_argument(
        "--plan",
        choices=sorted(plans.PLANS),
        default="default",
        help="smoke: every code path, numbers meaningless; default: the headline cells (~1 h); check: "
        "the online wiring check's cost (~30 min); adaptive: k per batch size vs static k (~80 min); "
        "shipped: the shipped default (live_k) vs no speculation, issue 41's bar (~30 min; --publish: "
        "bench/shipped-<host kind>); sustained: the shipped default vs no speculation, each cell long enough "
        "for live k to move (--sustained-steps; ~85 min); --dry-run lists each",
    )
    p.add_argument("--smoke", action="store_const", dest="plan", const="smoke", help="= --plan smoke")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated duration, run nothing")
    g = p.add_argument_group("grow or shrink the plan")
    g.add_argument(
        "--k",
        type=int,
        help="speculative tokens of the headline variants (default 3); --plan adaptive: the largest k tried (5)",
    )
    g.add_argument("--concurrency", type=int, nargs="+", help="default 1 4 16")
    g.add_argument("--prompts-per-cell", type=int, help="different prompts per throughput cell (16)")
    g.add_argument("--max-tokens", type=int, help="output tokens per request (128)")
    g.add_argument(
        "--waves",
        type=int,
        help="a throughput cell at concurrency C sends max(prompts-per-cell, waves x C) requests, C in "
        "flight (4: steady load; 1: one wave, timed by its slowest request)",
    )
    g.add_argument(
        "--sustained-steps",
        type=int,
        metavar="N",
        help="sustained load: each throughput cell at C sends enough requests for ~N decode steps at batch C "
        "(sized by requests, not by clock; past the prompt file's end its prompts are sent again); live k reaches "
        "the best k from a wrong start within ~600 steps in a bucket (a sweep of every k, then the race); "
        "--plan sustained: 720",
    )
    g.add_argument(
        "--compiled",
        action=argparse.BooleanOptionalAction,
        help="add (--compiled) or skip (--no-compiled, saves ~9 min) the compiled (torch.compile) "
        "variants; default: the plan's (default: yes)",
    )
    g.add_argument("--no-opt-out", action="store_true", help="skip the MLA verify-as-decode opt-out variant")
    g.add_argument(
        "--no-capture-ab",
        action="store_true",
        help="skip the plugin-vs-native capture servers (and with them the SGLang default wiring)",
    )
    g.add_argument(
        "--only",
        nargs="+",
        metavar="KEY",
        help="run only these variants of the plan (keys as --dry-run lists them, e.g. nospec+compiled)",
    )
    g = p.add_argument_group("inputs and outputs")
    g.add_argument("--config", default=DEFAULT_SERVE_CONFIG, help=f"base serve YAML ({DEFAULT_SERVE_CONFIG})")
    g.add_argument("--capture-spec", default=DEFAULT_CAPTURE_SPEC, help=f"({DEFAULT_CAPTURE_SPEC})")
    g.add_argument(
        "--prompts",
        help=f"prompt token ids (default {DEFAULT_PROMPTS}; --plan adaptive: "
        f"{plans.PLAN_PROMPTS['adaptive']}, prompts no shipped model trained on)",
    )
    g.add_argument(
        "--out-dir",
        help="write results.json, BENCHMARKS.md and bench.png here (default "
        f"{default_out_dir('<plan>')}; never the repository unless named here)",
    )
    g.add_argument(
        "--publish",
        action="store_true",
        help="also write the run (or --from-json's results) where the repository keeps it: "
        + "; ".join(f"--plan {k}: {v}" for k, v in PUBLISHED.items()),
    )
    g.add_argument(
        "--start-timeout",
        type=float,
        metavar="S",
        help="seconds a server may take to start (default 400 eager, 1200 compiled)",
    )
    g.add_argument("--log-dir", help="server logs (default: a temporary folder, printed)")
    g.add_argument(
        "--from-json",
        metavar="RESULTS",
        help="run nothing: write BENCHMARKS.md and the plot again from a results file (into --out-dir; "
        "with --publish and no --out-dir, only where the repository keeps it)",
    )
    g.add_argument(
        "--repo-page",
        action="store_true",
        help=f"run nothing: write the repository's {DOCS['md']} again from its committed results, the last "
        "soak and the adaptive-k runs (the plot left as it is; `vllm-eagle3 soak --publish` does this)",
    )
    g.add_argument(
        "--advise",
        action="store_true",
        help="with --from-json: print the k-per-batch-size table its static-k servers give, as the "
        "speculative-config lines of a serve YAML, and write nothing",
    )
    return p


def build_plan(args: argparse.Namespace) -> plans.Plan:
    """The named plan with the command line's changes (k, concurrencies, sizes, variants left out or kept)."""
    kw = dict(plans.PLAN_ARGS[args.plan])
    headline = args.plan not in plans.BUILDERS
    refused = {
        "--k": args.k is not None and args.plan == "shipped",
        "--no-opt-out": args.no_opt_out,
        "--no-capture-ab": args.no_capture_ab,
    }  # these change variants that only the headline plans have
    if not headline and any(refused.values()):
        raise ValueError(f"{', '.join(flag for flag, on in refused.items() if on)}: not part of --plan {args.plan}")
    if args.k is not None:  # the adaptive plan tries every k from 1 to this one
        if args.k < 1:
            raise ValueError(f"--k {args.k}: speculative tokens must be >= 1 (no speculation is in every plan already)")
        kw.update({"ks": tuple(range(1, args.k + 1))} if args.plan == "adaptive" else {"k": args.k})
    if args.concurrency:
        kw["concurrencies"] = cs = tuple(sorted(set(args.concurrency)))
        for key in ("sglang_default_throughput", "opt_out_throughput") if headline else ():
            kept = tuple(c for c in kw.get(key, (16,)) if c in cs)  # keep those that remain, else the highest
            kw[key] = kept or (cs[-1],)
    given = {
        "compiled": args.compiled,
        "opt_out": False if args.no_opt_out else None,
        "capture_ab": False if args.no_capture_ab else None,
        "prompts": args.prompts_per_cell,
        "max_tokens": args.max_tokens,
        "waves": args.waves,
        "steps": args.sustained_steps,
    }
    kw.update({k: v for k, v in given.items() if v is not None})
    plan = plans.build(args.plan, **kw)
    if args.only:
        keys = [v.key for v in plan.variants]
        if unknown := sorted(set(args.only) - set(keys)):
            raise ValueError(f"--only {' '.join(unknown)}: not in this plan; its variants are {keys}")
        plan = dataclasses.replace(plan, variants=tuple(v for v in plan.variants if v.key in args.only))
    return plan


def describe(plan: plans.Plan) -> str:
    lines = [
        f"plan {plan.name}: {len(plan.variants)} servers; max({plan.prompts}, {plan.waves} x C) prompts x "
        f"{plan.max_tokens} tokens per throughput cell at concurrency C"
    ]
    for v in plan.variants:
        cells = ", ".join(f"{c.kind} c={c.concurrency}" for c in v.cells)
        when = (
            " (at most: where the table or the best static k is this k)"
            if v.side_static
            else " (only if the light stretch's table allows this k)"
            if v.stretch == plans.CHOOSE_LOADED and v.k
            else ""
        )
        when += f" [side-by-side stretch {v.stretch}]" if v.stretch else ""
        lines.append(f"  {v.key:<24} {cells}{when}")
    if plan.steps or any(v.live for v in plan.variants):  # what live k has room for (settling: ~240 steps)
        concs = sorted({c.concurrency for v in plan.variants for c in v.cells if c.kind == "throughput"})
        lines.append(
            (f"sustained load (--sustained-steps {plan.steps}): " if plan.steps else "")
            + "throughput cells of "
            + ", ".join(f"c={c}: {plan.throughput_requests(c)} requests, ~{plan.steps_at(c)}" for c in concs)
            + f" decode steps at up to C requests (at {plans.SUSTAINED_TAU} tokens per request-step)"
        )
    warm, cold = (sum(plans.estimate_items(plan, w).values()) / 60 for w in (True, False))
    lines.append(
        f"estimated duration on a quiet 2-core box: ~{warm:.0f} min"  # the same without a compiled server
        + (f" with vLLM's compile cache warm (.cache/vllm), ~{cold:.0f} min cold" if warm != cold else "")
    )
    return "\n".join(lines)


def outputs(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """results.json, BENCHMARKS.md and bench.png in ``--out-dir`` (relative to the current folder), else in
    :func:`default_out_dir`."""
    d = Path(args.out_dir) if args.out_dir else default_out_dir(args.plan)
    return d / "results.json", d / "BENCHMARKS.md", d / "bench.png"


def published(data: dict) -> tuple[Path, Path, Path]:
    """Where the repository keeps a run of this results file's plan (:data:`PUBLISHED`); ValueError for the others."""
    name = data["plan"]["name"]
    if name == "default":
        return REPO / DOCS["json"], REPO / DOCS["md"], REPO / DOCS["png"]
    if name == "shipped":
        d = REPO / "bench" / f"shipped-{report_adaptive.host_kind(data['meta']['machine'])[1]}"
        return d / "results.json", d / "BENCHMARKS.md", d / "bench.png"
    raise ValueError(
        f"--publish: the repository keeps no --plan {name} run ({', '.join(PUBLISHED)} only); write it "
        "where you want with --out-dir"
    )


def publish(results: Path) -> None:
    """Copy a results file where the repository keeps its plan's run, write its page and plot there, then the
    repository's BENCHMARKS.md."""
    data = report.load(results)
    json_path, md, png = published(data)
    if json_path.resolve() != results.resolve():
        json_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(results, json_path)
    write_docs(data, md, png)
    if md != REPO / DOCS["md"]:
        repo_page()
    print(f"[bench] published {json_path}")


def repo_page() -> None:
    """The repository's BENCHMARKS.md again from its committed results, the last soak and the adaptive-k runs."""
    md = REPO / DOCS["md"]
    md.write_text(page(report.load_json(REPO / DOCS["json"]), md, DOCS["png"]))
    print(f"[bench] wrote {md}")


def write_docs(data: dict, md: Path, png: Path) -> None:
    """The page, its plot (skipped with one line without matplotlib; then the page does not link it) and the
    advice; an adaptive-k run also draws its tok/s per k (``tok_s.png`` beside the plot)."""
    drawn = report.plot(data, png)
    if drawn and report_adaptive.plot_tok_s(data, png.with_name("tok_s.png")):
        print(f"[bench] tok/s per k plotted in {png.with_name('tok_s.png')}")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(page(data, md, os.path.relpath(png, md.parent) if drawn else None))
    print(report.printed_advice(data))
    print(f"[bench] wrote {md}" + (f" and {png}" if drawn else ""))


def page(data: dict | None, md: Path, png_rel: str | None) -> str:
    """The text of ``md``: the repository's BENCHMARKS.md also shows the last soak and the adaptive-k runs."""
    if md.resolve() != (REPO / DOCS["md"]).resolve():
        return report.render(data, png_rel, soak=report_soak.NO_SOAK)
    return report.render(
        data,
        png_rel,
        soak=report_soak.soak_block(report.load_json(REPO / DOCS["soak"])),
        adaptive_runs=repo_adaptive_runs(),
    )


def repo_adaptive_runs() -> list[dict]:
    """The repository's committed ``--plan adaptive`` results (:data:`ADAPTIVE`) that exist, for its page."""
    return [report.load(REPO / DOCS[k]) for k in ADAPTIVE if (REPO / DOCS[k]).exists()]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    results, md, png = outputs(args)
    if args.advise and not args.from_json:
        parser().error("--advise reads a results file: give --from-json RESULTS")
    if args.advise:
        print(
            advise.config_lines(advise.from_results(report.load(Path(args.from_json))), source=args.from_json), end=""
        )
        return 0
    if args.repo_page:  # from the committed results and soak files; the plot is left as it is
        repo_page()
        return 0
    if args.from_json:
        source = Path(args.from_json)
        if args.publish:
            try:
                published(report.load(source))
            except ValueError as exc:
                parser().error(str(exc))
        if not args.publish or args.out_dir:
            write_docs(report.load(source), md, png)
        if args.publish:
            publish(source)
        return 0
    if args.publish and args.plan not in PUBLISHED:
        parser().error(
            f"--publish: the repository keeps no --plan {args.plan} run ({', '.join(PUBLISHED)} only); "
            "write it where you want with --out-dir"
        )
    try:
        plan = build_plan(args)
    except ValueError as exc:
        parser().error(str(exc))
    print(describe(plan), flush=True)
    return 0 if args.dry_run else execute(plan, args, argv, results, md, png)


def execute(
    plan: plans.Plan, args: argparse.Namespace, argv: list[str] | None, results: Path, md: Path, png: Path
) -> int:
    import yaml

    from vllm_eagle3.resolve import TargetInfo
    from vllm_eagle3.tools.bench import run

    base_cfg = {
        str(k).lstrip("-").replace("_", "-"): v
        for k, v in (yaml.safe_load(run.repo_path(args.config).read_text()) or {}).items()
    }
    num_layers = TargetInfo.load(run.repo_path(str(base_cfg["model"]))).num_layers
    draft = run.repo_path(str((base_cfg.get("speculative-config") or {}).get("model", "models/kimi-k25-mini-eagle3")))
    plan = dataclasses.replace(plan, variants=tuple(run.as_shipped(v, base_cfg) for v in plan.variants))
    args.prompts = args.prompts or plans.PLAN_PROMPTS.get(plan.name, DEFAULT_PROMPTS)
    prompts = run.load_prompts(run.repo_path(args.prompts))
    cells = [c for v in plan.variants for c in v.cells]
    need = max(
        [plan.prompts, plan.stream_prompts]
        + [plan.split_requests(c.concurrency) for c in cells]
        + [max(plan.prompts, plan.waves * c.concurrency) for c in cells if c.kind == "throughput"]
    )  # a sustained cell's further requests send the prompts again (run.cycled)
    if len(prompts) < need:
        raise SystemExit(
            f"vllm-eagle3 bench: {args.prompts} has {len(prompts)} prompts, the plan needs {need}; "
            "lower --prompts-per-cell / --waves or the concurrency, or give a longer prompt file"
        )
    work = Path(tempfile.mkdtemp(prefix="vllm-eagle3-bench-"))
    log_dir = Path(args.log_dir) if args.log_dir else work
    log_dir.mkdir(parents=True, exist_ok=True)
    wirings = run.wirings(draft, run.repo_path(args.capture_spec), plan, work, num_layers)
    load_before = machine.loadavg()
    if load_before != "?" and float(load_before.split()[0]) > 1.0:
        print(f"[bench] warning: load average {load_before}: the machine is busy, timings will be noisy", flush=True)
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[bench {time.monotonic() - t0:6.0f} s] {msg}", flush=True)

    raws, progress = [], plans.Progress(plan)
    # the servers that run alone, one at a time; then each side-by-side stretch, its cells and the adaptive server's
    # table from the stretches before it
    by_stretch = {s: [v for v in plan.variants if v.stretch == s] for s in sorted({v.stretch for v in plan.variants})}
    for group in [[v] for v in by_stretch.pop(0, [])] + list(by_stretch.values()):
        group = [advise.resolve(v, raws) for v in group]
        for v in group:
            if v.adaptive:
                say(f"{v.key}: {v.label}")
            if not v.cells:
                say(
                    f"{v.key}: not run: "
                    + (
                        f"the table measured so far drafts fewer than {v.k} tokens at the highest "
                        "concurrency, and k never rises with the batch"
                        if v.stretch == plans.CHOOSE_LOADED
                        else f"k={v.k} is neither the table's nor the best anywhere"
                    )
                )
        if side := [v for v in group if v.cells]:
            if side[0].stretch:
                say(f"side by side (stretch {side[0].stretch}): {', '.join(v.key for v in side)}")
            raws += run.run_stretch(
                side, plan, base_cfg, wirings, prompts, work, log_dir, say, args.start_timeout, progress
            )
        for v in group:
            progress.drop(v)
    command = "vllm-eagle3 bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    meta = {
        "date": machine.now_utc(),
        "command": command.strip(),
        "duration_min": (time.monotonic() - t0) / 60,
        "load_before": load_before,
        "load_after": machine.loadavg(),
        "machine": machine.machine_info(),
        "serve_config": args.config,
        **machine.attention(base_cfg.get("dtype")),
    }
    run.write_results(results, meta, plan, raws)
    print(f"[bench] raw results: {results}; server logs: {log_dir}")
    write_docs(report.load(results), md, png)
    if args.publish:
        publish(results)
    elif plan.name in PUBLISHED:
        print(
            f"[bench] the repository's copy is unchanged; `vllm-eagle3 bench --from-json {results} --publish` "
            f"writes this run there ({PUBLISHED[plan.name]})"
        )
    return 1 if any(r["error"] for r in raws) else 0
