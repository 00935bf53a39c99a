"""``vllm-eagle3 doctor``: measure which taps an EAGLE-3 draft was trained on, instead of reading engine source.

Data flow position: offline, on CPU, no engine. It runs the TARGET once on sample text (transformers, float32,
``output_hidden_states=True``: tap k = ``hidden_states[k]``, see :mod:`vllm_eagle3.spec`), then for every candidate
wiring feeds the DRAFT ``cat([tap a, tap b, ...])`` exactly as vLLM's proposer does at prefill (position t gets the
taps of position t and the token at t + 1) and scores the draft's top-1 agreement with the target's own greedy next
token. A draft fed the taps it was trained on agrees far more often than one fed any other wiring, so the ranking
names the wiring; the verdict then says what each engine would capture from the draft config as written, and the
exact lines to write for vLLM, SGLang (both conventions) and speculators.

Candidates (each labelled with why it is tried): the draft config's ids read under every convention; the engines'
default taps (:func:`vllm_eagle3.conventions.engine_default_ids`); a capture spec's taps if given; for each of those
its +-1 neighbours (all taps, and one tap at a time), the embedding swapped in (prepended, dropping the last tap,
and replacing the first), and every candidate also in sorted order. Small targets are searched exhaustively.

    vllm-eagle3 doctor --target models/kimi-k25-mini --draft models/kimi-k25-mini-eagle3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from vllm_eagle3.checkpoint import DraftInfo, TargetInfo
from vllm_eagle3.resolve import ids_for_engines
from vllm_eagle3.spec import CaptureSpec, CaptureSpecError, taps_label
from vllm_eagle3.tools.wirings import (EXHAUSTIVE_LIMIT, HeadFn, Score, candidate_wirings, default_text,
                                       encode, load_head, load_target, run_target, score_candidates)

MIN_TOKENS = 32
"""Fewer scored positions than this cannot separate wirings; refuse rather than guess."""

CONFIDENT_MARGIN = 0.05
"""The winner must beat the runner-up's top-1 agreement by at least this much (absolute)..."""

CONFIDENT_SIGMAS = 4.0
"""...and by this many standard errors of the difference of two agreement rates over the scored positions, so a
short text cannot produce a confident verdict by chance."""


# ----------------------------------------------------------------------------------------------- verdict

@dataclasses.dataclass
class Diagnosis:
    scores: list[Score]
    num_layers: int
    positions: int
    engine_reads: dict[str, Any]
    confident: bool
    verdict: str
    config_lines: list[str]
    timings: dict[str, float]

    @property
    def best(self) -> Score:
        return self.scores[0]

    def score_of(self, taps: Sequence[int]) -> Score | None:
        return next((s for s in self.scores if s.candidate.taps == tuple(taps)), None)

    def to_json(self) -> dict:
        return {
            "best": {"taps": list(self.best.candidate.taps), "label": self.best.candidate.label,
                     "accuracy": self.best.accuracy},
            "confident": self.confident, "verdict": self.verdict, "positions": self.positions,
            "num_layers": self.num_layers, "config_lines": self.config_lines, "timings_s": self.timings,
            "engine_reads": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.engine_reads.items()},
            "ranking": [{"taps": list(s.candidate.taps), "label": s.candidate.label, "accuracy": s.accuracy,
                         "mean_logprob": s.mean_logprob, "why": s.candidate.why} for s in self.scores],
        }


def config_lines(taps: Sequence[int], num_layers: int) -> list[str]:
    """The exact lines that make each engine capture ``taps`` (via :func:`vllm_eagle3.resolve.ids_for_engines`)."""
    spec = CaptureSpec(tuple(taps), source="doctor")
    ids = ids_for_engines(spec, num_layers)

    def j(v):
        return json.dumps(list(v)) if isinstance(v, tuple) else None

    lines = []
    vllm = j(ids["vllm"])
    lines.append(f'vLLM (draft config.json, top level): "eagle_aux_hidden_state_layer_ids": {vllm}, '
                 f'"num_aux_hidden_states": {spec.num_taps}')
    if spec.has_embed:
        lines.append("  (tap embed on DeepSeek/Kimi needs the vllm-eagle3 plugin: stock vLLM 0.32 crashes on id 0)")
    for conv, name in (("sglang", "SGLang >= 0.5.14"), ("sglang-legacy", "SGLang < 0.5.14 (+ embed patch for -1)")):
        if j(ids[conv]):
            lines.append(f'{name} (draft config.json): "eagle_config": {{"eagle_aux_hidden_state_layer_ids": '
                         f'{j(ids[conv])}, "use_aux_hidden_state": true}}')
        else:
            lines.append(f"{name}: {ids[conv]}")
    lines.append(f'speculators (config.json): "eagle_aux_hidden_state_layer_ids": {j(ids["speculators"])}'
                 if j(ids["speculators"]) else f"speculators: {ids['speculators']}")
    lines.append(f"SpecForge: {j(ids['specforge']) or ids['specforge']}")
    lines.append(f"vllm-eagle3 capture spec (YAML): taps: {spec.label()}   num_layers: {num_layers}")
    if list(taps) != sorted(taps):
        lines.append(f"  NOTE: the draft expects the order {spec.label()}; vLLM and SGLang concatenate ascending, "
                     "only the vllm-eagle3 capture spec keeps this order")
    return lines


