"""Candidate wirings of an EAGLE-3 draft: the tap sets worth scoring next to the configured one.

Data flow position: configuration. The offline doctor (:mod:`vllm_eagle3.tools.doctor`) screens
:func:`candidate_wirings` with transformers; the online wiring check (:mod:`vllm_eagle3.wiring_check`,
:mod:`vllm_eagle3.online`) scores the smaller :func:`online_candidates` on live traffic inside the serving engine.
A candidate is an ORDERED tap tuple: the draft's ``fc`` is order-sensitive. Pure Python, no engine.
"""

from __future__ import annotations

import dataclasses
import math
from itertools import combinations
from typing import Iterable, Iterator, Mapping, Sequence

from vllm_eagle3.checkpoint import DraftInfo
from vllm_eagle3.conventions import CONVENTIONS, engine_default_ids, ids_to_taps, taps_to_ids
from vllm_eagle3.engines import ENGINES
from vllm_eagle3.spec import EMBED, CaptureSpec, CaptureSpecError, taps_label

EXHAUSTIVE_LIMIT = 400
"""Search every ordered-ascending tap set when there are at most this many (tiny targets)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    taps: tuple[int, ...]
    why: str

    @property
    def label(self) -> str:
        return taps_label(self.taps)


def _valid(taps: Sequence[int], num_layers: int, n: int) -> bool:
    return len(taps) == n and len(set(taps)) == n and all(0 <= t <= num_layers for t in taps)


def config_readings(draft: DraftInfo, num_layers: int) -> list[Candidate]:
    """The draft config's id lists (top level, ``eagle_config``) read under every engine convention that accepts
    them: what each engine would capture for this draft."""
    lists = {}
    if draft.top_ids is not None:
        lists["top-level ids"] = draft.top_ids
    if draft.nested_ids is not None and draft.nested_ids != draft.top_ids:
        lists["eagle_config ids"] = draft.nested_ids
    out = []
    for where, ids in lists.items():
        for conv in CONVENTIONS:
            try:
                out.append(Candidate(ids_to_taps(ids, conv, num_layers), f"{where} {list(ids)} read as {conv}"))
            except CaptureSpecError:
                pass
    return out


def variants_of(base: Candidate) -> Iterator[tuple[tuple[int, ...], str]]:
    """The near misses of one wiring: all taps +-1, each tap +-1, the embedding swapped in or out."""
    t = base.taps
    for d in (-1, 1):
        yield tuple(x + d for x in t), f"all taps {d:+d} of {base.label}"
    for i in range(len(t)):
        for d in (-1, 1):
            yield t[:i] + (t[i] + d,) + t[i + 1 :], f"tap {i + 1} {d:+d} of {base.label}"
    if EMBED not in t:
        yield (EMBED,) + t[:-1], f"embed prepended to {base.label}, last tap dropped"
        yield (EMBED,) + t[1:], f"embed in place of the first tap of {base.label}"
    else:
        rest = tuple(x for x in t if x != EMBED)
        nxt = max(t) + (max(t) - min(rest) if rest else 1)
        yield rest + (nxt,), f"{base.label} without embed, one tap appended"


class _Set:
    """Candidates in insertion order, deduplicated by taps, invalid ones (wrong count, repeats, out of range)
    dropped."""

    def __init__(self, num_layers: int, num_taps: int) -> None:
        self.L, self.n = num_layers, num_taps
        self.out: dict[tuple[int, ...], Candidate] = {}

    def add(self, taps: Iterable[int], why: str) -> None:
        taps = tuple(taps)
        if _valid(taps, self.L, self.n) and taps not in self.out:
            self.out[taps] = Candidate(taps, why)


def candidate_wirings(
    draft: DraftInfo,
    num_layers: int,
    num_taps: int,
    extra: Mapping[str, Sequence[int]] | None = None,
    exhaustive: bool | None = None,
) -> list[Candidate]:
    """Every wiring worth scoring offline, deduplicated: the config's readings, the engine default, ``extra``, the
    near misses of each of those, every tap set when the target is tiny, and the sorted order of each."""
    L, n = num_layers, num_taps
    bases = config_readings(draft, L)
    default = tuple(engine_default_ids(L))
    bases.append(Candidate(default, f"engine default {list(default)}"))
    for name, taps in (extra or {}).items():
        bases.append(Candidate(tuple(taps), name))
    s = _Set(L, n)
    bases = [b for b in bases if _valid(b.taps, L, n)]
    for b in bases:
        s.add(b.taps, b.why)
    for b in bases:
        for taps, why in variants_of(b):
            s.add(taps, why)
    if exhaustive is None:
        exhaustive = math.comb(L + 1, n) <= EXHAUSTIVE_LIMIT
    if exhaustive:
        for taps in combinations(range(L + 1), n):
            s.add(taps, "exhaustive search")
    for c in list(s.out.values()):
        s.add(sorted(c.taps), f"sorted order of {c.label}")
    return list(s.out.values())


def online_candidates(configured: Sequence[int], draft: DraftInfo, num_layers: int) -> list[Candidate]:
    """The wirings the serving engine scores next to ``configured`` (first in the list): the near misses of the
    configured taps (each tap +-1, all +-1, with and without the embedding) and the engines' readings of the draft
    config, each also in ascending order (what an engine that sorts would concatenate). Kept small on purpose:
    every candidate costs one draft forward per checked position."""
    conf = Candidate(tuple(int(k) for k in configured), "configured")
    s = _Set(num_layers, len(conf.taps))
    s.add(conf.taps, conf.why)
    for taps, why in variants_of(conf):
        s.add(taps, why)
    for c in config_readings(draft, num_layers):
        s.add(c.taps, c.why)
    for c in list(s.out.values()):
        s.add(sorted(c.taps), f"sorted order of {c.label}")
    return list(s.out.values())


def config_lines(taps: Sequence[int], num_layers: int) -> list[str]:
    """The exact lines that make each engine of the table with a ``write`` capture ``taps`` (or why it cannot);
    the capture spec first, then vLLM's line (the online check quotes the first two)."""
    spec = CaptureSpec(tuple(taps), source="doctor")
    lines = [f"vllm-eagle3 capture spec (YAML): taps: {spec.label()}   num_layers: {num_layers}"]
    sorting = []
    for engine in ENGINES.values():
        if engine.write is None:
            continue
        if engine.concat_order == "ascending":
            sorting.append(engine.label)
        try:
            ids = taps_to_ids(spec.taps, engine.name, num_layers)
        except CaptureSpecError as exc:
            lines.append(f"{engine.label}: not expressible: {exc}")
            continue
        lines.append(f"{engine.label} ({engine.write.where}): {engine.write.line(ids, spec.num_taps)}")
        if spec.has_embed and engine.write.embed_note:
            lines.append(f"  ({engine.write.embed_note})")
    if list(taps) != sorted(taps) and sorting:
        lines.append(
            f"  NOTE: the draft expects the order {spec.label()}; {', '.join(sorting)} concatenate "
            "ascending; only the vllm-eagle3 capture spec keeps this order"
        )
    return lines
