"""Engine layer-id conventions, converted to and from taps (see :mod:`vllm_eagle3.spec` for "tap k").

A draft config's ``eagle_aux_hidden_state_layer_ids`` are meaningless without a stated convention: the same JSON
``[0, 3, 31]`` is taps 0/3/31 in vLLM and taps 1/4/32 in SGLang before 0.5.13. Each convention is one entry of the
engine table (:mod:`vllm_eagle3.engines`, one row of ``docs/conventions.md`` each, with the code reference that fixes
it); :func:`ids_to_taps` and :func:`taps_to_ids` are the only places in the project where an id is shifted.

Every converter keeps the ids' listed order (``ids[i]`` becomes ``taps[i]``); ``concat_order`` says what the engine
itself then does with that order ("ascending": it sorts, "listed": it keeps the list).
"""

from __future__ import annotations

from typing import Sequence

from vllm_eagle3.engines import ENGINES, Engine
from vllm_eagle3.spec import EMBED, CaptureSpecError, tap_label

Convention = Engine
"""A convention is an engine table entry, read for its id rule."""

CONVENTIONS: dict[str, Engine] = ENGINES
"""The engine table itself (not a copy): an entry added there is a convention here."""


def engine_default_ids(num_layers: int) -> tuple[int, int, int]:
    """The ids vLLM, SGLang and speculators fall back to when a draft config names none: (2, L//2, L-3).

    This is a DEFAULT, not a recommendation: an engine given a config without ids silently captures these taps,
    whatever the draft was trained on. Every engine reads the default as taps directly (SGLang 0.5.23's
    ``set_eagle3_layers_to_capture(None)`` sets ``layers_to_capture = [2, L//2, L-3]`` without its +1).
    """
    return (2, num_layers // 2, num_layers - 3)


def get_convention(name: str) -> Convention:
    """Look up a convention by name (or alias); an unknown name lists the known ones."""
    if not isinstance(name, str):
        raise CaptureSpecError(f"convention must be a name such as 'vllm' or 'sglang-legacy', got {name!r}")
    key = name.strip().lower()
    key = next((e.name for e in CONVENTIONS.values() if key in e.aliases), key)
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
        raise CaptureSpecError(
            f"{what}: {conv.name} requires exactly {conv.exact_count} ids, got {len(out)} ({conv.count_reason})"
        )
    return tuple(out)


def ids_to_taps(ids: Sequence[int], convention: str, num_layers: int) -> tuple[int, ...]:
    """Read an engine's id list as taps, keeping the listed order."""
    conv = get_convention(convention)
    ids = _check_id_list(ids, conv, num_layers, f"{conv.name} ids")
    taps = conv.to_taps(ids, num_layers)
    for t in taps:
        if not 0 <= t <= num_layers:  # pragma: no cover - guarded by the id range
            raise CaptureSpecError(f"{conv.name} ids {list(ids)} give tap {t}, outside 0..{num_layers}")
    conv.validate_taps(taps, num_layers)
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
        able = ", ".join(e.label for e in CONVENTIONS.values() if e.serving and e.embed_id is not None)
        problems.append(
            f"{conv.name} cannot express the embedding tap (tap 0): its ids mean 'output of layer k' and start at "
            f"layer 0's output (tap 1); train the draft on taps >= 1 or serve it with an engine that can tap the "
            f"embedding ({able})"
        )
    try:
        conv.validate_taps(taps, num_layers)
    except CaptureSpecError as exc:
        problems.append(str(exc))
    if conv.served_count is not None and len(taps) != conv.served_count:
        problems.append(
            f"{conv.name} ids can name {len(taps)} taps, but that engine serves {conv.served_count} "
            f"only ({conv.served_reason})"
        )
    if problems:
        raise CaptureSpecError("; and ".join(problems))
    ids = conv.to_ids(taps, num_layers)
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