def clearly_below(accuracy: float, best: float, positions: int) -> bool:
    """``accuracy`` is below ``best`` by the confidence margin and by CONFIDENT_SIGMAS standard errors."""
    se = math.sqrt(max(best * (1 - best) + accuracy * (1 - accuracy), 1e-12) / max(positions, 1))
    return best - accuracy >= max(CONFIDENT_MARGIN, CONFIDENT_SIGMAS * se)


def make_verdict(scores: list[Score], reads: Mapping[str, Any], positions: int) -> tuple[bool, str]:
    """(confident, text): the winner, then each engine's reading of the config marked ok / WRONG."""
    best = scores[0]
    runner = scores[1] if len(scores) > 1 else None
    ra = runner.accuracy if runner else 0.0
    pb = best.accuracy
    confident = clearly_below(ra, pb, positions)
    lines = []
    if confident:
        lines.append(f"VERDICT: the draft was trained on taps {best.candidate.label} (top-1 agreement "
                     f"{best.accuracy:.3f}; runner-up {runner.candidate.label if runner else '-'} {ra:.3f}).")
    else:
        lines.append(f"VERDICT: inconclusive: best {best.candidate.label} agrees {best.accuracy:.3f} vs "
                     f"{ra:.3f} for {runner.candidate.label if runner else '-'}; the draft may be untrained or for "
                     "another target, or the text too short (--text, --max-tokens).")
    by_taps = {s.candidate.taps: s for s in scores}
    for engine, taps in reads.items():
        if isinstance(taps, str):
            lines.append(f"  {engine}: {taps}")
            continue
        fed = tuple(sorted(taps))  # every engine concatenates in ascending tap order
        s = by_taps.get(fed)
        got = f"{s.accuracy:.3f}" if s else "not scored"
        shown = f"{engine} captures {taps_label(taps)} (agreement {got})"
        # Each reading is judged against the best on its own: a reading far below the best is wrong even when the
        # best cannot be told apart from its +-1 neighbours (adjacent layers carry similar states).
        if not confident and (s is None or not clearly_below(s.accuracy, pb, positions)):
            lines.append(f"  ?      {shown}")
        elif fed == best.candidate.taps:
            lines.append(f"  ok     {shown}")
        elif fed == tuple(sorted(best.candidate.taps)):
            lines.append(f"  WRONG  {shown}: the right taps in the wrong order (the engine sorts them; the draft "
                         f"wants {best.candidate.label}): serve with a vllm-eagle3 capture spec")
        else:
            lines.append(f"  WRONG  {shown}: not the trained {best.candidate.label}: the incident's failure "
                         "(served acceptance near zero, no error)")
    return confident, "\n".join(lines)


