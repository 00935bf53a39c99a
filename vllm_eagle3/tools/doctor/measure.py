"""How well each candidate wiring of an EAGLE-3 draft works: the measurement behind ``vllm-eagle3 doctor``.

Data flow position: offline, on CPU, no engine. :func:`sample_and_run` picks the positions to score (held-out
text itself, or prompts from it continued greedily by the target, which is what a greedy server verifies) and runs
the target ONCE on them (transformers, float32, ``output_hidden_states=True``: tap k = ``hidden_states[k]``;
:func:`run_target`, or :func:`greedy_run` recording while it decodes); :func:`vllm_eagle3.wirings.candidate_wirings`
lists the tap sets worth trying (the draft config's ids under every convention, engine defaults, neighbours, the
embedding swapped in);
:func:`first_draft_acceptance` screens every candidate on its first draft, and :func:`chain_matches` drafts chains
of ``MAX_K`` tokens for the ones that matter exactly as vLLM's proposer does
(``vllm_eagle3.reference.acceptance.chain_eval`` replaying the one target run).
:mod:`vllm_eagle3.tools.doctor.stats` turns the matches into a verdict; ``doctor.py`` prints it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Sequence

from vllm_eagle3.checkpoint import DraftInfo, read_json
from vllm_eagle3.spec import CaptureSpecError
from vllm_eagle3.wirings import Candidate


# ----------------------------------------------------------------------------------------------- text side


def default_text(max_chars: int = 400_000) -> tuple[str, str]:
    """(text, description): the held-out files of this interpreter's standard library, i.e. Python the bundled
    miniature target never trained on (its trainer held out files by a hash of their path under the source root,
    :func:`vllm_eagle3.miniature.data.is_heldout`, 2 %; the standard library was one of its roots). Present on
    every machine; for other targets it is simply real code."""
    import sysconfig

    from vllm_eagle3.miniature.data import read_texts, source_files, split_files

    root = Path(sysconfig.get_paths()["stdlib"])
    _, held = split_files(source_files([root]))  # the trainers' default fraction
    # Packages installed inside the stdlib folder were a root of their own in training (other relative paths).
    held = [f for f in held if f.rel.split("/")[0] not in ("site-packages", "dist-packages")]
    texts = read_texts(held, max_chars)
    return "\n".join(texts), f"held-out standard-library files ({len(texts)} files under {root})"


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


@dataclasses.dataclass(frozen=True)
class Sample:
    """The positions every wiring is scored on (all wirings on the same ones: the comparison is paired)."""

    seqs: Any  # [N, T] long: independent sequences (the statistics' blocks)
    first_anchor: int  # chains are drafted at anchors first_anchor .. T - 1 - MAX_K of every sequence
    how: str

    @property
    def anchors(self) -> int:
        from vllm_eagle3.reference.acceptance import MAX_K

        return self.seqs.shape[0] * (self.seqs.shape[1] - MAX_K - self.first_anchor)


def sample_and_run(
    model, token_ids: Sequence[int], mode: str, window: int, prompt_len: int, how: str
) -> tuple[Sample, "TargetRun"]:
    """The positions to score and the target run on them. ``mode`` "text": windows of ``window`` tokens of the text
    itself, chains at every position, one forward over them (:func:`run_target`). ``mode`` "greedy": prompts of
    ``prompt_len`` tokens cut from the text (one per window: the same token budget), each continued by the
    target's own greedy tokens to ``window`` tokens (a greedy server verifies the target's greedy output; chains
    start at the last prompt token, where a server drafts after prefill), recorded as it decodes
    (:func:`greedy_run`)."""
    import torch

    n = len(token_ids) // window
    windows = torch.tensor(list(token_ids[: n * window]), dtype=torch.long).view(n, window)
    if mode == "text":
        return Sample(windows, 0, f"{n} windows of {window} tokens of {how}"), run_target(model, windows)
    run = greedy_run(model, windows[:, :prompt_len], window - prompt_len)
    return Sample(
        run.input_ids,
        prompt_len - 1,
        f"{n} prompts of {prompt_len} tokens from {how}, each continued by "
        f"{window - prompt_len} greedy tokens of the target",
    ), run


# ----------------------------------------------------------------------------------------------- target side


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
        model, info = AutoModelForCausalLM.from_pretrained(
            str(target_dir), dtype=torch.float32, output_loading_info=True
        )
    except (OSError, ValueError, KeyError) as exc:
        raise CaptureSpecError(f"transformers cannot load the target {target_dir}: {exc}") from None
    missing = info.get("missing_keys") or []
    if missing:
        raise CaptureSpecError(
            f"target {target_dir} lacks weights {sorted(missing)[:4]}...; its scores would be "
            "meaningless (random weights)"
        )
    return model.eval()


@dataclasses.dataclass
class TargetRun:
    """One target forward over a :class:`Sample`: every tap and the target's logits at every position."""

    input_ids: Any  # [N, T] long
    taps: Any  # [L + 1, N, T, H]: taps[k] = hidden state entering layer k
    logits: Any  # [N, T, V] float: row t = the target's distribution for token t + 1
    embed_weight: Any  # [V, H]: the target's input embedding (shared with a draft that has none)

    @property
    def greedy(self):
        return self.logits.argmax(-1)


