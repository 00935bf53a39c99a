"""SGLang patch: legacy EAGLE-3 id semantics (always +1, ``-1`` = the embedding tap) for DeepseekV2/V3 and Kimi K2.5.

Why it exists: drafts trained for SGLang before PR #25454 (the incident's Kimi K2.5 head among them) write their
capture ids in the LEGACY convention: id ``k`` means "output of layer k" = tap ``k + 1``, and the incident's fix
wrote the embedding (tap 0) as ``-1``, i.e. ``[-1, 2, 30]`` for taps embed/3/31. SGLang 0.5.13..0.5.23's
``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` shifts only lists starting with ``1`` and otherwise takes ids as
taps, so ``[-1, 2, 30]`` is never matched (0.5.23 dies at the first forward: "captured 2 of 3 aux hidden states";
0.5.13.post1's capture loop, deepseek_v2.py ``DeepseekV2Model.forward``, has no such check and returns two states —
read, not run) and ``[2, 30, 58]`` silently becomes taps 2/30/58. On 0.5.12.post1 and earlier (the legacy rule itself)
``-1`` crashes instead (see below). A user who stays on SGLang with a legacy-convention draft gets the trained wiring
back by applying this patch before the model is built (see ``vllm_eagle3.conventions``, convention ``sglang-legacy``,
for the id table).

What it changes: ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` (inherited by ``DeepseekV3ForCausalLM``;
SGLang's ``KimiK25ForConditionalGeneration`` delegates to its DeepseekV3 language model). With ids given it sets
``layers_to_capture = [id + 1 for id in ids]``; ``-1`` thus becomes capture index 0. Without ids it defers to
SGLang's own default. What capture index 0 then holds depends on the version's decoder loop:

- 0.5.23: the residual stream entering layer 0 = the embedding output (for Kimi: the merged multimodal
  ``input_embeds``); the method is all the patch replaces.
- 0.5.12.post1 (the newest release with the legacy rule, ``[val + 1 for val in layer_ids]``; 0.5.13 already shifts
  only lists starting with 1): ``DeepseekV2Model.forward`` captures ``hidden_states + residual`` before layer i and
  ``residual`` is None before layer 0, so index 0 dies with ``TypeError: unsupported operand type(s) for +:
  'Tensor' and 'NoneType'`` — the crash the incident's user patched ``deepseek_v2.py`` for. The patch therefore
  also wraps ``DeepseekV2Model.forward`` (:data:`EMBED_FORWARD_VERSIONS`): when index 0 is requested on the first
  pipeline rank it embeds the ids itself (or takes the ``input_embeds`` given, e.g. Kimi's merged multimodal
  ones), runs SGLang's own forward on them with index 0 left out, and puts the embedding first in the returned aux
  list (SGLang concatenates in ascending layer order, so index 0 is first). No layer code is copied.

Version guard: written against sglang 0.5.12.post1 and 0.5.23 (:data:`SUPPORTED_SGLANG`), both parity-tested.
:data:`PATCH` is a :class:`model_patches.Patch`; :func:`apply` goes through :func:`model_patches.apply`, which refuses
any other version (naming installed and supported versions), applies at most once per process (a second call is a no-op)
and records it (:func:`model_patches.applied_patches`; the details also in :data:`APPLIED`). There is no revert: the
patch is process-wide, so a process that needs both readings runs its unpatched work first. Retire it when the draft's
ids are rewritten in SGLang 0.5.13+'s convention (``vllm-eagle3 convert``) — the proper fix — or if SGLang gains an
explicit id-convention setting.

Usage (in every SGLang process that builds the target, before it is built)::

    from vllm_eagle3.model_patches import sglang_embed_tap
    sglang_embed_tap.apply()

``.venv-sglang/bin/python -m vllm_eagle3.model_patches.sglang_embed_tap --check`` (from the repo root) applies it and
prints the record (importing sglang needs the harness shims on a CPU-only machine:
tests/parity/sglang_harness/shims.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, List, Optional

from vllm_eagle3.model_patches import Patch
from vllm_eagle3.model_patches import apply as apply_patch

SUPPORTED_SGLANG = ("0.5.12.post1", "0.5.23")
"""SGLang versions whose ``set_eagle3_layers_to_capture`` (and, where listed below, forward) this patch was written
against and is parity-tested on (``tests/parity/test_sglang_parity.py``, ``test_sglang_legacy.py``)."""

EMBED_FORWARD_VERSIONS = ("0.5.12.post1",)
"""Versions whose ``DeepseekV2Model.forward`` captures ``hidden_states + residual`` with ``residual = None`` before
layer 0 (sglang 0.5.12.post1 ``srt/models/deepseek_v2.py``, the ``if i in self.layers_to_capture`` branch of the
layer loop): there the patch also wraps the forward so capture index 0 is the embedding (see the module docstring)."""

PATCH_NAME = "sglang_embed_tap.legacy_eagle3_ids"
EMBED_ID = -1
"""The legacy id of the embedding tap (tap 0)."""

APPLIED: dict[str, dict[str, Any]] = {}
"""Details of the applied patch: name -> {"target", "sglang_version", "why"}. Empty until :func:`apply` succeeds."""

_ORIGINAL: dict[str, Callable] = {}


class SglangPatchError(RuntimeError):
    """The method the patch replaces is not SGLang's own any more (another patch got there first)."""


