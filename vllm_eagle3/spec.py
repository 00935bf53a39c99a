"""The aux-capture spec: which target hidden states feed the EAGLE-3 draft, in which order.

Data flow: target forward -> **taps** -> concat (spec order) -> draft ``fc`` -> proposer.

The one definition this project uses, stated here and nowhere else:

    tap k  =  the residual-stream hidden state ENTERING decoder layer k
           =  Hugging Face ``output_hidden_states[k]``.

So tap 0 is the embedding output (``embed``; for Kimi K2.5 the merged ``inputs_embeds`` with the vision
features scattered in), tap L is the final pre-norm state of an L-layer model. Every engine's layer-id
convention is converted to and from taps in :mod:`vllm_eagle3.conventions`; nothing else adds or subtracts 1.

A spec is written once, in YAML (``configs/kimi_k25_eagle3.yaml``; loaded by ``resolve.load_spec_file``)::

    taps: [embed, 3, 31]                     # required: ordered; embed == 0
    num_layers: 61                           # optional: checked against the target
    draft_ids_convention: sglang-legacy      # optional: how to read the draft config's ids (cross-check)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

EMBED = 0
"""Tap 0: the embedding output (HF ``hidden_states[0]``)."""

EMBED_NAMES = ("embed", "embedding", "embeddings")


class CaptureSpecError(ValueError):
    """A capture spec, a convention or a draft does not fit. The message says what to fix."""


def parse_tap(value: Any) -> int:
    """``"embed"`` -> 0; a non-negative int (or its string) -> itself. Anything else is an error."""
    if isinstance(value, bool):
        raise CaptureSpecError(f"tap {value!r} is a boolean; write `embed` or a layer number k >= 0")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in EMBED_NAMES:
            return EMBED
        if text.lstrip("-").isdigit():
            return int(text)
    if isinstance(value, (list, tuple)):
        raise CaptureSpecError(f"tap {value!r} is a nested list; taps are a flat list such as [embed, 3, 31]")
    raise CaptureSpecError(
        f"tap {value!r} is not understood; write `embed` (the embedding output) or an integer k "
        "(the hidden state entering decoder layer k)"
    )


def tap_label(tap: int) -> str:
    return "embed" if tap == EMBED else str(tap)


def taps_label(taps: Iterable[int]) -> str:
    """``[embed, 3, 31]`` for any taps, also a list that is not a valid spec (an engine default on a tiny model can
    repeat a tap: (2, L//2, L-3) = (2, 3, 3) for L = 6)."""
    return "[" + ", ".join(tap_label(t) for t in taps) + "]"


@dataclasses.dataclass(frozen=True)
class CaptureSpec:
    """An ordered, duplicate-free list of taps and where it came from.

    ``taps`` are in the order the draft's ``fc`` expects them concatenated; that order wins over any engine's
    sorting. ``source`` is a human-readable origin used in start-up logs and error messages.
    """

    taps: tuple[int, ...]
    source: str = "inline"

    def __post_init__(self) -> None:
        if isinstance(self.taps, (str, bytes)) or not isinstance(self.taps, Iterable):
            raise CaptureSpecError(f"taps must be a list such as [embed, 3, 31], got {self.taps!r}")
        taps = tuple(parse_tap(t) for t in self.taps)
        object.__setattr__(self, "taps", taps)
        if not taps:
            raise CaptureSpecError("the capture spec has no taps; list at least one, e.g. taps: [embed, 3, 31]")
        negative = [t for t in taps if t < 0]
        if negative:
            raise CaptureSpecError(
                f"tap {negative[0]} is negative; taps count hidden states entering layer k (k >= 0, "
                "embed = 0). A -1 is SGLang-legacy's embedding id: convert it with "
                "vllm_eagle3.conventions.ids_to_taps(ids, 'sglang-legacy', num_layers)"
            )
        seen: set[int] = set()
        for t in taps:
            if t in seen:
                raise CaptureSpecError(
                    f"tap {tap_label(t)} appears twice in {self.label()}; each tap may be captured once"
                )
            seen.add(t)

    @property
    def num_taps(self) -> int:
        return len(self.taps)

    @property
    def has_embed(self) -> bool:
        return EMBED in self.taps

    def label(self) -> str:
        """``[embed, 3, 31]``."""
        return taps_label(self.taps)

    def check_num_layers(self, num_layers: int) -> None:
        """Every tap must exist in a ``num_layers``-layer model: 0..num_layers."""
        for t in self.taps:
            if t > num_layers:
                hint = ""
                if t - 1 <= num_layers:
                    hint = f"; did you mean tap {t - 1} (an SGLang-legacy or SpecForge id {t - 1} is tap {t})?"
                raise CaptureSpecError(
                    f"tap {t} is out of range for a {num_layers}-layer model (valid: embed, 0..{num_layers}){hint}"
                )

    def fan_in(self, target_hidden_size: int) -> int:
        return self.num_taps * target_hidden_size

    def check_fan_in(self, fc_in_features: int, target_hidden_size: int) -> None:
        """The draft's ``fc`` must take exactly ``num_taps x target_hidden_size`` inputs."""
        want = self.fan_in(target_hidden_size)
        if fc_in_features != want:
            if fc_in_features % target_hidden_size == 0:
                n = fc_in_features // target_hidden_size
                why = f"the draft was trained on {n} taps"
            else:
                why = f"{fc_in_features} is not a multiple of the target hidden size {target_hidden_size}"
            raise CaptureSpecError(
                f"fan-in mismatch: the draft's fc takes {fc_in_features} inputs but the spec "
                f"{self.label()} gives {self.num_taps} x {target_hidden_size} = {want} ({why}); "
                "make the spec list as many taps as the draft was trained on, or use the draft that matches"
            )


def spec_from_taps(taps: Sequence[Any], source: str = "inline") -> CaptureSpec:
    return CaptureSpec(taps=tuple(taps), source=source)