@contextlib.contextmanager
def _tap_reader(model) -> Iterator[Callable[[Any], Any]]:
    """A function turning the output of one ``output_hidden_states`` forward of ``model`` into its taps
    [L + 1, B, T, H]: transformers' ``hidden_states``, tap L replaced by the final norm's INPUT (transformers' last
    entry may be post-norm), captured by a hook that lives as long as the context."""
    import torch

    captured: dict[str, Any] = {}
    norm = getattr(model.get_decoder(), "norm", None)  # tap L is the input of the final norm
    handle = (
        None
        if norm is None
        else norm.register_forward_pre_hook(lambda mod, args: captured.__setitem__("pre_norm", args[0]))
    )

    def taps(out) -> Any:
        hs = list(out.hidden_states)
        hs[-1] = captured.get("pre_norm", hs[-1])
        return torch.stack(hs).float()

    try:
        yield taps
    finally:
        if handle is not None:
            handle.remove()


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the enclosed torch ops on one intra-op thread (restored afterwards).

    Why: a decode step's ops are tiny ([N, hidden] x [hidden, n]), so a second OpenMP thread saves nothing, and
    while other processes share the cores every op waits at an OpenMP barrier for a preempted thread. Measured on
    the miniature (61 layers, 16 prompts, 16 KV-cached decode steps, other engines running, load average ~12):
    375 s wall / 205 CPU-seconds with torch's default 2 threads, 22 s / 10 CPU-seconds with one."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def run_target(model, seqs, batch: int = 8) -> TargetRun:
    """The target over ``seqs`` [N, T] (``batch`` sequences per forward to bound memory)."""
    import torch

    seqs = torch.as_tensor(seqs, dtype=torch.long)
    seqs = seqs[None] if seqs.dim() == 1 else seqs
    taps, logits = [], []
    with torch.no_grad(), _tap_reader(model) as taps_of:
        for i in range(0, seqs.shape[0], batch):
            out = model(input_ids=seqs[i : i + batch], output_hidden_states=True)
            taps.append(taps_of(out))  # [L + 1, b, T, H]
            logits.append(out.logits.float())
    return TargetRun(seqs, torch.cat(taps, 1), torch.cat(logits), model.get_input_embeddings().weight.detach().float())


def greedy_run(model, prompts, new_tokens: int) -> TargetRun:
    """``prompts`` [N, P] continued by the target's own greedy tokens to P + ``new_tokens`` tokens, recorded while it
    decodes: the prefill's taps and logits, then one KV-cached decode step per token, fed the argmax of the step
    before (so the sequences are this run's own greedy tokens by construction, and no second forward over them is
    needed). All N prompts decode together, on one torch thread (:func:`one_torch_thread`); DeepSeek/Kimi MoE
    experts run densely (:func:`vllm_eagle3.miniature.target.use_dense_experts`: the same function, no host sync
    per layer)."""
    import torch

    from vllm_eagle3.miniature.target import use_dense_experts

    use_dense_experts(model)
    seqs = [torch.as_tensor(prompts, dtype=torch.long)]
    taps, logits = [], []
    with torch.no_grad(), one_torch_thread(), _tap_reader(model) as taps_of:
        out = model(input_ids=seqs[0], use_cache=True, output_hidden_states=True)
        for step in range(new_tokens + 1):
            taps.append(taps_of(out))  # [L + 1, N, rows, H]
            logits.append(out.logits.float())
            if step == new_tokens:
                break
            seqs.append(out.logits[:, -1:].argmax(-1))
            out = model(
                input_ids=seqs[-1], past_key_values=out.past_key_values, use_cache=True, output_hidden_states=True
            )
    return TargetRun(
        torch.cat(seqs, 1),
        torch.cat(taps, 2),
        torch.cat(logits, 1),
        model.get_input_embeddings().weight.detach().float(),
    )


# ----------------------------------------------------------------------------------------------- draft side


