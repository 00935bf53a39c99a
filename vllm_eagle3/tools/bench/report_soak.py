"""The soak section of ``BENCHMARKS.md``: the last published ``vllm-eagle3 soak`` result (``bench/soak.json``, written
by ``soak --publish``) as a sentence, a table, each check's verdict and the link to its memory plot.
"""

from __future__ import annotations

from typing import Mapping

from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.bench.cells_text import fmt_number, table

SOAK_RSS_PNG = "bench/soak_rss.png"  # the published soak's plot of resident memory per process over time
NO_SOAK = "_No soak result yet: run `vllm-eagle3 soak --publish` (see above)._"


def soak_block(soak: Mapping | None) -> str:
    """The last ``vllm-eagle3 soak`` result (``bench/soak.json``): what ran, what came back, each check's verdict."""
    if not soak:
        return NO_SOAK
    statuses = ", ".join(f"{n} x {s}" for s, n in sorted(soak["by_status"].items()))
    refusals = "; ".join(f'{n} x "{r}"' for r, n in sorted(soak["refusals_4xx"].items(), key=lambda x: -x[1]))
    rss = soak.get("rss_mb_first_last") or ["n/a", "n/a"]
    checks = ", ".join(f"{k.replace('_', ' ')} {'yes' if ok else '**NO**'}" for k, ok in soak["verdict"].items())
    lines = [
        f"**Soak of {soak['date_utc']} UTC**: `vllm-eagle3 soak`, {soak['concurrency']} concurrent clients for "
        f"{soak['duration_s']:.0f} s after {soak['warmup_s']:.0f} s of warm-up; machine {soak['machine']}"
        + (f", load average {soak['load_before']} before" if soak.get("load_before") else "")
        + (f"; commit {soak['commit']}" if soak.get("commit") else "")
        + (" with uncommitted changes" if soak.get("dirty") == "yes" else "")
        + ".",
        "",
        table(
            [
                "requests",
                "answers",
                "transport errors",
                "streams cut by the client",
                "completion tokens",
                "resident memory after warm-up, first -> last (MiB)",
                "growth (limit)",
                "acceptance length",
                "verdict",
            ],
            [
                [
                    str(soak["requests"]),
                    statuses,
                    str(soak["transport_errors"]),
                    str(soak["early_disconnects"]),
                    str(soak["completion_tokens"]),
                    f"{fmt_number(rss[0], 0)} -> {fmt_number(rss[1], 0)}",
                    f"{fmt_number(soak['rss_growth_mb'], 0)} MiB ({fmt_number(soak['max_growth_mb'], 0)})",
                    fmt_number(soak["acceptance_length"]),
                    "**passed**" if soak["passed"] else "**FAILED**",
                ]
            ],
        ),
        "",
        f"Checks: {checks}.",
    ]
    grew = soak.get("rss_mb_by_process_first_last")
    if grew:
        first, last = grew
        lines += [
            "",
            "Resident memory per process, first -> last sample after warm-up (MiB): "
            + ", ".join(
                f"{k.split(' ', 1)[-1]} {fmt_number(first.get(k), 0)} -> {fmt_number(last.get(k), 0)}"
                for k in sorted(
                    set(first) | set(last), key=lambda k: int(k.split()[0]) if k.split()[0].isdigit() else 0
                )
            )
            + ".",
        ]
    if soak.get("rss_mb_series") and (REPO / SOAK_RSS_PNG).exists():
        lines += ["", f"![resident memory per process during the soak]({SOAK_RSS_PNG})"]
    if refusals:
        lines += ["", f"4xx answers (vLLM's refusals, by reason): {refusals}."]
    if soak.get("first_errors"):
        lines += ["", "First errors:", "", *(f"- `{x}`" for x in soak["first_errors"])]
    return "\n".join(lines)
