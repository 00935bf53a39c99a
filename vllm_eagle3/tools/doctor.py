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
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from vllm_eagle3.conventions import CONVENTIONS, engine_default_ids, ids_to_taps
from vllm_eagle3.checkpoint import DraftInfo, TargetInfo, read_json
from vllm_eagle3.resolve import ids_for_engines
from vllm_eagle3.spec import EMBED, CaptureSpec, CaptureSpecError, taps_label

MIN_TOKENS = 32
"""Fewer scored positions than this cannot separate wirings; refuse rather than guess."""

EXHAUSTIVE_LIMIT = 400
"""Search every ordered-ascending tap set when there are at most this many (tiny targets)."""

CONFIDENT_MARGIN = 0.05
"""The winner must beat the runner-up's top-1 agreement by at least this much (absolute)..."""

CONFIDENT_SIGMAS = 4.0
"""...and by this many standard errors of the difference of two agreement rates over the scored positions, so a
short text cannot produce a confident verdict by chance."""

HeadFn = Callable[[Any, Any, Any], Any]
"""``head(input_ids [B, T], aux [B, T, n * H], positions [T]) -> logits over the TARGET vocabulary [B, T, V]``."""


# ----------------------------------------------------------------------------------------------- candidates

@dataclasses.dataclass(frozen=True)
class Candidate:
    taps: tuple[int, ...]
    why: str

    @property
    def label(self) -> str:
        return taps_label(self.taps)


def _valid(taps: Sequence[int], num_layers: int, n: int) -> bool:
    return len(taps) == n and len(set(taps)) == n and all(0 <= t <= num_layers for t in taps)


def candidate_wirings(draft: DraftInfo, num_layers: int, num_taps: int,
                      extra: Mapping[str, Sequence[int]] | None = None,
                      exhaustive: bool | None = None) -> list[Candidate]:
    """Every wiring worth scoring, deduplicated (order matters: the draft's fc is order-sensitive)."""
    L, n = num_layers, num_taps
    bases: list[Candidate] = []
    lists = {}
    if draft.top_ids is not None:
        lists["top-level ids"] = draft.top_ids
    if draft.nested_ids is not None and draft.nested_ids != draft.top_ids:
        lists["eagle_config ids"] = draft.nested_ids
    for where, ids in lists.items():
        for conv in CONVENTIONS:
            try:
                bases.append(Candidate(ids_to_taps(ids, conv, L), f"{where} {list(ids)} read as {conv}"))
            except CaptureSpecError:
                pass
    default = tuple(engine_default_ids(L))
    bases.append(Candidate(default, f"engine default {list(default)}"))
    for name, taps in (extra or {}).items():
        bases.append(Candidate(tuple(taps), name))

    out: dict[tuple[int, ...], Candidate] = {}

    def add(taps: Iterable[int], why: str) -> None:
        taps = tuple(taps)
        if _valid(taps, L, n) and taps not in out:
            out[taps] = Candidate(taps, why)

    bases = [b for b in bases if _valid(b.taps, L, n)]
    for b in bases:
        add(b.taps, b.why)
    for b in bases:
        t = b.taps
        variants = [(tuple(x + d for x in t), f"all taps {d:+d} of {b.label}") for d in (-1, 1)]
        for i in range(len(t)):
            for d in (-1, 1):
                variants.append((t[:i] + (t[i] + d,) + t[i + 1:], f"tap {i + 1} {d:+d} of {b.label}"))
        if EMBED not in t:
            variants.append(((EMBED,) + t[:-1], f"embed prepended to {b.label}, last tap dropped"))
            variants.append(((EMBED,) + t[1:], f"embed in place of the first tap of {b.label}"))
        else:
            rest = tuple(x for x in t if x != EMBED)
            nxt = max(t) + (max(t) - min(rest) if rest else 1)
            variants.append((rest + (nxt,), f"{b.label} without embed, one tap appended"))
        for taps, why in variants:
            add(taps, why)
    if exhaustive is None:
        exhaustive = math.comb(L + 1, n) <= EXHAUSTIVE_LIMIT
    if exhaustive:
        for taps in combinations(range(L + 1), n):
            add(taps, "exhaustive search")
    for c in list(out.values()):
        add(sorted(c.taps), f"sorted order of {c.label}")
    return list(out.values())