def _legacy_set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None) -> None:
    """Legacy SGLang reading of EAGLE-3 ids: id k captures the output of layer k (tap k+1); -1 is the embedding."""
    if layer_ids is None:
        return _ORIGINAL["set_eagle3_layers_to_capture"](self, None)
    if not self.pp_group.is_last_rank:
        return None
    num_layers = int(self.config.num_hidden_layers)
    ids = list(layer_ids)
    bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not EMBED_ID <= i <= num_layers - 1]
    if bad:
        raise ValueError(
            f"EAGLE-3 ids {ids}: {bad} out of range for a {num_layers}-layer model under the legacy SGLang "
            f"convention applied by {PATCH_NAME} (valid: -1 = embedding, 0..{num_layers - 1} = output of that "
            "layer). If the draft's ids are taps (vLLM / SGLang 0.5.13+ convention), do not apply this patch."
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"EAGLE-3 ids {ids} list an id twice; each hidden state can be captured once")
    self.capture_aux_hidden_states = True
    self.model.layers_to_capture = [i + 1 for i in ids]
    return None


def _embed_capturing_forward(self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
    """``DeepseekV2Model.forward`` whose capture index 0 is the embedding output (legacy SGLang, see the docstring)."""
    from sglang.srt.model_executor.forward_batch_info import PPProxyTensors

    original = _ORIGINAL["DeepseekV2Model.forward"]
    capture = self.layers_to_capture
    if 0 not in capture or not self.pp_group.is_first_rank:
        return original(self, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)
    if input_embeds is None:
        input_embeds = self.embed_tokens(input_ids)  # what SGLang's forward does first on the first rank
    self.layers_to_capture = [i for i in capture if i != 0]
    try:
        out = original(self, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors)
    finally:
        self.layers_to_capture = capture
    if isinstance(out, PPProxyTensors):
        return out  # a non-last pipeline rank: SGLang drops aux states there
    hidden_states, aux = out if isinstance(out, tuple) else (out, [])  # no aux when index 0 was the only one
    return hidden_states, [input_embeds, *aux]  # [T, H] each, ascending capture index: the embedding first


def _installed_version() -> str:
    import sglang

    return getattr(sglang, "__version__", "unknown")


def _apply_fn() -> str:
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    current = DeepseekV2ForCausalLM.__dict__.get("set_eagle3_layers_to_capture")
    if current is _legacy_set_eagle3_layers_to_capture:
        return "already patched"
    if current is None or current.__qualname__ != "DeepseekV2ForCausalLM.set_eagle3_layers_to_capture":
        raise SglangPatchError(
            f"DeepseekV2ForCausalLM.set_eagle3_layers_to_capture is {current!r}, not SGLang's own method "
            "(another patch replaced it?). Remove the other patch or apply this one first."
        )
    version = _installed_version()
    wrap_forward = version.startswith(EMBED_FORWARD_VERSIONS)
    if wrap_forward:
        from sglang.srt.models.deepseek_v2 import DeepseekV2Model

        forward = DeepseekV2Model.__dict__.get("forward")
        if forward is None or forward.__qualname__ != "DeepseekV2Model.forward":
            raise SglangPatchError(
                f"DeepseekV2Model.forward is {forward!r}, not SGLang's own method "
                "(another patch replaced it?). Remove the other patch or apply this one first."
            )
        _ORIGINAL["DeepseekV2Model.forward"] = forward
        DeepseekV2Model.forward = _embed_capturing_forward
    _ORIGINAL["set_eagle3_layers_to_capture"] = current
    DeepseekV2ForCausalLM.set_eagle3_layers_to_capture = _legacy_set_eagle3_layers_to_capture
    targets = ["sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"]
    if wrap_forward:
        targets.append("sglang.srt.models.deepseek_v2.DeepseekV2Model.forward")
    APPLIED[PATCH_NAME] = {
        "target": targets[0],
        "targets": targets,
        "sglang_version": version,
        "why": "legacy EAGLE-3 ids: always +1, -1 = embedding tap",
    }
    what = "DeepseekV2ForCausalLM.set_eagle3_layers_to_capture: legacy ids (always +1, -1 = embedding)"
    return what + ("; DeepseekV2Model.forward: capture index 0 = the embedding" if wrap_forward else "")


PATCH = Patch(
    name=PATCH_NAME,
    engine="sglang",
    supported=SUPPORTED_SGLANG,
    retire_when="rewriting the draft's ids in SGLang 0.5.13+'s convention (`vllm-eagle3 convert`)",
    apply_fn=_apply_fn,
)


def apply() -> str:
    """Apply :data:`PATCH` once in this process (version-guarded, recorded); returns the record line."""
    record = apply_patch(PATCH, _installed_version())
    print(f"[vllm-eagle3] {record}", file=sys.stderr)
    return record


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="apply the patch and print what was applied")
    args = parser.parse_args(argv)
    if args.check:
        print(apply())
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