def diagnose(target: str | Path, draft: str | Path, text: str | None = None, max_tokens: int = 384,
             head: HeadFn | None = None, extra: Mapping[str, Sequence[int]] | None = None,
             exhaustive: bool | None = None, progress: bool = True) -> Diagnosis:
    """Run the whole measurement; raises :class:`CaptureSpecError` with the fix on bad input."""
    from vllm_eagle3.tools.inspect import engine_reads

    t0 = time.perf_counter()
    target, draft = Path(target), Path(draft)
    info = TargetInfo.load(target)
    d = DraftInfo.load(draft)
    fc_in = d.fc_in_features
    if fc_in is None:
        raise CaptureSpecError(f"draft {draft} has no fc.weight in its safetensors; is it an EAGLE-3 head?")
    if fc_in % info.hidden_size:
        raise CaptureSpecError(f"the draft's fc takes {fc_in} inputs, not a multiple of the target hidden size "
                               f"{info.hidden_size}: this draft is not for this target")
    n = fc_in // info.hidden_size
    token_ids, how = encode(target, text if text is not None else default_text(), max_tokens)
    if len(token_ids) < MIN_TOKENS:
        raise CaptureSpecError(f"only {len(token_ids)} tokens of text ({how}); give at least {MIN_TOKENS} "
                               "(--text FILE with more text)")
    bad = [i for i in token_ids if not 0 <= i < info.vocab_size]
    if bad:
        raise CaptureSpecError(f"token id {bad[0]} ({how}) is outside the target vocabulary of {info.vocab_size}")
    model = load_target(target)
    t1 = time.perf_counter()
    run = run_target(model, token_ids)
    del model
    t2 = time.perf_counter()
    if head is None:
        head = load_head(draft, d, n, run)
    cands = candidate_wirings(d, info.num_layers, n, extra, exhaustive)
    scores = score_candidates(head, run, cands, progress=progress)
    t3 = time.perf_counter()
    reads = engine_reads(info, d)
    confident, verdict = make_verdict(scores, reads, len(token_ids) - 1)
    return Diagnosis(scores, info.num_layers, len(token_ids) - 1, reads, confident, verdict,
                     config_lines(scores[0].candidate.taps, info.num_layers),
                     {"load": round(t1 - t0, 2), "target_forward": round(t2 - t1, 2), "scoring": round(t3 - t2, 2),
                      "total": round(t3 - t0, 2)})


def render(dx: Diagnosis, top: int = 15) -> str:
    lines = [f"{len(dx.scores)} wirings scored on {dx.positions} positions of a {dx.num_layers}-layer target "
             f"(top-1 agreement of the draft with the target's greedy next token):",
             f"{'rank':>4}  {'taps':<22} {'agree':>6} {'logp':>8}  why"]
    for i, s in enumerate(dx.scores[:top], 1):
        lines.append(f"{i:>4}  {s.candidate.label:<22} {s.accuracy:>6.3f} {s.mean_logprob:>8.2f}  {s.candidate.why}")
    if len(dx.scores) > top:
        lines.append(f"   ... {len(dx.scores) - top} more (--top N, --json FILE)")
    lines.append(dx.verdict)
    lines.append("config lines for " + ("the measured" if dx.confident else "the best-scoring (unconfirmed)")
                 + f" wiring {dx.best.candidate.label}:")
    lines += [f"  {l}" for l in dx.config_lines]
    lines.append(f"time: {dx.timings}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 doctor",
        description="Measure which taps an EAGLE-3 draft was trained on: run the target on sample text (CPU, "
                    "float32, transformers), feed the draft each candidate wiring, rank them by the draft's top-1 "
                    "agreement with the target's greedy next token, and print a verdict and the config lines for "
                    "vLLM, SGLang and speculators. Exit status 0: confident verdict; 3: inconclusive; 1: error.")
    p.add_argument("--target", required=True, help="target model folder (Kimi K2.5: its language model is used)")
    p.add_argument("--draft", required=True, help="EAGLE-3 draft folder (config.json + safetensors)")
    p.add_argument("--text", default=None, help="sample text file (default: standard-library Python sources)")
    p.add_argument("--max-tokens", type=int, default=384, help="tokens of text to run (default 384)")
    p.add_argument("--engine", choices=("hf",), default="hf", help="how to run the target (transformers)")
    p.add_argument("--exhaustive", action="store_true", default=None,
                   help=f"score every tap set (default: only when there are at most {EXHAUSTIVE_LIMIT})")
    p.add_argument("--top", type=int, default=15, help="rows of the ranking to print")
    p.add_argument("--json", default=None, help="also write the full result as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.max_tokens < MIN_TOKENS + 1:
            raise CaptureSpecError(f"--max-tokens must be at least {MIN_TOKENS + 1}")
        text = None
        if args.text is not None:
            path = Path(args.text)
            if not path.is_file():
                raise CaptureSpecError(f"--text {path} does not exist")
            text = path.read_text(errors="replace")
        dx = diagnose(args.target, args.draft, text=text, max_tokens=args.max_tokens,
                      exhaustive=args.exhaustive, progress=not args.no_progress)
    except CaptureSpecError as exc:
        print(f"vllm-eagle3 doctor: error: {exc}", file=sys.stderr)
        return 1
    print(render(dx, args.top))
    if args.json:
        from vllm_eagle3.tools.convert import write_json_atomic

        write_json_atomic(Path(args.json), dx.to_json())
    return 0 if dx.confident else 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
