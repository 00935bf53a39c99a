"""Measured throughput per (k, concurrency) -> a k-per-batch-size table for vLLM's
``speculative_config.num_speculative_tokens_per_batch_size``, and the serve-config lines that carry it. Used during
``--plan adaptive`` (``cli.execute`` asks :func:`resolve` for each variant of a stretch) and after it (``--advise``).
How vLLM reads the table, and the rule (:func:`schedule`): docs/adaptive-k.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Mapping, Sequence

from vllm_eagle3.tools.bench.analysis import cells, wall_tok_s
from vllm_eagle3.tools.bench.plan import CHOOSE_LOADED, Variant, k_at

OPEN_END = 4096  # the last range's end: vLLM caps it at max_num_seqs
Schedule = tuple[tuple[int, int, int], ...]


def points(raws: Sequence[Mapping[str, Any]]) -> dict[int, dict[int, float]]:
    """concurrency -> {k: tok/s} over the static servers in ``raws`` (results-file variant records)."""
    out: dict[int, dict[int, float]] = {}
    for raw in raws:
        v = Variant.from_dict(raw["variant"])
        for c in (
            {x["concurrency"] for x in raw.get("cells", []) if x["kind"] == "throughput"}
            if v.chooses_k and not raw.get("error")
            else ()
        ):
            if math.isfinite(t := wall_tok_s(cells(raw, "throughput", c))):
                out.setdefault(c, {})[v.k] = t
    return out


def best_k(per_k: Mapping[int, float]) -> int:
    return max(per_k, key=lambda k: (per_k[k], -k))  # a tie goes to the smaller k (less draft work)


def schedule(pts: Mapping[int, Mapping[int, float]]) -> Schedule:
    """The table from measured points (needs at least one concurrency): the last range open-ended, neighbours with
    one k merged."""
    if not (cs := sorted(c for c in pts if pts[c])):
        raise ValueError("no measured throughput to choose k from (every static server failed?)")
    ks = list(itertools.accumulate((best_k(pts[c]) for c in cs), min))  # k never rises with the batch
    ends = [math.floor(math.sqrt(a * b)) for a, b in zip(cs, cs[1:])] + [OPEN_END]  # throughput moves with log C
    ranges: list[list[int]] = []
    start = 1
    for end, k in zip(ends, ks):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
        start = end + 1
    return tuple(tuple(r) for r in ranges)


def loaded_cells(v: Variant, raws: Sequence[Mapping[str, Any]]) -> tuple:
    """A static k of the loaded stretch: all its cells while ``v.k`` is at most the table's k at the highest
    concurrency measured so far (k never rises with the batch, so a larger k cannot be chosen at more load), else
    none. No speculation always runs (the baseline, and k = 0 may be chosen)."""
    pts = points(raws)
    return v.cells if v.k == 0 or not pts or v.k <= k_at(schedule(pts), max(pts)) else ()


def side_cells(v: Variant, raws: Sequence[Mapping[str, Any]]) -> tuple:
    """A judging static server's cells: those at concurrencies where its k is the table's, or the best of the
    k >= 1 the choosing servers measured (what the adaptive server is compared with)."""
    pts = points(raws)
    table = schedule(pts)

    def best_static(c: int) -> int | None:
        per_k = {k: t for k, t in pts.get(c, {}).items() if k >= 1}
        return best_k(per_k) if per_k else None

    return tuple(cell for cell in v.cells if v.k in (k_at(table, cell.concurrency), best_static(cell.concurrency)))


def resolve(v: Variant, raws: Sequence[Mapping[str, Any]]) -> Variant:
    """The variant as it will run, given the servers already measured (a loaded-stretch or judging static k: its
    cells; adaptive: its table and k = the table's largest, at least 1)."""
    if v.stretch == CHOOSE_LOADED:
        return dataclasses.replace(v, cells=loaded_cells(v, raws))
    if v.side_static:
        return dataclasses.replace(v, cells=side_cells(v, raws))
    if v.adaptive and not v.schedule:
        table = schedule(points(raws))
        return dataclasses.replace(v, schedule=table, k=max(1, max(k for _, _, k in table)))
    return v


def from_results(data: Mapping[str, Any]) -> Schedule:
    """The table a results file's static servers give (what its adaptive server ran, when it has one)."""
    return schedule(points(data["variants"]))


def config_lines(table: Schedule, draft: str = "models/kimi-k25-mini-eagle3", source: str = "") -> str:
    """The ``speculative-config:`` block of a serve YAML carrying ``table``."""
    k = max(1, max(kk for _, _, kk in table))
    rows = ", ".join(f"[{a}, {b}, {kk}]" for a, b, kk in table)
    lines = [
        "speculative-config:",
        "  method: eagle3",
        f"  model: {draft}",
        f"  num_speculative_tokens: {k}                 # the most any batch size drafts",
        f"  num_speculative_tokens_per_batch_size: [{rows}]   # [first batch size, last, k]",
    ]
    if source:
        lines.insert(0, f"# k per batch size measured by {source}")
    return "\n".join(lines) + "\n"
