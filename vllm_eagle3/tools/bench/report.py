"""``BENCHMARKS.md``, ``docs/bench.png`` and the printed advice, from the results file: ``template.md`` (the
method in prose, no measured number) with its ``{{...}}`` slots filled from :func:`~.analysis.summarize`, so
``tests/unit/test_docs_numbers.py`` can check the committed page is that rendering. No statistic is computed here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping, Sequence

from vllm_eagle3.tools.bench import live_cells
from vllm_eagle3.tools.bench.analysis import summarize
from vllm_eagle3.tools.bench.cells_text import fmt_estimate, fmt_number, legend, per_server, pyplot, same_config
from vllm_eagle3.tools.bench.cells_text import style, table, variants_with
from vllm_eagle3.tools.bench.plan import SGLANG_DEFAULT_WIRING
from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.bench.report_adaptive import SHIPPED_GLOB, adaptive_block, shipped_block, shipped_repo_block
from vllm_eagle3.tools.bench.stats import Estimate, finite
from vllm_eagle3.tools.machine import backend_label

TEMPLATE = Path(__file__).with_name("template.md")
SLOT = re.compile(r"\{\{(\w+)\}\}")
NO_RUN = "_No run of this benchmark yet: run `make bench` (see above)._"
NO_ADAPTIVE = "_No adaptive-k run yet: run `vllm-eagle3 bench --plan adaptive --out-dir bench/adaptive`._"


def run_block(meta: Mapping, plan: Mapping) -> str:
    m, waves = meta["machine"], plan.get("waves", 1)
    requests = (
        f"{plan['prompts']}"
        if waves == 1
        else f"max({plan['prompts']}, {waves} x C) (C in flight, refilled as requests finish)"
    )
    return (
        f"**Run of {meta['date']}**: `{meta['command']}`, plan `{plan['name']}`, {meta['duration_min']:.1f} min; "
        f"load average {meta['load_before']} before, {meta['load_after']} after. Machine: {m['cpu']}, "
        f"{m['nproc']} cores, {m['memory']} ({m.get('emulated', m['flags'])}); Python {m['python']}, torch "
        f"{m['torch']}, vLLM {m['vllm']}, openai {m['openai']}; commit {m['commit']}"
        f"{' with uncommitted changes' if m.get('dirty') == 'yes' else ''}. Cells: {requests} different "
        f"prompts x {plan['max_tokens']} output tokens per throughput cell ({plan.get('rounds', 1)} round(s)); "
        f"timed cells max(C, 4) requests x {plan['split_tokens']} tokens; streaming cell "
        f"{plan['stream_prompts']} requests. Values: estimate [95 % interval]."
    )


def headline(summary: Mapping) -> str:
    rows = []
    for mode in (False, True):
        base = variants_with(summary, k=0, compiled=mode, replica=1, mla_verify="default")
        spec = (
            variants_with(summary, capture="embed", compiled=mode, replica=1, mla_verify="default", check=True)
            if base
            else []
        )
        for v in spec:
            for c, row in ((c, row) for c, row in v["by_concurrency"].items() if "speedup" in row):
                b = base[0]["by_concurrency"].get(c, {})
                rows.append(
                    [
                        ("compiled" if mode else "eager"),
                        c,
                        str(v["variant"]["k"]),
                        fmt_estimate(b.get("tok_s"), 1),
                        fmt_estimate(row.get("tok_s"), 1),
                        f"**{fmt_estimate(row['speedup'])}**",
                        fmt_estimate(v["acceptance"]["tau"]),
                        fmt_estimate(row.get("break_even")),
                        fmt_number(row.get("ideal")),
                        fmt_number(row.get("model_verify")),
                        "%d/%d" % tuple(row["same_text"]) if "same_text" in row else "-",
                    ]
                )
    return table(
        [
            "mode",
            "conc.",
            "k",
            "tok/s no spec",
            "tok/s EAGLE-3",
            "speedup",
            "acceptance length tau",
            "break-even tau",
            "ideal tau/(1+kc)",
            "tau/(v+kc)",
            "greedy text = no spec",
        ],
        rows,
    )


def advice_block(summary: Mapping) -> str:
    lines = []
    for a in summary["advice"]:
        tau, be = Estimate.from_dict(a.get("tau")), Estimate.from_dict(a.get("break_even"))
        sp = fmt_estimate(a.get("speedup"))
        if a["mode"] == SGLANG_DEFAULT_WIRING:
            lines.append(
                f"- incident wiring (`{a['key']}`), concurrency {a['concurrency']}: acceptance length "
                f"{tau.fmt()} against a break-even of {be.fmt()}: speedup {sp} "
                f"({'throughput cells' if a['speedup_source'] == 'throughput' else 'timed cells'}); "
                + (
                    "speculation loses, as in the incident's 56.8 vs 90 tok/s."
                    if finite(tau.value) and finite(be.value) and tau.value < be.value
                    else "see the tables."
                )
            )
        elif a.get("missing_base"):
            lines.append(
                f"- {a['mode']}, concurrency {a['concurrency']}: no advice: the no-speculation server of "
                "this mode was not measured (see the failed variants)"
            )
        else:
            ks = ", ".join(map(str, a["measured_k"]))
            what = (
                f"**do not speculate** (no speculation was fastest among k = {ks})"
                if a["best_k"] == 0
                else f"**k = {a['best_k']}** (fastest among k = {ks}: {fmt_number(a['best_tok_s'], 1)} tok/s)"
            )
            lines.append(
                f"- {a['mode']}, concurrency {a['concurrency']}: {what}; acceptance length {tau.fmt()}, "
                f"break-even {be.fmt()} (speculation loses below it); ideal speedup {fmt_number(a.get('ideal'))}, "
                f"verify-aware {fmt_number(a.get('model_verify'))}, achieved {sp}."
            )
    return "\n".join(lines) or "_no advice: the run has no throughput cells with and without speculation_"


def all_cells(summary: Mapping) -> str:
    rows = []
    for v in summary["variants"]:
        acc = v.get("acceptance") or {}
        pp = ", ".join(f"{p:.2f}" for p in acc.get("per_position", [])) or "-"
        for c, row in ((c, row) for c, row in v["by_concurrency"].items() if "tok_s" in row or "speedup_timed" in row):
            rows.append(
                [
                    v["label"] + (f" (ERROR: {v['error']})" if v["error"] else ""),
                    c,
                    fmt_estimate(row.get("tok_s"), 1),
                    fmt_number(row.get("latency_ms"), 0),
                    fmt_number(row.get("ms_per_token"), 1),
                    fmt_estimate(row.get("speedup")),
                    fmt_estimate(row.get("speedup_timed")),
                    fmt_estimate(acc.get("tau")) if v["variant"]["k"] else "-",
                    pp,
                    "decode kernel" if v["mla_verify_on_decode_kernel"] else "vLLM's own" if v["variant"]["k"] else "-",
                    live_cells.text(row.get("live_k")) if "tok_s" in row else "-",
                ]
            )
    failed = [f"**Failed:** {v['key']}: {v['error']}" for v in summary["variants"] if v["error"]]
    failed += [f"**Not started:** {v['key']}: {v['skipped']}" for v in summary["variants"] if v.get("skipped")]
    return "\n\n".join(
        failed
        + [
            table(
                [
                    "variant",
                    "conc.",
                    "tok/s",
                    "latency ms (median)",
                    "ms per token (median)",
                    "speedup",
                    "speedup, timed cells",
                    "tau",
                    "per-position acceptance",
                    "MLA verify ran on",
                    "live k at the end (changes in the cell)",
                ],
                rows,
            )
        ]
    )


def split_block(summary: Mapping) -> str:
    rows = [
        [
            v["label"],
            c,
            str(s["steps"]),
            fmt_estimate(s["forward_ms"], 1),
            fmt_estimate(s["draft_ms"], 1),
            fmt_number(s["rest_ms"], 1),
            fmt_estimate(s["step_ms"], 1),
            fmt_number(row.get("c"), 3),
            fmt_number(row.get("v")),
        ]
        for v in summary["variants"]
        for c, row in v["by_concurrency"].items()
        if (s := row.get("split")) and s.get("steps")
    ]
    return table(
        ["variant", "conc.", "decode steps", "target forward (verify) ms", "draft ms", "rest ms", "step ms", "c", "v"],
        rows,
    )


AB_NAMES = {
    "layers": "second head, taps 3/31/59: plugin spec vs native",
    "embed": "shipped head: embed tap (plugin) vs 3/31/59 native (the incident: other acceptance)",
}


def capture_block(summary: Mapping) -> str:
    head = ["comparison", "k", "conc."]
    rows = [
        [
            AB_NAMES[o["plugin"]],
            str(o["k"]),
            str(o["concurrency"]),
            per_server(o["plugin_forward_ms"]),
            per_server(o["native_forward_ms"]),
            f"**{fmt_estimate(o['ratio'], 3)}**",
            same_config(o["same_config_ratios"]),
            per_server(o["tau"], 2),
            o["verdict"],
        ]
        for o in summary["capture_ab"]
    ]
    if not rows:
        return "_not measured in this run_"
    out = table(
        head
        + [
            "target forward ms, plugin capture (per server)",
            "native (per server)",
            "plugin / native",
            "same configuration: server 1 / server 2 (plugin ; native)",
            "tau plugin / native",
            "verdict",
        ],
        rows,
    )
    norm = [
        [
            AB_NAMES[o["plugin"]],
            str(o["k"]),
            str(o["concurrency"]),
            per_server(nz["plugin"], 2),
            per_server(nz["native"], 2),
            f"**{fmt_estimate(nz['ratio'], 3)}**",
            same_config(nz["same_config_ratios"]),
            nz["verdict"],
        ]
        for o in summary["capture_ab"]
        if (nz := o.get("normalized"))
    ]
    if norm:
        out += (
            "\n\nThe same steps, target forward per millisecond of draft (per step: forward ms / draft ms). The "
            "draft does the same work on both sides of the fair pair (same head, same tokens), so this cancels "
            "each server process's own speed on the shared machine and leaves the capture's cost:\n\n"
        )
        out += table(
            head
            + [
                "forward / draft, plugin capture (per server)",
                "native (per server)",
                "plugin / native",
                "same configuration: server 1 / server 2 (plugin ; native)",
                "verdict",
            ],
            norm,
        )
    return out


def check_block(summary: Mapping) -> str:
    """The online wiring check's cost (plan ``check``), with its heading; empty for a run without check-off
    servers, so that a headline run's page has no such section."""
    rows = [
        [
            o["config"],
            o["mode"],
            str(o["concurrency"]),
            per_server(o["on_tok_s"]),
            per_server(o["off_tok_s"]),
            f"**{fmt_estimate(o['ratio'], 3)}**",
            same_config(o["same_config_ratios"]),
            o["verdict"],
        ]
        for o in summary["check_cost"]
    ]
    if not rows:
        return ""
    logged = [
        f"- {v['key']}: " + (f"`{v['check_line']}`" if v["check_line"] else "_no wiring check line in its log_")
        for v in summary["variants"]
        if v["variant"]["k"] and v["variant"]["capture"] == "embed"
    ]
    return "\n\n".join(
        [
            "### What the online wiring check costs",
            "The same speculating server with the check on (as shipped) and off (its capture spec plus `check: "
            "{enabled: false}`), the same prompts: throughput with / without the check, paired over prompts, each "
            "side's servers pooled (below 1: the server is slower with the check), next to the same ratio between two "
            "servers of one side (the server-to-server noise of this machine).",
            table(
                [
                    "configuration",
                    "mode",
                    "conc.",
                    "tok/s, check on (per server)",
                    "check off (per server)",
                    "check on / off",
                    "same configuration: server 1 / server 2 (on ; off)",
                    "verdict",
                ],
                rows,
            ),
            "What each server's check did, from its log:\n\n" + "\n".join(logged),
        ]
    )


