"""Candidate wirings of an EAGLE-3 draft and how well each one works: the measurement behind ``vllm-eagle3 doctor``.

Data flow position: offline, on CPU, no engine. :func:`run_target` runs the target once on sample text
(transformers, float32, ``output_hidden_states=True``: tap k = ``hidden_states[k]``); :func:`candidate_wirings`
lists the tap sets worth trying (the draft config's ids under every convention, engine defaults, neighbours, the
embedding swapped in); :func:`score_candidates` feeds the draft ``cat([tap a, tap b, ...])`` for each, exactly as
vLLM's proposer does at prefill, and scores top-1 agreement with the target's own greedy token. ``doctor.py`` turns
the scores into a verdict.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from vllm_eagle3.checkpoint import DraftInfo, read_json
from vllm_eagle3.conventions import CONVENTIONS, engine_default_ids, ids_to_taps
from vllm_eagle3.spec import EMBED, CaptureSpecError, taps_label

EXHAUSTIVE_LIMIT = 400
"""Search every ordered-ascending tap set when there are at most this many (tiny targets)."""

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