# ----------------------------------------------------------------------------------------------- target side

def default_text() -> str:
    """Real text when none is given: a few standard-library Python sources (on every machine)."""
    import argparse as a
    import textwrap as tw

    return "\n".join(Path(m.__file__).read_text() for m in (tw, a))


def encode(target_dir: Path, text: str, max_tokens: int) -> tuple[list[int], str]:
    """Token ids of ``text`` with the target's tokenizer (its folder). A target without a loadable tokenizer is an
    error: any other token stream (e.g. raw bytes) would score wirings on text the target never reads."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(target_dir))
    except Exception as exc:  # noqa: BLE001 - transformers raises many types here; all mean "no usable tokenizer"
        raise CaptureSpecError(
            f"cannot load the tokenizer of {target_dir} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
            "the doctor scores wirings on the target's own tokens: put tokenizer.json / tokenizer_config.json in "
            "the target folder"
        ) from None
    ids = tok(text, add_special_tokens=False)["input_ids"][:max_tokens]
    return list(ids), f"tokenizer of {target_dir}"


def load_target(target_dir: Path):
    """The target's text model as a transformers causal LM (float32, eval). Kimi K2.5: its language model."""
    import torch

    cfg = read_json(target_dir / "config.json", "target config")
    if "text_config" in cfg:
        from vllm_eagle3.miniature.export import load_text_model

        try:
            return load_text_model(target_dir, dtype=torch.float32)
        except (KeyError, FileNotFoundError, RuntimeError) as exc:
            raise CaptureSpecError(f"cannot load the language model of {target_dir}: {exc}") from None
    from transformers import AutoModelForCausalLM

    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32,
                                                           output_loading_info=True)
    except (OSError, ValueError, KeyError) as exc:
        raise CaptureSpecError(f"transformers cannot load the target {target_dir}: {exc}") from None
    missing = info.get("missing_keys") or []
    if missing:
        raise CaptureSpecError(f"target {target_dir} lacks weights {sorted(missing)[:4]}...; its scores would be "
                               "meaningless (random weights)")
    return model.eval()


@dataclasses.dataclass
class TargetRun:
    """One target forward: every tap and the target's greedy next token at every position."""

    input_ids: Any  # [T] long
    taps: Any  # [L + 1, T, H]: taps[k] = hidden state entering layer k
    greedy: Any  # [T] long: argmax of the target's logits at position t (its choice for token t + 1)
    embed_weight: Any  # [V, H]: the target's input embedding (shared with a draft that has none)


def run_target(model, token_ids: Sequence[int]) -> TargetRun:
    import torch

    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    captured: dict[str, Any] = {}
    norm = getattr(model.get_decoder(), "norm", None)  # tap L is the input of the final norm
    handle = None if norm is None else norm.register_forward_pre_hook(
        lambda mod, args: captured.__setitem__("pre_norm", args[0]))
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
    finally:
        if handle is not None:
            handle.remove()
    hs = list(out.hidden_states)
    # tap L is the final PRE-norm state; transformers' last hidden_states entry may be post-norm.
    hs[-1] = captured.get("pre_norm", hs[-1])
    taps = torch.stack([h[0] for h in hs]).float()
    return TargetRun(ids[0], taps, out.logits[0].argmax(-1), model.get_input_embeddings().weight.detach().float())


# ----------------------------------------------------------------------------------------------- draft side

