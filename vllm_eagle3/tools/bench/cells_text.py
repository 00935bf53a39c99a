"""How the benchmark pages write numbers: an estimate with its interval, a float, a markdown table, and the summary's
variants picked by their settings. Shared by ``report.py`` and ``report_adaptive.py``."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from vllm_eagle3.tools.bench.stats import Estimate, finite


def e(d: Mapping | None, digits: int = 2) -> str:
    return Estimate.from_dict(d).fmt(digits) if d else "n/a"


def f(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and finite(x) else "n/a"


def per_server(xs: Sequence[Any], digits: int = 1) -> str:
    """``12.3 / 12.9``: one value per server."""
    return " / ".join(f(x, digits) for x in xs)


def same_config(ests: Sequence[Mapping], digits: int = 3) -> str:
    """The ratios between two servers of one configuration, one per side; ``-`` when none was measured."""
    return " ; ".join(e(x, digits) for x in ests) or "-"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def _v(summary: Mapping, **want) -> list[dict]:
    return [v for v in summary["variants"] if all(v["variant"].get(k) == x for k, x in want.items())]
