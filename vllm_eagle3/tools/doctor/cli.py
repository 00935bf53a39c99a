"""``vllm-eagle3 doctor``'s command line and report: the verdict lines, the config lines to adopt, ``--help``,
exit codes (the measurement is ``diagnose.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_eagle3 import verdicts
from vllm_eagle3.spec import CaptureSpecError, taps_label
from vllm_eagle3.wirings import EXHAUSTIVE_LIMIT, config_lines
from vllm_eagle3.tools.doctor.stats import EXIT_CODES, MIN_SEQUENCES, Reading, exit_code, needed_tokens
from vllm_eagle3.verdicts import COLLAPSE_RATIO, TOLERANCE

from vllm_eagle3.tools.doctor.diagnose import MAX_TOKENS, WINDOW, CHAINED, DEFAULT_K, Diagnosis, diagnose


# ----------------------------------------------------------------------------------------------- output


def verdict_line(name: str, v: Reading, k: int, tokens: int) -> str:
    c, b = v.configured, v.best
    al = f"acceptance length (k={k}) {c.acceptance_length:.3f} vs {b.acceptance_length:.3f} for the best {b.label}"
    p0 = (
        f"position-0 acceptance {c.p0:.3f} vs {b.p0:.3f} ({-v.p0_diff.estimate * 100:+.1f} points "
        f"[{-v.p0_diff.high * 100:+.1f}, {-v.p0_diff.low * 100:+.1f}])"
    )
    loss = f"loses {v.loss.fmt(100, 1, '%')} of it"
    head = f"{verdicts.heading(v.kind)}  {name}: {c.label}"
    if v.kind == verdicts.OK:
        how = (
            "it is the best"
            if b.taps == c.taps
            else f"indistinguishable from the best or within the {TOLERANCE:.0%} tolerance"
        )
        return f"{head}: {how}: {al}, {loss}; {p0}"
    if v.kind == verdicts.COSTS:
        return (
            f"{verdicts.heading(v.kind, v.loss.estimate)}  {name}: {c.label}: {al}, {loss} (more than the "
            f"{TOLERANCE:.0%} tolerance, significantly); {p0}"
        )
    if v.kind == verdicts.WRONG:
        return (
            f"{head}: acceptance collapses: {al}; it keeps {v.gain_ratio.fmt(100, 1, '%')} of the best's "
            f"speculative gain; {p0}: the draft was not trained on these taps"
        )
    if v.kind == verdicts.NO_WIRING_WORKS:
        return (
            f"{head}: even the best wiring {b.label} accepts {v.best_gain.estimate:.3f} drafts per target "
            f"forward [{v.best_gain.low:.3f}, {v.best_gain.high:.3f}]: the draft is untrained, or for another "
            "target or tokenizer; no wiring will fix it"
        )
    need = needed_tokens(tokens, v.more_text)
    if v.kind == verdicts.PENDING:
        return (
            f"{head}: {v.sequences} sequences, fewer than the {MIN_SEQUENCES} the statistics need; about "
            f"{v.more_text:.1f}x more text would judge it (--max-tokens {need})"
        )
    return (
        f"{head}: {al}, {loss} (tolerance {TOLERANCE:.0%}): the interval straddles the tolerance; about "
        f"{v.more_text:.1f}x more text would decide it (--max-tokens {need})"
    )


def render(dx: Diagnosis, top: int = 10) -> str:
    lines = [
        f"wirings scored on {dx.anchors} anchors of {dx.how} ({dx.tokens} tokens, {dx.num_layers}-layer "
        f"target); chains drafted as vLLM's proposer, accepted while equal to the target's greedy token; "
        f"k = {dx.k}",
        f"target run: {dx.engine_detail or dx.engine}"
        + (f"; not capturable by the engine, not scored: {', '.join(dx.not_captured)}" if dx.not_captured else ""),
        f"{'taps':<22} {'AL(k=' + str(dx.k) + ')':>8} {'pos-0':>6} {'walk':>6}  why",
    ]
    for c in dx.chains:
        lines.append(f"{c.label:<22} {c.acceptance_length:>8.3f} {c.p0:>6.3f} {c.served_walk_length:>6.3f}  {c.why}")
    rest = [(c, p) for c, p in dx.screened if c.taps not in {x.taps for x in dx.chains}]
    if rest:
        shown = ", ".join(f"{c.label} {p:.3f}" for c, p in rest[:top])
        more = f" (+{len(rest) - top} more, --json FILE)" if len(rest) > top else ""
        lines.append(f"screened on position-0 acceptance only: {shown}{more}")
    lines.append(f"configured wiring from {dx.configured_from}:")
    for name, v in dx.verdicts.items():
        lines.append(verdict_line(name, v, dx.k, dx.tokens))
        if v.kind == verdicts.OK and v.equivalent:
            lines.append(f"  indistinguishable from it within the tolerance: {', '.join(v.equivalent[:6])}")
    for taps in dict.fromkeys(dx.adopt.values()):
        lines.append(f"adopt {taps_label(taps)} (significantly better than the configured wiring):")
        lines += [f"  {line}" for line in config_lines(taps, dx.num_layers)]
    lines.append(f"time: {dx.timings}")
    return "\n".join(lines)


DOCTOR_MEANING = {
    verdicts.OK: f"the configured wiring's acceptance length is within {TOLERANCE:.0%} of the best wiring's at the "
    "upper end of its 95% interval (indistinguishable from the best, or within the tolerance)",
    verdicts.COSTS: f"significantly worse than the best by more than {TOLERANCE:.0%}: x = the acceptance length lost; "
    "the config lines of the better wiring are printed",
    verdicts.WRONG: f"acceptance collapses: under {COLLAPSE_RATIO:.0%} of the best wiring's speculative gain (e.g. "
    "taps [3, 31, 59] for a head trained on [embed, 3, 31])",
    verdicts.UNDECIDED: "the interval straddles the tolerance: the line says how much more text decides it",
    verdicts.PENDING: f"fewer than {MIN_SEQUENCES} sequences of text: the line says how much more text judges it",
    verdicts.NO_WIRING_WORKS: "no wiring makes the draft accept drafts: untrained, or for another target",
}
"""What each verdict means for the doctor's statistic (the shared meaning is vllm_eagle3.verdicts)."""


