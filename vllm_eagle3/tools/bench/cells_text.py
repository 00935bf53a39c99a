"""How the benchmark pages write numbers and draw series: an estimate with its interval, a float, a markdown table,
the summary's variants picked by their settings, a variant's legend, a series' style, matplotlib if installed.
Shared by ``report.py``, ``report_adaptive.py`` and ``vllm_eagle3.tools.soak``."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from vllm_eagle3.tools.bench.stats import Estimate, finite


def fmt_estimate(d: Mapping | None, digits: int = 2) -> str:
    """An estimate (``Estimate.as_dict``) with its interval, e.g. ``1.62 [1.51-1.74]``; ``n/a`` for none."""
    return Estimate.from_dict(d).fmt(digits) if d else "n/a"


def fmt_number(x: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals; ``n/a`` for a missing or non-finite one."""
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and finite(x) else "n/a"


def per_server(xs: Sequence[Any], digits: int = 1) -> str:
    """``12.3 / 12.9``: one value per server."""
    return " / ".join(fmt_number(x, digits) for x in xs)


def same_config(ests: Sequence[Mapping], digits: int = 3) -> str:
    """The ratios between two servers of one configuration, one per side; ``-`` when none was measured."""
    return " ; ".join(fmt_estimate(x, digits) for x in ests) or "-"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    )


def variants_with(summary: Mapping, **want) -> list[dict]:
    """The summary's variants whose settings hold every ``want``, e.g. ``variants_with(s, k=3, compiled=False)``."""
    return [v for v in summary["variants"] if all(v["variant"].get(k) == x for k, x in want.items())]


INSTALL_PLOTS = "pip install 'vllm-eagle3[bench]'"


def pyplot(what: str):
    """matplotlib's pyplot (off-screen), or None with one line saying how to get it: matplotlib is only in the
    ``[bench]`` extra, and a run's page and advice must not be lost for want of a plot."""
    try:
        import matplotlib
    except ImportError:
        print(f"[plot] {what} skipped: matplotlib is not installed ({INSTALL_PLOTS})", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_CAPTURE_WORDS = {
    "embed": "plugin capture",
    "native": "native capture of 3/31/59",
    "layers": "2nd head, plugin capture",
    "native-layers": "2nd head, native capture",
}


def legend(x: Mapping) -> str:
    """A variant (``Variant.as_dict``) in a few words: ``EAGLE-3, plugin capture, k=3, compiled``."""
    s = (
        "no speculation"
        if not x["k"]
        else f"EAGLE-3, k per batch size (up to {x['k']})"
        if x.get("adaptive")
        else f"EAGLE-3, {_CAPTURE_WORDS[x['capture']]}, k={x['k']}"
    )
    s += {"off": ", MLA verify opted out", "on": ", MLA verify forced"}.get(x["mla_verify"], "")
    s += ("" if x.get("check", True) else ", check off") + (", compiled" if x["compiled"] else "")
    s += {
        1: " (choosing k, light load)",
        2: " (choosing k, loaded)",
        3: " (judged, light load)",
        4: " (judged, loaded)",
    }.get(x.get("stretch", 0), "")
    return s + (f", server #{x['replica']}" if x["replica"] > 1 else "")


def style(i: int) -> dict:
    """Series ``i``'s colour, marker and line: 10 colours x 7 markers (coprime: 70 distinct), dashed past 10."""
    return {"color": f"C{i % 10}", "marker": "os^Dv<>"[i % 7], "linestyle": "-" if i < 10 else "--"}