def load_head(draft_dir: Path, draft: DraftInfo, num_taps: int, run: TargetRun) -> HeadFn:
    """The draft head as a callable: :class:`vllm_eagle3.miniature.draft.Eagle3Draft`, the plain-PyTorch copy of
    vLLM's ``llama_eagle3`` forward. Its fan-in comes from ``fc.weight`` (not from the config, which is what is
    being diagnosed); the embedding is the target's unless the draft ships its own (as vLLM does)."""
    import torch
    from safetensors.torch import load_file

    from vllm_eagle3.miniature.draft import DraftConfig, Eagle3Draft

    cfg = dict(draft.config)
    cfg["num_aux_hidden_states"] = num_taps
    try:
        model = Eagle3Draft(DraftConfig.from_hf_config(cfg))
    except (KeyError, ValueError, TypeError) as exc:
        raise CaptureSpecError(f"draft config {draft_dir}/config.json cannot describe a Llama EAGLE-3 head: "
                               f"{type(exc).__name__}: {exc}") from None
    state: dict[str, Any] = {}
    for f in sorted(Path(draft_dir).glob("*.safetensors")):
        state.update(load_file(str(f)))
    state = {k.removeprefix("model."): v for k, v in state.items()}
    state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
    if "d2t" not in state and model.config.draft_vocab_size != model.config.vocab_size:
        raise CaptureSpecError(f"draft {draft_dir} predicts {model.config.draft_vocab_size} of "
                               f"{model.config.vocab_size} tokens but has no d2t: its token ids cannot be mapped")
    expected = set(model.state_dict()) - {"embed_tokens.weight", "t2d", "d2t"}
    missing = sorted(expected - set(state))
    if missing:
        raise CaptureSpecError(f"draft {draft_dir} lacks weights {missing[:4]}; is it a Llama-style EAGLE-3 head "
                               "(fc, midlayer.*, norm, lm_head)?")
    own_embed = "embed_tokens.weight" in state
    try:
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()
                               if k in model.state_dict()}, strict=False)
    except RuntimeError as exc:
        raise CaptureSpecError(f"draft {draft_dir} weights do not fit its config: {str(exc).splitlines()[-1]}") from None
    if not own_embed:
        if tuple(run.embed_weight.shape) != tuple(model.embed_tokens.weight.shape):
            raise CaptureSpecError(f"the target's embedding {tuple(run.embed_weight.shape)} does not fit the draft "
                                   f"({tuple(model.embed_tokens.weight.shape)}): is this draft for this target?")
        model.embed_tokens.weight.data.copy_(run.embed_weight)
    model = model.float().eval()

    def head(input_ids, aux, positions):
        b = input_ids.shape[0]
        return model(aux, input_ids=input_ids, positions=positions.expand(b, -1))

    return head


@dataclasses.dataclass(frozen=True)
class Score:
    candidate: Candidate
    accuracy: float  # draft top-1 == target greedy next token
    mean_logprob: float  # draft log-probability of the target's token (tie-breaker)


def score_candidates(head: HeadFn, run: TargetRun, candidates: Sequence[Candidate], batch: int = 16,
                     progress: bool = True) -> list[Score]:
    """Score each wiring as vLLM's proposer would see it at prefill, ranked best first."""
    import torch

    from tqdm import tqdm

    T = run.input_ids.shape[0]
    inputs = run.input_ids[1:].unsqueeze(0)  # [1, T-1]: the token after each position
    want = run.greedy[1:]  # [T-1]: the target's choice for the token after that
    positions = torch.arange(T - 1)
    scores: list[Score] = []
    bar = tqdm(total=len(candidates), desc="scoring wirings", unit="wiring", disable=not progress, file=sys.stderr)
    with torch.no_grad():
        for i in range(0, len(candidates), batch):
            chunk = candidates[i:i + batch]
            aux = torch.stack([torch.cat([run.taps[k, :-1] for k in c.taps], -1) for c in chunk])  # [B, T-1, n*H]
            logits = head(inputs.expand(len(chunk), -1), aux, positions).float()  # [B, T-1, V]
            logp = torch.log_softmax(logits, -1)
            top1 = logits.argmax(-1)  # [B, T-1]
            acc = (top1 == want).float().mean(-1)
            lp = logp.gather(-1, want.view(1, -1, 1).expand(len(chunk), -1, 1)).squeeze(-1)
            lp = lp.clamp(min=-1e4).mean(-1)
            for c, a, m in zip(chunk, acc.tolist(), lp.tolist()):
                scores.append(Score(c, a, m))
            bar.update(len(chunk))
    bar.close()
    return sorted(scores, key=lambda s: (-s.accuracy, -s.mean_logprob))


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
