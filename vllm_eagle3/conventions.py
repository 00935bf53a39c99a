"""Engine layer-id conventions, converted to and from taps (see :mod:`vllm_eagle3.spec` for "tap k").

A draft config's ``eagle_aux_hidden_state_layer_ids`` are meaningless without a stated convention: the same JSON
``[0, 3, 31]`` is taps 0/3/31 in vLLM and taps 1/4/32 in SGLang before 0.5.13. Each :class:`Convention` below is
one row of ``docs/conventions.md``, with the code reference that fixes it; :func:`ids_to_taps` and
:func:`taps_to_ids` are the only places in the project where an id is shifted.

Every converter keeps the ids' listed order (``ids[i]`` becomes ``taps[i]``); ``concat_order`` says what the engine
itself then does with that order ("ascending": it sorts, "listed": it keeps the list).

Rows added from the trainers' and engines' own source (read, not copied; file + line at the commit named):

- ``torchspec`` (lightseekorg/TorchSpec @ 6f21829): id k = OUTPUT of decoder layer k = tap k+1.
  ``torchspec/models/target/eagle3_target_model.py`` L219-226 registers a forward hook on ``layers[idx]`` for
  ``0 <= idx < len(layers)`` (else ValueError) and L254 concatenates in the listed order; L100-111 default
  ``[1, L//2-1, L-4]``; L97 "Eagle3 uses 3, DFlash uses 5" (any count). ``inference/engine/vllm_engine.py``
  L155-171 shifts +1 for vLLM ("post-layer -> pre-next-layer"), and ``tools/convert_to_hf.py`` L146-159
  (``_fixup_export_config``) adds +1 to both id lists when exporting a ``kimi_k2`` draft for vLLM: an exported
  lightseekorg MLA head ([2, 30, 58]) is in the ``vllm`` convention, its training config ([1, 29, 57]) in this one.
  No id names the embedding.
- ``sglang`` (SGLang 0.5.23, ``srt/models/deepseek_v2.py``): L3470-3473 shift a list starting with 1, else keep it;
  L3175-3195 capture only inside the decoder-layer loop (``i in layers_to_capture`` for i in 0..L-1) into a packer
  sized ``len(layers_to_capture)`` (any count), so tap L (the final pre-norm state) is never captured and
  ``srt/layers/aux_hidden_states.py`` L85-89 raises "captured n-1 of n aux hidden states".
- ``sglang-legacy`` (SGLang 0.5.12.post1): ids of any count are captured (+1 each) and the draft's ``fc`` is sized
  from its list, but ``srt/speculative/eagle_info.py`` L877-901 sizes the draft-extend hidden states from the TARGET's
  config (else 3 x hidden), so only three taps are served (``served_count``; read, not run: SGLang's speculative loop
  needs CUDA). 0.5.23 reads the draft's config there (``speculative/eagle_utils.py`` L237-276).
- ``specforge`` (sgl-project/SpecForge @ a6b6b02): ``specforge/algorithms/model_providers.py`` L188-211
  ``resolve_eagle_capture_layers`` raises unless the list holds exactly three non-negative ints.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from vllm_eagle3.spec import EMBED, CaptureSpecError, tap_label


def engine_default_ids(num_layers: int) -> tuple[int, int, int]:
    """The ids vLLM, SGLang and speculators fall back to when a draft config names none: (2, L//2, L-3).

    This is a DEFAULT, not a recommendation: it is what the incident's engine silently used. Every engine reads
    the default as taps directly (SGLang 0.5.23's ``set_eagle3_layers_to_capture(None)`` sets
    ``layers_to_capture = [2, L//2, L-3]`` without its +1).
    """
    return (2, num_layers // 2, num_layers - 3)


def _identity(ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    return tuple(ids)


def _plus_one(ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    return tuple(i + 1 for i in ids)


def _minus_one(taps: Sequence[int], num_layers: int) -> tuple[int, ...]:
    return tuple(t - 1 for t in taps)


def _sglang_ids_to_taps(ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    # SGLang 0.5.13..0.5.23 DeepSeek/Kimi path (models/deepseek_v2.py set_eagle3_layers_to_capture): a list that
    # starts with 1 is read as a legacy "output of layer" list and shifted by one; any other list is taken as is.
    if ids and ids[0] == 1:
        return _plus_one(ids, num_layers)
    return tuple(ids)


def _sglang_taps_to_ids(taps: Sequence[int], num_layers: int) -> tuple[int, ...]:
    ids = tuple(taps)
    if ids and ids[0] == 1:
        # Written as is, a leading 1 would trigger SGLang's legacy shift. SGLang concatenates ascending whatever
        # the listed order, so listing another tap first expresses the same capture.
        if len(ids) == 1:
            raise CaptureSpecError(
                "tap 1 alone cannot be written for SGLang 0.5.13+: a list starting with 1 is shifted by one there"
            )
        ids = ids[1:] + ids[:1]
    return ids


@dataclasses.dataclass(frozen=True)
class Convention:
    """One engine's reading of the draft config's ids."""

    name: str
    description: str
    code_ref: str
    min_id: int
    max_id_offset: int  # the largest valid id is num_layers + max_id_offset
    embed_id: int | None  # the id that means tap 0, None where the embedding cannot be written
    concat_order: str  # "ascending" or "listed"
    reads: str  # which config list the engine reads: "top-level", "nested" or "both"
    _to_taps: Callable[[Sequence[int], int], tuple[int, ...]]
    _to_ids: Callable[[Sequence[int], int], tuple[int, ...]]
    exact_count: int | None = None
    count_reason: str = ""  # why exact_count holds, with the source line
    max_tap_offset: int = 0  # the largest tap this engine can capture is num_layers + max_tap_offset
    tap_reason: str = ""  # why a tap above that cannot be captured
    served_count: int | None = None  # ids of any count are read, but only this many taps are served (write check)
    served_reason: str = ""  # why, with the source line

    def id_range(self, num_layers: int) -> tuple[int, int]:
        return self.min_id, num_layers + self.max_id_offset

    def check_taps(self, taps: Sequence[int], num_layers: int) -> None:
        """Refuse taps this engine cannot capture, and a count it cannot take, naming the reason."""
        top = num_layers + self.max_tap_offset
        for t in taps:
            if t > top:
                raise CaptureSpecError(f"{self.name} cannot capture tap {t} of a {num_layers}-layer model (its "
                                       f"largest is {top}): {self.tap_reason}")
        if self.exact_count is not None and len(taps) != self.exact_count:
            raise CaptureSpecError(f"{self.name} requires exactly {self.exact_count} ids, got {len(taps)} "
                                   f"({self.count_reason})")


def _conv(name, description, code_ref, min_id, max_id_offset, embed_id, concat_order, reads, to_taps, to_ids,
          **limits) -> Convention:
    return Convention(name, description, code_ref, min_id, max_id_offset, embed_id, concat_order, reads,
                      to_taps, to_ids, **limits)


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in (
        _conv("vllm", "vLLM 0.32/0.33: id k is tap k (no transform); 0 = embedding",
              "vllm/v1/worker/gpu_model_runner.py (ids from the draft config, handed to the model unchanged)",
              0, 0, EMBED, "ascending", "top-level", _identity, _identity),
        _conv("speculators", "speculators 0.9: vLLM's convention, range [0, L]",
              "speculators models/eagle3 config -> vLLM transformers_utils/configs/speculators/algos.py",
              0, 0, EMBED, "ascending", "top-level", _identity, _identity),
        _conv("hf", "Hugging Face output_hidden_states index: id k is tap k",
              "transformers modeling outputs: hidden_states[0] = embeddings",
              0, 0, EMBED, "listed", "top-level", _identity, _identity),
        _conv("sglang", "SGLang 0.5.13..0.5.23 DeepSeek/Kimi: id k is tap k, unless the list starts with 1 "
              "(then every id is shifted +1); 0 = embedding; -1 fails; any number of ids; tap L not capturable",
              "sglang/srt/models/deepseek_v2.py set_eagle3_layers_to_capture L3458-3473, capture loop L3175-3195; "
              "model_runner_components/spec_aux_hidden_state.py L185-196 reads the nested eagle_config list",
              0, -1, EMBED, "ascending", "nested", _sglang_ids_to_taps, _sglang_taps_to_ids, max_tap_offset=-1,
              tap_reason="SGLang 0.5.23 captures only inside its decoder-layer loop (deepseek_v2.py L3175-3195: "
                         "layers 0..L-1), so the final pre-norm state never arrives and the forward raises "
                         "'captured n-1 of n aux hidden states'; drop that tap or serve with vllm-eagle3"),
        _conv("sglang-legacy", "SGLang before PR #25454, i.e. <= 0.5.12.post1 (and its Llama path): id k is tap k+1 "
              "(always +1); -1 = embedding (the incident's patch, model_patches/sglang_embed_tap.py); tap L not "
              "capturable",
              "sglang 0.5.12.post1 srt/models/deepseek_v2.py L2529-2541 set_eagle3_layers_to_capture "
              "([val + 1 for val in layer_ids]), capture loop L2267-2282 (hidden_states + residual before layer i, "
              "residual None before layer 0: -1 needs the patch); model_executor/model_runner.py L414-441 reads the "
              "nested eagle_config list; parity-tested in tests/parity/test_sglang_legacy.py",
              -1, -1, -1, "ascending", "nested", _plus_one, _minus_one, max_tap_offset=-1,
              tap_reason="legacy SGLang (0.5.12.post1 deepseek_v2.py L2267-2282) captures only inside its decoder-layer "
                         "loop (layers 0..L-1), so id L-1 is silently never captured (n-1 states arrive instead of n, "
                         "no error); drop that tap or serve with vllm-eagle3",
              served_count=3,
              served_reason="SGLang 0.5.12.post1 sizes the EAGLE-3 draft-extend hidden-state buffer from the TARGET's "
                            "config, not the draft's (srt/speculative/eagle_info.py L877-901 "
                            "EagleDraftExtendInput.hidden_size_for: num_aux_hidden_states or eagle_config ids there, "
                            "else 3), i.e. 3 x hidden for a Kimi/DeepSeek target, so a head on another tap count meets "
                            "a buffer of the wrong width in the draft-extend CUDA graph "
                            "(eagle_draft_extend_cuda_graph_runner.py L135 sizes it; L470-476 skips the copy when the "
                            "widths differ); SGLang 0.5.23 sizes it from the draft (speculative/eagle_utils.py "
                            "L237-276): write the ids for sglang (checked on 0.5.23) or serve with vllm-eagle3"),
        _conv("specforge", "SpecForge 0.2: id k = output of layer k = tap k+1; exactly 3 non-negative ids; "
              "the embedding cannot be written",
              "SpecForge specforge/algorithms/model_providers.py resolve_eagle_capture_layers L188-211",
              0, -1, None, "listed", "nested", _plus_one, _minus_one, exact_count=3,
              count_reason="SpecForge's resolve_eagle_capture_layers (specforge/algorithms/model_providers.py "
                           "L206-210) raises unless there are exactly three non-negative ids; train a head on other "
                           "than three taps with TorchSpec or speculators"),
        _conv("torchspec", "TorchSpec (lightseekorg): id k = output of layer k = tap k+1; ids 0..L-1, any number; "
              "the embedding cannot be written; exported kimi_k2 drafts are shifted to vLLM's convention",
              "TorchSpec torchspec/models/target/eagle3_target_model.py L219-226 (hook on layers[idx] output), "
              "tools/convert_to_hf.py L146-159 (+1 on kimi_k2 export for vLLM)",
              0, -1, None, "listed", "nested", _plus_one, _minus_one),
    )
}

ALIASES = {
    "vllm-v1": "vllm", "vllm-v2": "vllm", "sglang-new": "sglang", "sglang>=0.5.13": "sglang",
    "sglang>=0.5.14": "sglang",  # the boundary this project first assumed (the rule changed at 0.5.13)
    "sglang-old": "sglang-legacy", "legacy-sglang": "sglang-legacy", "huggingface": "hf", "transformers": "hf",
}


def get_convention(name: str) -> Convention:
    """Look up a convention by name (or alias); an unknown name lists the known ones."""
    if not isinstance(name, str):
        raise CaptureSpecError(f"convention must be a name such as 'vllm' or 'sglang-legacy', got {name!r}")
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in CONVENTIONS:
        raise CaptureSpecError(
            f"unknown id convention {name!r}; known: {', '.join(CONVENTIONS)} "
            "(see `vllm-eagle3 conventions` for what each means)"
        )
    return CONVENTIONS[key]


def _check_id_list(ids: Sequence[int], conv: Convention, num_layers: int, what: str) -> tuple[int, ...]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise CaptureSpecError(f"{what} must be a list of integers, got {ids!r}")
    out = []
    for i in ids:
        if isinstance(i, (list, tuple)):
            raise CaptureSpecError(
                f"{what} {list(ids)!r} is nested; a runner reads a flat list of ints such as [-1, 2, 30]"
            )
        if isinstance(i, bool) or not isinstance(i, int):
            raise CaptureSpecError(f"{what} {list(ids)!r} holds {i!r}, which is not an integer")
        out.append(i)
    if not out:
        raise CaptureSpecError(f"{what} is empty; list the layer ids the draft was trained on")
    if len(set(out)) != len(out):
        dup = next(i for i in out if out.count(i) > 1)
        raise CaptureSpecError(f"{what} {out} lists id {dup} twice; each hidden state can be captured once")
    lo, hi = conv.id_range(num_layers)
    for i in out:
        if not lo <= i <= hi:
            extra = ""
            if conv.embed_id is None and i == -1:
                extra = f"; {conv.name} cannot express the embedding tap"
            elif i == -1:
                extra = "; -1 means the embedding only in sglang-legacy"
            raise CaptureSpecError(
                f"{what}: id {i} is out of range for a {num_layers}-layer model under the {conv.name} convention "
                f"(valid: {lo}..{hi}){extra}"
            )
    if conv.exact_count is not None and len(out) != conv.exact_count:
        raise CaptureSpecError(f"{what}: {conv.name} requires exactly {conv.exact_count} ids, got {len(out)} "
                               f"({conv.count_reason})")
    return tuple(out)


def ids_to_taps(ids: Sequence[int], convention: str, num_layers: int) -> tuple[int, ...]:
    """Read an engine's id list as taps, keeping the listed order."""
    conv = get_convention(convention)
    ids = _check_id_list(ids, conv, num_layers, f"{conv.name} ids")
    taps = conv._to_taps(ids, num_layers)
    for t in taps:
        if not 0 <= t <= num_layers:  # pragma: no cover - guarded by the id range
            raise CaptureSpecError(f"{conv.name} ids {list(ids)} give tap {t}, outside 0..{num_layers}")
    conv.check_taps(taps, num_layers)
    return taps


def taps_to_ids(taps: Sequence[int], convention: str, num_layers: int) -> tuple[int, ...]:
    """Write taps as an engine's id list; refuses what the convention cannot express, with the reason."""
    conv = get_convention(convention)
    taps = tuple(taps)
    for t in taps:
        if not 0 <= t <= num_layers:
            raise CaptureSpecError(
                f"tap {t} is out of range for a {num_layers}-layer model (valid: embed, 0..{num_layers})"
            )
    problems = []  # every reason, not just the first (SpecForge cannot take [embed, 3, 31, 59] for two)
    if EMBED in taps and conv.embed_id is None:
        problems.append(
            f"{conv.name} cannot express the embedding tap (tap 0): its ids mean 'output of layer k' and start at "
            f"layer 0's output (tap 1); train the draft on taps >= 1 or serve it with an engine that can tap the "
            "embedding (vllm with this plugin, sglang >= 0.5.13, sglang-legacy with the patch)"
        )
    try:
        conv.check_taps(taps, num_layers)
    except CaptureSpecError as exc:
        problems.append(str(exc))
    if conv.served_count is not None and len(taps) != conv.served_count:
        problems.append(f"{conv.name} ids can name {len(taps)} taps, but that engine serves {conv.served_count} "
                        f"only ({conv.served_reason})")
    if problems:
        raise CaptureSpecError("; and ".join(problems))
    ids = conv._to_ids(taps, num_layers)
    _check_id_list(ids, conv, num_layers, f"{conv.name} ids")
    if tuple(sorted(ids_to_taps(ids, conv.name, num_layers))) != tuple(sorted(taps)):
        raise CaptureSpecError(f"taps {[tap_label(t) for t in taps]} cannot be written in {conv.name} ids")
    return ids


def convert_ids(ids: Sequence[int], src: str, dst: str, num_layers: int) -> tuple[int, ...]:
    """Translate a draft config's ids from one convention to another (through taps)."""
    return taps_to_ids(ids_to_taps(ids, src, num_layers), dst, num_layers)


def engine_order(taps: Sequence[int], convention: str) -> tuple[int, ...]:
    """The order in which an engine of ``convention`` concatenates these taps."""
    conv = get_convention(convention)
    return tuple(sorted(taps)) if conv.concat_order == "ascending" else tuple(taps)
