"""The adaptive-k section of ``BENCHMARKS.md`` (``--plan adaptive``) and its tok/s plot: ``analysis.adaptive``'s
rows against no speculation and the best static k, formatted, and how they were measured; the shipped default's
section (``--plan shipped``: ``analysis.shipped``'s rows against its bar, :data:`BAR_TEXT`), on its page and per host
kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from vllm_eagle3 import live_k_start
from vllm_eagle3.tools.bench import live_cells
from vllm_eagle3.tools.bench.analysis import summarize
from vllm_eagle3.tools.bench.cells_text import fmt_estimate, fmt_number, pyplot, style, table, variants_with
from vllm_eagle3.tools.bench.plan import LIGHT_MAX, Variant
from vllm_eagle3.tools.machine import backend_label

TEMPLATE = Path(__file__).with_name("template_adaptive.md")  # the section's method paragraph, in prose


def adaptive_block(summary: Mapping, run: str = "", backend: str = "") -> str:
    """Speculation that adapts to load (plan ``adaptive``), with its heading (naming ``backend``: the attention
    backend and dtype served); empty for a run without an adaptive server."""
    if not (rows := summary.get("adaptive")):
        return ""
    ad = next(v for v in summary["variants"] if v["variant"].get("adaptive"))
    k3 = {
        c: r
        for v in variants_with(
            summary, capture="embed", k=3, replica=1, mla_verify="default", check=True, adaptive=False
        )
        for c, r in v["by_concurrency"].items()
    }

    def same(x) -> str:
        return f"{x[0]}/{x[1]}" if x else "n/a"

    def servers(o) -> str:
        n, same_k = o.get("servers") or [1, 1], o["k"] == o.get("best_static_k")
        if n == [1, 1]:
            return " (same k: two servers)" if same_k else ""
        return f" ({'same k, ' if same_k else ''}{n[0]} + {n[1]} servers)"

    table_rows = []
    for o in rows:
        c = str(o["concurrency"])
        kr = k3.get(c, {})
        table_rows.append(
            [
                c,
                fmt_number(o["nospec_tok_s"], 1),
                fmt_estimate(o.get("k3_speedup")),
                f"k={o.get('best_static_k', 'n/a')}: {fmt_estimate(o.get('best_static_speedup'))}",
                f"k={o['k']}: **{fmt_estimate(o['speedup'])}**",
                fmt_estimate(o.get("vs_best_static"))
                + servers(o)
                + ("" if o.get("best_static_side_by_side", True) else " (not side by side)"),
                " ; ".join(
                    fmt_estimate(o.get("same_config", {}).get(x)) if x in o.get("same_config", {}) else "one server"
                    for x in ("adaptive", "best_static")
                ),
                "yes" if o["never_slower"] else "**no**",
                "yes" if o["within_best"] else "**no**",
                fmt_estimate(kr.get("break_even")),
                fmt_number(kr.get("model_verify")),
                fmt_number(kr.get("ideal")),
                same(o.get("same_text"))
                + " (static: "
                + (", ".join(f"k={k} {same(x)}" for k, x in sorted((o.get("static_same_text") or {}).items())) or "n/a")
                + ")",
                fmt_estimate(o.get("nospec_drift"), 3),
            ]
        )
    tau: dict[int, Any] = {}  # the light stretch's (per-request intervals at concurrency 1) where a k has both
    for v in variants_with(summary, capture="embed", replica=1, mla_verify="default", check=True, adaptive=False):
        tau.setdefault(v["variant"]["k"], (v.get("acceptance") or {}).get("tau"))
    replicas = max((o.get("servers") or [1])[0] for o in rows)
    turns1 = next((o.get("turns") for o in rows if o["concurrency"] == 1), None) or 4
    light = any(o["concurrency"] <= LIGHT_MAX for o in rows)  # only the light stretch has replicas
    if not (
        any(o.get("side_by_side") for o in rows)
        and any(o.get("chosen_side_by_side") for o in rows)  # planned
        and (not light or any(v["variant"]["replica"] > 1 for v in summary["variants"] if v["variant"]["adaptive"]))
    ):
        raise ValueError(
            "an adaptive results file from before the judging stretches had replicas (servers run one "
            "at a time, or one server per configuration): render it with the commit that wrote it "
            "(its meta.machine.commit)"
        )
    return "\n\n".join(
        [
            x
            for x in [
                "### Speculation that adapts to load: k per batch size" + (f" ({backend})" if backend else ""),
                run,
                " ".join(TEMPLATE.read_text().split("-->", 1)[1].split())
                .replace("{{label}}", ad["label"])
                .replace("{{turns1}}", str(turns1))
                .replace("{{replicas}}", str(replicas)),
                table(
                    [
                        "conc.",
                        "no spec tok/s",
                        "k=3",
                        "best static k",
                        "adaptive",
                        "adaptive / best",
                        "identical servers #1 / #2",
                        ">= 1.0x (lower end)",
                        "within 10 % of best",
                        "break-even tau (k=3)",
                        "tau/(v+kc) (k=3)",
                        "tau/(1+kc) (k=3)",
                        "greedy same",
                        "no spec #2 / #1",
                    ],
                    table_rows,
                ),
                "Acceptance length per static k (concurrency-1 requests): "
                + ", ".join(f"k={k} {fmt_estimate(t)}" for k, t in sorted(tau.items()))
                + ".",
            ]
            if x
        ]
    )


SHIPPED_GLOB = "bench/shipped-*/results.json"
BAR_TEXT = (
    "Issue 41's bar: the shipped default (`configs/serve_kimi_k25_mini.yaml` as it is: its k, its table, "
    "`live_k`) at >= 1.00x no speculation (95 % lower end >= 0.97x) at every concurrency, >= 2.0x at "
    "concurrency 1, greedy output identical; side by side in turns on `bench/heldout_prompts.json`."
)


LIVE_K_TEXT = (
    "Live k: the k that the shipped server's bucket holding the cell's concurrency ended on, and how many times live "
    "k changed a bucket's k during the cell (`k 5->4`: it started the cell at 5), read from `GET /v1/eagle3/wiring` "
    "after each cell; each cell's whole report is in the run's `results.json` (`live_k` of the cell). *not "
    "recorded*: a run from before results files kept it."
)


def host_kind(m: Mapping) -> tuple[str, str]:
    """A results file's machine as a host kind (CPU model + its widest vector ISA) and its slug:
    ``("AMD EPYC, AVX-512", "amd-epyc-avx512")`` (:func:`vllm_eagle3.live_k_start.host_kind`, which the engine uses
    to find this host kind's start table)."""
    return live_k_start.host_kind(str(m.get("cpu", "?")), str(m.get("flags", "")).split(), bool(m.get("emulated")))


def counts_as_host_kind(m: Mapping) -> bool:
    """Whether a results file's machine is a host kind: a run under ``vllm-eagle3 emulate`` is not (its cores are
    another kind's; docs/adaptive-k.md), whatever its cells measured."""
    return not m.get("emulated")


EMULATED = "**emulated: does not count** as a host kind"


def _verdict(rows: Sequence[Mapping], machine: Mapping | None = None) -> str:
    """``**meets it**`` / ``**misses it**: c=...``; an emulated run's says so first (:func:`counts_as_host_kind`)."""
    misses = [f"c={o['concurrency']} ({', '.join(o['misses'])})" for o in rows if o["misses"]]
    bar = "**meets it**" if rows and not misses else "**misses it**: " + "; ".join(misses or ["no cell"])
    if machine is not None and not counts_as_host_kind(machine):
        return f"{EMULATED} (its cells: {bar.replace('**', '')})"
    return bar


def _live_k(o: Mapping) -> str:
    """A shipped row's live k, one entry per server (``live_cells.text``)."""
    return " ; ".join(live_cells.text(x) for x in o.get("live_k") or [live_cells.NOT_RECORDED])


def _live_k_run(rows: Sequence[Mapping]) -> str:
    """A run's live k per cell for the host-kind table: ``c=32 k=2 (0 changes)``, or ``not recorded`` (a run from
    before results kept live k's report)."""
    if all(x == live_cells.NOT_RECORDED for o in rows for x in o.get("live_k") or [live_cells.NOT_RECORDED]):
        return live_cells.NOT_RECORDED
    return ", ".join(f"c={o['concurrency']} {_live_k(o)}" for o in rows)


def shipped_block(summary: Mapping, run: str, machine: Mapping) -> str:
    """A ``--plan shipped`` run's own section: per concurrency against the bar; empty for other runs."""
    if not (rows := summary.get("shipped")):
        return ""
    return "\n\n".join(
        [
            f"## The shipped default against no speculation ({host_kind(machine)[0]})",
            run,
            BAR_TEXT + " Speculating: " + next(v["label"] for v in summary["variants"] if v["variant"]["live"]) + ".",
            table(
                [
                    "conc.",
                    "servers",
                    "no spec tok/s",
                    "shipped tok/s",
                    "shipped / no spec",
                    "greedy same",
                    "acceptance length",
                    "live k at the end (changes in the cell)",
                    "bar",
                ],
                [
                    [
                        str(o["concurrency"]),
                        str(o["servers"]),
                        fmt_number(o["nospec_tok_s"], 1),
                        fmt_number(o["tok_s"], 1),
                        f"**{fmt_estimate(o['speedup'])}**",
                        "%d/%d" % tuple(o["same_text"]) if o["same_text"] else "n/a",
                        fmt_number(o["tau"]),
                        _live_k(o),
                        "yes" if not o["misses"] else "**no**: " + ", ".join(o["misses"]),
                    ]
                    for o in rows
                ],
            ),
            LIVE_K_TEXT,
            "Verdict: " + _verdict(rows, machine) + ".",
        ]
    )


def shipped_repo_block(runs: Sequence[Mapping]) -> str:
    """The repository page's section: one row per ``bench/shipped-*/results.json``."""
    head = "## The shipped default on each host kind"
    how = (
        "`vllm-eagle3 bench --plan shipped` (alone on the machine; `--dry-run` prints its estimate) writes "
        "`bench/shipped-<host kind>/` for the machine it runs on (AVX2 emulated: `vllm-eagle3 emulate avx2`)."
    )
    if not runs:
        return "\n\n".join([head, BAR_TEXT, "_No run on any host kind yet: " + how + "_"])
    rows = [(d, summarize(d)["shipped"]) for d in runs]
    rows.sort(key=lambda x: not counts_as_host_kind(x[0]["meta"]["machine"]))  # emulated rows last
    cs = sorted({o["concurrency"] for _, r in rows for o in r})
    kinds = [(host_kind(d["meta"]["machine"])[0], r) for d, r in rows if counts_as_host_kind(d["meta"]["machine"])]
    met = [k for k, r in kinds if _verdict(r) == "**meets it**"]
    emulated = [host_kind(d["meta"]["machine"])[0] for d, _ in rows if not counts_as_host_kind(d["meta"]["machine"])]
    return "\n\n".join(
        [
            head,
            BAR_TEXT + " " + how,
            table(
                ["host kind", "date", "commit"]
                + [f"c={c}" for c in cs]
                + ["verdict", "live k at the end of each cell (changes in the cell)"],
                [
                    [host_kind(d["meta"]["machine"])[0], d["meta"]["date"], d["meta"]["machine"]["commit"]]
                    + [fmt_estimate(next((o["speedup"] for o in r if o["concurrency"] == c), None)) for c in cs]
                    + [_verdict(r, d["meta"]["machine"]), _live_k_run(r)]
                    for d, r in rows
                ],
            ),
            f"Host kinds that meet the bar: {len(met)} of {len(kinds)}"
            + (f" ({'; '.join(met)})" if met else "")
            + (
                f". Emulated, not counted: {len(emulated)} ({'; '.join(emulated)}): an emulated ISA runs on the cores "
                "of another host kind ([docs/adaptive-k.md](docs/adaptive-k.md))."
                if emulated
                else "."
            ),
            LIVE_K_TEXT,
        ]
    )


def plot_tok_s(data: Mapping, path: Path) -> bool:
    """tok/s against concurrency per static k (the choosing stretches) and of the adaptive server (its judging
    stretch), and each over its stretch's no-speculation server: where each k wins. False for a run without an
    adaptive server, or without matplotlib (one line said)."""
    s = summarize(data)
    if not s.get("adaptive") or (plt := pyplot(str(path))) is None:
        return False
    series: dict[str, dict[int, tuple[float, float]]] = {}  # name -> concurrency -> (tok/s, over no speculation)
    for v in (v for v in s["variants"] if Variant.from_dict(v["variant"]).chooses_k):
        base = {
            c: r["tok_s"]["value"]
            for b in variants_with(s, k=0, stretch=v["variant"]["stretch"])
            for c, r in b["by_concurrency"].items()
            if "tok_s" in r
        }
        for c, r in ((c, r) for c, r in v["by_concurrency"].items() if "tok_s" in r):
            name = f"k={v['variant']['k']}" if v["variant"]["k"] else "no speculation"
            series.setdefault(name, {})[int(c)] = (r["tok_s"]["value"], r["tok_s"]["value"] / base[c])
    table = ", ".join(f"{o['concurrency']}: {o['k']}" for o in s["adaptive"])
    series[f"adaptive: k per batch size (k at c: {table})"] = {
        o["concurrency"]: (o["tok_s"], o["speedup"]["value"]) for o in s["adaptive"]
    }
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for i, (name, pts) in enumerate(sorted(series.items(), key=lambda kv: (kv[0][0] != "n", kv[0]))):
        cs = sorted(pts)
        for ax, j in ((ax1, 0), (ax2, 1)):
            ax.plot(cs, [pts[c][j] for c in cs], label=name, **style(i))
    for ax, label in ((ax1, "tokens per second (all requests)"), (ax2, "throughput / no speculation's")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(s["concurrencies"], [str(c) for c in s["concurrencies"]])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.legend(fontsize=7)
    fig.suptitle(
        f"EAGLE-3 k per batch size vs static k ({backend_label(data['meta'])}), {data['meta']['date']}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