def costs_block(summary: Mapping) -> str:
    rows = []
    for v in summary["variants"]:
        rows += [
            [
                v["label"],
                f"worker timers, concurrency {c}",
                f"tok/s timed / untimed = {fmt_estimate(row['timer_cost'], 3)}",
            ]
            for c, row in v["by_concurrency"].items()
            if "timer_cost" in row
        ]
        if s := v.get("stream"):
            rows.append(
                [
                    v["label"],
                    "streaming client, concurrency 1",
                    f"tok/s streamed / plain = "
                    f"{fmt_estimate(s['cost'], 3)}; TTFT {fmt_number(s['ttft_ms'], 0)} ms, "
                    f"ITL {fmt_number(s['itl_ms'], 1)} ms (median)",
                ]
            )
    return table(["variant", "measurement", "cost (same requests)"], rows) if rows else "_not measured_"


def capture_lines(summary: Mapping) -> str:
    return (
        "\n".join(f"- {v['key']}: `{v['capture_line']}`" for v in summary["variants"] if v["capture_line"]) or "_none_"
    )


def render(
    data: Mapping | None,
    png_rel: str | None = "docs/bench.png",
    template: Path = TEMPLATE,
    soak: str = "",
    adaptive_runs: Sequence[Mapping] | None = None,
) -> str:
    """The whole ``BENCHMARKS.md``: the template's slots filled from the results (or the no-run note), ``soak``
    (``report_soak.soak_block``), the plot's link unless ``png_rel`` is None, and on the repository's page the last
    ``--plan adaptive`` results of each backend (``adaptive_runs``; None: another page)."""
    text = template.read_text()
    if data is None:
        slots = {name: NO_RUN if name == "run" else "" for name in set(SLOT.findall(text))}
    else:
        s = summarize(data)
        slots = {
            "run": run_block(data["meta"], data["plan"]),
            "headline": headline(s),
            "advice": advice_block(s),
            "cells": all_cells(s),
            "split": split_block(s),
            "capture": capture_block(s),
            "check": check_block(s),
            "costs": costs_block(s),
            "capture_lines": capture_lines(s),
            "plot": f"![benchmark plot]({png_rel})" if png_rel else "",
        }
    # another page: a results file of the adaptive plan renders its own section
    runs = (
        [(a, summarize(a)) for a in adaptive_runs]
        if adaptive_runs is not None
        else [(data, s)]
        if data is not None
        else []
    )
    block = "\n\n".join(
        b
        for b in (adaptive_block(sa, run_block(a["meta"], a["plan"]), backend_label(a["meta"])) for a, sa in runs)
        if b
    )
    # the repository's page says when there is no adaptive run yet; other runs' pages say nothing
    slots["soak"], slots["adaptive"] = soak, block or (NO_ADAPTIVE if adaptive_runs == [] else "")
    slots["shipped"] = (
        shipped_repo_block([load(p) for p in sorted(REPO.glob(SHIPPED_GLOB))])
        if adaptive_runs is not None
        else ""
        if data is None
        else shipped_block(s, run_block(data["meta"], data["plan"]), data["meta"]["machine"])
    )
    if missing := set(SLOT.findall(text)) - set(slots):
        raise KeyError(f"template {template} has slots the report does not fill: {sorted(missing)}")
    return re.sub(r"\n{3,}", "\n\n", SLOT.sub(lambda m: slots[m.group(1)], text))