def load_draft(draft_dir: Path, draft: DraftInfo, num_taps: int, run: TargetRun):
    """The draft head as :class:`vllm_eagle3.reference.Eagle3Draft`, the plain-PyTorch copy of vLLM's
    ``llama_eagle3`` forward (float32, eval). Its fan-in comes from ``fc.weight`` (not from the config, which is what
    is being diagnosed); the embedding is the target's unless the draft ships its own (as vLLM does)."""
    from safetensors.torch import load_file

    from vllm_eagle3.reference import DraftConfig, Eagle3Draft

    cfg = dict(draft.config)
    cfg["num_aux_hidden_states"] = num_taps
    try:
        model = Eagle3Draft(DraftConfig.from_hf_config(cfg))
    except (KeyError, ValueError, TypeError) as exc:
        raise CaptureSpecError(
            f"draft config {draft_dir}/config.json cannot describe a Llama EAGLE-3 head: {type(exc).__name__}: {exc}"
        ) from None
    state: dict[str, Any] = {}
    for f in sorted(Path(draft_dir).glob("*.safetensors")):
        state.update(load_file(str(f)))
    state = {k.removeprefix("model."): v for k, v in state.items()}
    state = {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in state.items()}
    if "d2t" not in state and model.config.draft_vocab_size != model.config.vocab_size:
        raise CaptureSpecError(
            f"draft {draft_dir} predicts {model.config.draft_vocab_size} of "
            f"{model.config.vocab_size} tokens but has no d2t: its token ids cannot be mapped"
        )
    expected = set(model.state_dict()) - {"embed_tokens.weight", "t2d", "d2t"}
    missing = sorted(expected - set(state))
    if missing:
        raise CaptureSpecError(
            f"draft {draft_dir} lacks weights {missing[:4]}; is it a Llama-style EAGLE-3 head "
            "(fc, midlayer.*, norm, lm_head)?"
        )
    own_embed = "embed_tokens.weight" in state
    try:
        model.load_state_dict(
            {k: v.float() if v.is_floating_point() else v for k, v in state.items() if k in model.state_dict()},
            strict=False,
        )
    except RuntimeError as exc:
        raise CaptureSpecError(
            f"draft {draft_dir} weights do not fit its config: {str(exc).splitlines()[-1]}"
        ) from None
    if not own_embed:
        if tuple(run.embed_weight.shape) != tuple(model.embed_tokens.weight.shape):
            raise CaptureSpecError(
                f"the target's embedding {tuple(run.embed_weight.shape)} does not fit the draft "
                f"({tuple(model.embed_tokens.weight.shape)}): is this draft for this target?"
            )
        model.embed_tokens.weight.data.copy_(run.embed_weight)
    return model.float().eval()


def first_draft_acceptance(
    draft, run: TargetRun, sample: Sample, candidates: Sequence[Candidate], progress: bool = True
) -> dict[tuple[int, ...], float]:
    """Position-0 acceptance of every candidate at the chain anchors: the cheap screen (one draft step) that picks
    which candidates get full chains. A wiring's acceptance length at k is at most 1 + k * its position-0
    acceptance, so a poor first draft bounds the chain."""
    import torch
    from tqdm import tqdm

    from vllm_eagle3.reference.acceptance import MAX_K
    from vllm_eagle3.reference.teacher import shifted

    t = run.input_ids.shape[1]
    a, last = sample.first_anchor, t - MAX_K
    want = run.greedy[:, a + 1 : last + 1]  # [N, A]: the target's token after each anchor's next token
    nxt = shifted(run.input_ids)
    out = {}
    with torch.no_grad():
        for c in tqdm(candidates, desc="screening wirings", unit="wiring", disable=not progress, file=sys.stderr):
            aux = torch.cat([run.taps[k] for k in c.taps], -1)  # [N, T, n * H]
            logits, _ = draft.unroll(aux, nxt, 1)[0]
            pred = draft.draft_to_target[logits.argmax(-1)]  # [N, T]
            out[c.taps] = float((pred[:, a:last] == want).float().mean())
    return out


class _Replay:
    """The target as :func:`vllm_eagle3.reference.acceptance.chain_eval` calls it, answering from the one forward
    already run: chain_eval runs the target for each call, the doctor scores many wirings on one target run."""

    def __init__(self, run: TargetRun) -> None:
        self.run = run
        self.config = SimpleNamespace(num_hidden_layers=run.taps.shape[0] - 1)

    def __call__(self, input_ids, **_: Any):  # output_hidden_states, use_cache: the run had them
        if tuple(input_ids.shape) != tuple(self.run.input_ids.shape):
            raise ValueError("replayed target called on other sequences than it ran")
        return SimpleNamespace(hidden_states=self.run.taps, logits=self.run.logits)


def chain_matches(draft, run: TargetRun, sample: Sample, taps: Sequence[int]):
    """[N, A, MAX_K] bool: at each anchor, which chained draft steps equal the target's greedy tokens, for the
    draft fed ``cat(taps)`` -- :func:`vllm_eagle3.reference.acceptance.chain_eval` (the model card's evaluation)."""
    from vllm_eagle3.reference.acceptance import chain_eval
    from vllm_eagle3.spec import CaptureSpec

    n = run.input_ids.shape[0]
    return chain_eval(
        _Replay(run), draft, run.input_ids, CaptureSpec(tuple(taps), source="doctor"), sample.first_anchor, batch=n
    )[2]