def verdicts_help() -> str:
    """The ``--help`` epilog's verdict table, in the order of the shared vocabulary."""
    import textwrap

    rows = [
        textwrap.fill(
            f"  {verdicts.heading(w.word) + (' x%' if w.word == verdicts.COSTS else ''):<16} {EXIT_CODES[w.word]}  "
            f"{DOCTOR_MEANING[w.word]}",
            116,
            subsequent_indent=" " * 22,
        )
        for w in verdicts.VOCABULARY
        if w.word in EXIT_CODES
    ]
    return "\n".join(rows)


VERDICTS_HELP = f"""\
verdicts (for each configured wiring; exit status of the worst one; the words of the wiring watch and the online
check too):
{verdicts_help()}
  1: bad input (one line naming the fix); 2: usage error.
Statistics: every wiring is scored on the same anchors; 95% intervals from a paired bootstrap over whole
sequences (adjacent positions are correlated). Acceptance length (k) = 1 + mean leading accepted drafts of at most
k per anchor; 'walk' = the model card's served walk (what vLLM's /metrics counters measure)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 doctor",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=VERDICTS_HELP,
        description="How much acceptance does the wiring you serve lose against the best one? Runs the target on "
        "text it did not train on (CPU, float32, transformers; --engine vllm: the served engine), "
        "drafts chains with the EAGLE-3 head fed each candidate wiring exactly as vLLM's proposer does, "
        "and compares the configured wiring with the best by acceptance length and position-0 "
        "acceptance, with paired 95% intervals.",
    )
    p.add_argument("--target", required=True, help="target model folder (Kimi K2.5: its language model is used)")
    p.add_argument("--draft", required=True, help="EAGLE-3 draft folder (config.json + safetensors)")
    p.add_argument("--capture-spec", default=None, help="the capture spec you serve (default: $EAGLE3_SPEC)")
    p.add_argument(
        "--taps",
        action="append",
        default=None,
        help="a wiring to judge, e.g. embed,3,31 (repeatable; judged beside --capture-spec)",
    )
    p.add_argument(
        "--convention",
        default=None,
        help="the draft config's ids are read in this convention (default: $EAGLE3_CONVENTION); "
        "with none of --capture-spec/--taps/--convention every engine's reading is judged",
    )
    p.add_argument("-k", type=int, default=DEFAULT_K, help=f"num_speculative_tokens served (default {DEFAULT_K})")
    p.add_argument(
        "--text",
        default=None,
        help="text file (default: the held-out standard-library files the miniature never trained on)",
    )
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=f"tokens of text (default {MAX_TOKENS})")
    p.add_argument(
        "--mode",
        choices=("text", "greedy"),
        default="text",
        help="text: chains on the text itself (default); greedy: prompts from it continued greedily by "
        "the target (what a greedy server verifies; one KV-cached decode, ~1.3x the CPU time)",
    )
    p.add_argument(
        "--window", type=int, default=WINDOW, help=f"tokens per sequence, the statistics' block (default {WINDOW})"
    )
    p.add_argument(
        "--chained",
        type=int,
        default=CHAINED,
        help=f"best screened wirings that get full chains besides the configured ones (default {CHAINED})",
    )
    p.add_argument(
        "--engine",
        choices=("hf", "vllm"),
        default="hf",
        help="how to run the target: hf = transformers (default); vllm = the served engine: one offline "
        "vLLM start with this plugin capturing every tap the candidates need (tap L excepted), the "
        "engine's own taps and logits; the draft chains are the same PyTorch copy of vLLM's draft",
    )
    p.add_argument(
        "--exhaustive",
        action="store_true",
        default=None,
        help=f"screen every tap set (default: only when there are at most {EXHAUSTIVE_LIMIT})",
    )
    p.add_argument("--top", type=int, default=10, help="screened-only wirings to list")
    p.add_argument("--json", default=None, help="also write the full result as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.window < 16:
            raise CaptureSpecError("--window must be at least 16 tokens")
        if args.max_tokens < 2 * args.window:
            raise CaptureSpecError(f"--max-tokens must be at least twice --window ({2 * args.window})")
        text = None
        if args.text is not None:
            path = Path(args.text)
            if not path.is_file():
                raise CaptureSpecError(f"--text {path} does not exist")
            text = path.read_text(errors="replace")
        dx = diagnose(
            args.target,
            args.draft,
            text=text,
            max_tokens=args.max_tokens,
            capture_spec=args.capture_spec,
            taps=args.taps,
            convention=args.convention,
            k=args.k,
            mode=args.mode,
            window=args.window,
            chained=args.chained,
            exhaustive=args.exhaustive,
            progress=not args.no_progress,
            engine=args.engine,
        )
    except CaptureSpecError as exc:
        print(f"vllm-eagle3 doctor: error: {exc}", file=sys.stderr)
        return 1
    print(render(dx, args.top))
    if args.json:
        from vllm_eagle3.tools.convert import write_json_atomic

        write_json_atomic(Path(args.json), dx.to_json())
    return exit_code(dx.kind)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