def printed_advice(data: Mapping) -> str:
    s = summarize(data)
    return "\n".join(
        [
            "",
            "=== vllm-eagle3 bench: advice ===",
            advice_block(s),
            "",
            "=== headline ===",
            headline(s),
            "",
            "=== plugin capture vs native capture ===",
            capture_block(s),
            "",
            check_block(s),
            "",
        ]
    )


def plot(data: Mapping, path: Path) -> bool:
    """Speedup with intervals per concurrency (eager, compiled, opt-out, SGLang default wiring) and the
    per-step split. False (one line said) without matplotlib, or with nothing to draw (e.g. plan ``check``: no
    no-speculation server, no timed cell): then the page links no plot."""
    s = summarize(data)
    if not any(
        r.get(x)
        for v in s["variants"]
        for r in v["by_concurrency"].values()
        if v["variant"]["k"]
        for x in ("speedup", "speedup_timed", "split")
    ):
        print(f"[plot] {path} not drawn: no speedup and no timed cell in this run")
        return False
    if (plt := pyplot(str(path))) is None:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for i, v in enumerate(x for x in s["variants"] if x["variant"]["k"] and x["variant"]["replica"] == 1):
        pts = [
            (int(c), Estimate.from_dict(d))
            for c, r in v["by_concurrency"].items()
            if (d := r.get("speedup") or r.get("speedup_timed"))
        ]
        err = [
            [max(p.value - p.lo, 0) if finite(p.lo) else 0 for _, p in pts],
            [max(p.hi - p.value, 0) if finite(p.hi) else 0 for _, p in pts],
        ]
        if pts:  # each series a little right of the one before: the intervals side by side
            ax1.errorbar(
                [c * (1 + 0.04 * i) for c, _ in pts],
                [p.value for _, p in pts],
                yerr=err,
                capsize=3,
                label=legend(v["variant"]),
                **style(i),
            )
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(s["concurrencies"], [str(c) for c in s["concurrencies"]])
    ax1.set_xlabel("concurrency (speedup from the throughput cells; timed cells where a variant has none)")
    ax1.set_ylabel("speedup over no speculation (95 % interval)")
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend(fontsize=6)
    bars = [
        (f"{legend(v['variant'])}\nc={c}", r["split"])
        for v in s["variants"]
        for c, r in v["by_concurrency"].items()
        if r.get("split", {}).get("steps") and v["variant"]["replica"] == 1
    ]
    if bars:
        xs = range(len(bars))
        fw = [b["forward_ms"]["value"] for _, b in bars]
        dr = [b["draft_ms"]["value"] for _, b in bars]
        rs = [b["rest_ms"] if finite(b["rest_ms"]) else 0 for _, b in bars]
        ax2.bar(xs, fw, label="target forward (verify)")
        ax2.bar(xs, dr, bottom=fw, label="draft")
        ax2.bar(xs, rs, bottom=[a + b for a, b in zip(fw, dr)], label="rest of step")
        ax2.set_xticks(list(xs), [b[0] for b in bars], fontsize=5, rotation=90)
        ax2.set_ylabel("ms per decode step (timed cells)")
        ax2.legend(fontsize=7)
    fig.suptitle(f"vllm-eagle3 bench, {data['meta']['date']}, commit {data['meta']['machine']['commit']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def load_json(path: Path) -> dict | None:
    """A results or soak file, or None before the first run."""
    return load(path) if path.exists() else None
