"""Results file -> summary: every number the report prints, each with its 95 % interval where one exists (re-run
on every render). Pairing: every variant runs the same prompts, so a speedup resamples *prompts*, each prompt's two
measurements together (:func:`~.stats.paired_ratio`). Seconds: the requests' own latencies at concurrency 1; at C > 1
the cell's wall clock, its interval that of the per-request latencies scaled to it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from vllm_eagle3.tools.bench import live_cells
from vllm_eagle3.tools.bench.client import RequestRecord
from vllm_eagle3.tools.bench.plan import AB_PAIRS, MLA_DEFAULT, NATIVE, SGLANG_DEFAULT_WIRING, Variant, k_at
from vllm_eagle3.tools.bench.stats import (
    NAN,
    NONE,
    Estimate,
    bootstrap,
    cost_ratio,
    finite,
    ideal_speedup,
    mean,
    mean_ci,
    median,
    paired_ratio,
    ratio_of_sums,
    stratified_ratio,
)
from vllm_eagle3.tools.bench.timers import StepSplit


class Results:
    """Read access to one results file (schema 2)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        if data.get("schema") != 2:
            raise ValueError(
                f"results file schema {data.get('schema')!r} is not 2: it was written by an older "
                "`vllm-eagle3 bench`; re-run the benchmark (make bench) to get one this code reads"
            )
        self.variants = [(Variant.from_dict(v["variant"]), v) for v in data["variants"]]

    def find(self, **want) -> list[tuple[Variant, dict]]:
        return [(v, raw) for v, raw in self.variants if all(getattr(v, k) == x for k, x in want.items())]

    def base(self, v: Variant) -> dict | None:
        """The no-speculation server ``v`` is compared with: the one that ran side by side with it (same stretch),
        else the first one run alone."""
        b = self.find(k=0, compiled=v.compiled, stretch=v.stretch, mla_verify=MLA_DEFAULT) if v.stretch else []
        b = b or self.find(k=0, compiled=v.compiled, replica=1, stretch=0, mla_verify=MLA_DEFAULT)
        return b[0][1] if b else None


def cells(raw: Mapping, kind: str, c: int) -> list[dict]:
    return [x for x in raw.get("cells", []) if x["kind"] == kind and x["concurrency"] == c]


def requests(cs: Sequence[Mapping]) -> list[RequestRecord]:
    return [RequestRecord.from_dict(r) for x in cs for r in x["requests"]]


def by_server(servers: Sequence[tuple[Variant, Mapping]], c: int) -> list[list[dict]]:
    """Each server's throughput cells at concurrency ``c`` (servers without one left out), in the given order: the
    replicas of one configuration, pooled by :func:`pooled` and compared with each other."""
    return [cs for _, raw in servers if (cs := cells(raw, "throughput", c))]


def pooled(per_server: Sequence[Sequence[dict]]) -> list[dict]:
    """The servers' cells as one: every statistic here sums tokens and seconds over the cells it is given."""
    return [x for cs in per_server for x in cs]


def per_prompt(cs: Sequence[Mapping]) -> dict[int, tuple[float, float]]:
    """prompt -> (tokens, seconds) summed over the cells (those of pooled servers too)."""
    out: dict[int, tuple[float, float]] = {}
    for r in requests(cs):
        t, s = out.get(r.prompt, (0.0, 0.0))
        out[r.prompt] = (t + r.tokens, s + r.latency_s)
    return out


def wall_tok_s(cs: Sequence[Mapping]) -> float:
    """Tokens / seconds of the cells: the requests' own latencies at concurrency 1 (the client's time between two
    requests left out), the wall clock otherwise."""
    if not cs:
        return NAN
    toks = sum(r.tokens for r in requests(cs))
    secs = sum(r.latency_s for r in requests(cs)) if cs[0]["concurrency"] == 1 else sum(x["wall_s"] for x in cs)
    return toks / secs if secs else NAN


def _scaled(point: float, est: Estimate) -> Estimate:
    f = point / est.value if finite(point) and finite(est.value) and est.value else NAN
    return Estimate(point, est.lo * f, est.hi * f, est.n, est.method)


def throughput(cs: Sequence[Mapping], seed: str) -> Estimate:
    lat = bootstrap(sorted(per_prompt(cs).values()), ratio_of_sums, seed, method="bootstrap over prompts")
    return _scaled(wall_tok_s(cs), lat)


def speedup(cs: Sequence[Mapping], base_cs: Sequence[Mapping], seed: str) -> Estimate:
    """tok/s of ``cs`` / tok/s of ``base_cs`` (same prompts), paired bootstrap over prompts."""
    if not cs or not base_cs:
        return NONE
    est = paired_ratio(per_prompt(cs), per_prompt(base_cs), seed)
    b = wall_tok_s(base_cs)
    return _scaled(wall_tok_s(cs) / b if b else NAN, est)


def acceptance(raw: Mapping, seed: str) -> dict[str, Any]:
    """tau with an interval over requests (concurrency-1 cells with per-request counters) and per-position
    acceptance; else pooled over every cell's counters, without an interval."""
    per_req = [r.counters for r in requests(cells(raw, "throughput", 1)) if r.counters and r.counters[0] > 0]
    if per_req:
        tau = bootstrap(
            [(x[2], x[0]) for x in per_req], lambda r: 1 + ratio_of_sums(r), seed, method="bootstrap over requests"
        )
        pool = per_req
    else:
        pool = [x["counters"] for x in raw.get("cells", []) if x.get("counters") and x["counters"][0] > 0]
        tau = Estimate(1 + sum(x[2] for x in pool) / sum(x[0] for x in pool), method="pooled") if pool else NONE
    drafts = sum(x[0] for x in pool)
    npos = max((len(x[3]) for x in pool), default=0)
    pos = [sum(x[3][i] for x in pool if len(x[3]) > i) / drafts for i in range(npos)] if drafts else []
    return {"tau": tau.as_dict(), "per_position": pos, "drafts": drafts}


def split_summary(raw: Mapping, c: int, seed: str) -> dict[str, Any] | None:
    if not (cs := [x for x in cells(raw, "split", c) if x.get("split")]):
        return None
    sp = StepSplit.from_dict(cs[0]["split"])
    if not sp.steps:
        return {"steps": 0}
    fwd, drf, stp = (
        mean_ci(sp.forward_ms, seed + "/fwd"),
        mean_ci(sp.draft_ms, seed + "/draft"),
        mean_ci(sp.step_ms, seed + "/step"),
    )
    rest = stp.value - fwd.value - drf.value if finite(stp.value) else NAN
    return {
        "steps": sp.steps,
        "forward_ms": fwd.as_dict(),
        "draft_ms": drf.as_dict(),
        "step_ms": stp.as_dict(),
        "rest_ms": max(rest, 0.0) if finite(rest) else NAN,
        "draft_timed": cs[0].get("draft_timed", False),
    }


def step_models(
    v: Variant,
    sp: Mapping | None,
    base_sp: Mapping | None,
    tau: float,
    raw: Mapping,
    base_raw: Mapping,
    c: int,
    seed: str,
) -> dict[str, Any]:
    """c, v, ideal tau/(1+kc), verify-aware tau/(v+kc) and the break-even acceptance length (with its interval:
    the two servers' steps resampled independently)."""
    if not (sp and base_sp and sp.get("steps") and base_sp.get("steps")):
        return {}
    f0 = base_sp["forward_ms"]["value"]
    cc = cost_ratio(sp["draft_ms"]["value"], v.k, f0)
    vf = sp["forward_ms"]["value"] / f0 if f0 else NAN
    spk = StepSplit.from_dict(cells(raw, "split", c)[0]["split"])
    sp0 = StepSplit.from_dict(cells(base_raw, "split", c)[0]["split"])
    be = stratified_ratio([spk.step_ms], [sp0.step_ms], seed + "/break-even")
    return {
        "c": cc,
        "v": vf,
        "ideal": ideal_speedup(tau, v.k, cc) if finite(cc) and finite(tau) else NAN,
        "model_verify": ideal_speedup(tau, v.k, cc, vf) if finite(cc) and finite(vf) and finite(tau) else NAN,
        # the acceptance length below which speculation loses: mean step with spec / without
        "break_even": Estimate(
            be.value, be.lo, be.hi, be.n, "ratio of mean decode-step times, bootstrap over steps"
        ).as_dict(),
    }


def summarize(data: Mapping[str, Any]) -> dict[str, Any]:
    res = Results(data)
    concs = sorted({cell[1] for v in data["plan"]["variants"] for cell in v["cells"]})
    out: dict[str, Any] = {"variants": [], "concurrencies": concs}
    for v, raw in res.variants:
        key, base = v.key, res.base(v)
        acc = acceptance(raw, f"{key}/tau") if v.k else None
        tau = acc["tau"]["value"] if acc else NAN
        rows: dict[str, Any] = {}
        for c in concs:
            row: dict[str, Any] = {}
            thr, spl, unt = (cells(raw, kind, c) for kind in ("throughput", "split", "untimed"))
            bthr, bspl = (cells(base, kind, c) if base is not None else [] for kind in ("throughput", "split"))
            if thr:
                reqs = requests(thr)
                row.update(
                    tok_s=throughput(thr, f"{key}/{c}/tok_s").as_dict(),
                    latency_ms=median([r.latency_s * 1e3 for r in reqs]),
                    ms_per_token=median([r.latency_s * 1e3 / r.tokens for r in reqs if r.tokens]),
                    tokens=sum(r.tokens for r in reqs),
                    prompts=len({r.prompt for r in reqs}),
                    live_k=live_cells.of_cell(thr[-1], v.live),  # live_cells: k at the cell's end, its changes
                )
            if sp := split_summary(raw, c, f"{key}/{c}/split"):
                row["split"] = sp
            if unt and spl:
                row["timer_cost"] = speedup(spl, unt, f"{key}/{c}/timers").as_dict()
            if base is not None and v.k:
                if thr and bthr:
                    row["speedup"] = speedup(thr, bthr, f"{key}/{c}/speedup").as_dict()
                    same = {r.prompt: r.text for r in requests(bthr)}
                    row["same_text"] = [sum(same.get(r.prompt) == r.text for r in reqs), len(reqs)]
                if spl and bspl:
                    row["speedup_timed"] = speedup(spl, bspl, f"{key}/{c}/speedup_timed").as_dict()
                bsp = split_summary(base, c, f"base/{v.mode}/{c}/split")
                row.update(step_models(v, sp, bsp, tau, raw, base, c, f"{key}/{c}"))
            if row:
                rows[str(c)] = row
        entry = {
            "key": key,
            "label": v.label,
            "variant": v.as_dict(),
            "ready_s": raw.get("ready_s"),
            "error": raw.get("error"),
            "skipped": raw.get("skipped"),
            "capture_line": raw.get("capture_line", ""),
            "check_line": raw.get("check_line", ""),
            # the verify-as-decode patch's CALLS["verify"] (timers.bench_mla_calls); zero: vLLM's own path
            "mla_verify_on_decode_kernel": bool((raw.get("mla_calls") or {}).get("verify")),
            "acceptance": acc,
            "by_concurrency": rows,
        }
        if st := cells(raw, "stream", 1):
            sreq = requests(st)
            entry["stream"] = {
                "ttft_ms": median([r.ttft_s * 1e3 for r in sreq]),
                "itl_ms": median([r.itl_s * 1e3 for r in sreq]),
                "cost": speedup(st, cells(raw, "throughput", 1), f"{key}/stream").as_dict(),
            }
        out["variants"].append(entry)
    out["capture_ab"] = capture_ab(res, concs)
    out["check_cost"] = check_cost(res, concs)
    out["advice"] = advice(out)
    out["adaptive"] = adaptive(res, out)
    out["shipped"] = shipped(res, out)
    return out


def capture_ab(res: Results, concs: Sequence[int]) -> list[dict[str, Any]]:
    """Plugin capture vs vLLM's native capture, per :data:`~.plan.AB_PAIRS` pair in the run: the target's forward
    (verify) ms per decode step from the worker timers, and forward per ms of draft in the same steps
    (``normalized``: the draft's work is the same on both sides when tau is, so this cancels each server's speed)."""
    out = []
    for plugin, native in AB_PAIRS:
        for nat_v, _ in res.find(capture=native, replica=1):
            same = dict(k=nat_v.k, compiled=nat_v.compiled, mla_verify=nat_v.mla_verify, check=nat_v.check)
            a, b = res.find(capture=plugin, **same), res.find(capture=native, **same)
            for c in concs:
                if row := _ab_row(a, b, c, f"ab/{plugin}/{nat_v.k}/{c}"):
                    out.append({"plugin": plugin, "native": native, "k": nat_v.k, "concurrency": c, **row})
    return out


def _ab_row(
    a: Sequence[tuple[Variant, dict]], b: Sequence[tuple[Variant, dict]], c: int, seed: str
) -> dict[str, Any] | None:
    def fw(raws):
        got, per_draft, accepted, drafts = [], [], 0.0, 0.0
        for _, raw in raws:
            cs = [x for x in cells(raw, "split", c) if x.get("split")]
            if cs and cs[0]["split"]["forward_ms"]:
                sp = cs[0]["split"]
                got.append(sp["forward_ms"])
                per_draft.append([f / d for f, d in zip(sp["forward_ms"], sp.get("draft_ms") or []) if d > 0])
                if cs[0].get("counters"):
                    drafts, accepted = drafts + cs[0]["counters"][0], accepted + cs[0]["counters"][2]
        return got, per_draft, (1 + accepted / drafts if drafts else NAN)

    (e, e_norm, tau_a), (n, n_norm, tau_b) = fw(a), fw(b)
    if not e or not n:
        return None
    row = {
        "servers": [len(e), len(n)],
        "plugin_forward_ms": [mean(g) for g in e],
        "native_forward_ms": [mean(g) for g in n],
        "tau": [tau_a, tau_b],
        **_compare(e, n, seed),
    }
    if all(e_norm) and all(n_norm):
        row["normalized"] = {
            "plugin": [mean(g) for g in e_norm],
            "native": [mean(g) for g in n_norm],
            **_compare(e_norm, n_norm, f"{seed}/per-draft"),
        }
    return row


def _compare(a: Sequence, b: Sequence, seed: str, ratio_of: Callable = stratified_ratio) -> dict[str, Any]:
    """``ratio_of`` side ``a`` / side ``b`` (each a list of servers' items: timings, cells), the same ratio between
    two servers of one side, a verdict."""
    ratio = ratio_of(a, b, seed)
    same = [ratio_of(g[:1], g[1:2], f"{seed}/same/{i}") for i, g in enumerate((a, b)) if len(g) > 1]
    return {
        "ratio": ratio.as_dict(),
        "same_config_ratios": [s.as_dict() for s in same],
        "verdict": _verdict(ratio, same),
    }


def _verdict(ratio: Estimate, same: Sequence[Estimate]) -> str:
    """Whether ``ratio`` (one configuration / the other) is a difference: its interval excludes 1 AND it is larger
    than the ratio between two servers of one configuration (``same``)."""
    gap = abs(math.log(ratio.value)) if finite(ratio.value) and ratio.value > 0 else NAN
    noise = max((abs(math.log(s.value)) for s in same if finite(s.value) and s.value > 0), default=NAN)
    if not ratio.excludes(1.0):
        return "within noise: the interval includes 1"
    if finite(noise) and gap <= noise:
        return (
            "within server-to-server noise: the interval excludes 1, but two servers of the same configuration "
            "differ by as much or more"
        )
    if finite(noise):
        return "a real difference: outside the interval and larger than between two identical servers"
    return "outside the interval (one server per side: server-to-server noise not measured)"


def check_cost(res: Results, concs: Sequence[int]) -> list[dict[str, Any]]:
    """Throughput with the online wiring check on / off (plan ``check``), per configuration with a check-off server
    and per concurrency: paired over prompts, each side's servers pooled, against the same ratio between two servers
    of one side (:func:`_verdict`). Below 1: the check costs."""
    out = []
    for off_v, _ in res.find(check=False, replica=1):
        same = dict(k=off_v.k, capture=off_v.capture, compiled=off_v.compiled, mla_verify=off_v.mla_verify)
        sides = [
            (c, by_server(res.find(check=True, **same), c), by_server(res.find(check=False, **same), c)) for c in concs
        ]
        out += [
            {
                "config": off_v.config_key.replace("+check-off", ""),
                "k": off_v.k,
                "mode": off_v.mode,
                "concurrency": c,
                "servers": [len(on), len(off)],
                "on_tok_s": [wall_tok_s(cs) for cs in on],
                "off_tok_s": [wall_tok_s(cs) for cs in off],
                **_compare(on, off, f"check/{off_v.config_key}/{c}", lambda x, y, s: speedup(pooled(x), pooled(y), s)),
            }
            for c, on, off in sides
            if on and off
        ]
    return out


def same_text(summary: Mapping[str, Any], servers: Sequence[tuple[Variant, Any]], c: int) -> list | None:
    """[same, all] greedy outputs at ``c``, summed over the ``servers`` that had the throughput cell there."""
    rows = {v["key"]: v["by_concurrency"].get(str(c), {}) for v in summary["variants"]}
    return list(map(sum, zip(*[g for x, _ in servers if (g := rows[x.key].get("same_text"))]))) or None


WITHIN_BEST = 0.90  # the adaptive schedule's bar: within 10 % of the best static k at every concurrency


def adaptive(res: Results, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per concurrency, for a run with an adaptive server: the rows of the page's adaptive table (what each column
    is over which servers: ``template_adaptive.md``). Targets: >= 1.0x no speculation at the interval's lower end,
    >= :data:`WITHIN_BEST` x the best static k."""
    out = []
    for v, raw in res.find(adaptive=True, replica=1, live=False):
        base = res.base(v)
        choosers = [(sv, sraw) for sv, sraw in res.variants if sv.chooses_k and sv.compiled == v.compiled]
        twins = res.find(adaptive=True, compiled=v.compiled, stretch=v.stretch, live=False)  # it + replicas, in order
        for c in summary["concurrencies"]:
            if not cells(raw, "throughput", c) or base is None or not cells(base, "throughput", c):
                continue
            mine_by, bcs = by_server(twins, c), cells(base, "throughput", c)
            mine = pooled(mine_by)
            at_c = [(sv, sraw) for sv, sraw in choosers if cells(sraw, "throughput", c)]
            first_v, first = next(((sv, sraw) for sv, sraw in at_c if sv.k == 0), (None, None))
            cand = [(wall_tok_s(cells(sraw, "throughput", c)), sv, sraw) for sv, sraw in at_c if sv.k]
            cand = [x for x in cand if finite(x[0])]
            seed = f"adaptive/{v.key}/{c}"
            row: dict[str, Any] = {
                "mode": v.mode,
                "concurrency": c,
                "k": k_at(v.schedule, c) if v.schedule else None,
                "nospec_tok_s": wall_tok_s(bcs),
                "tok_s": wall_tok_s(mine),
                "speedup": speedup(mine, bcs, seed).as_dict(),
                "side_by_side": bool(v.stretch) and base is not first,
                "chosen_side_by_side": bool(first_v and first_v.stretch),
                "stretch": v.stretch,
                "turns": mine_by[0][0].get("chunks"),
                "servers": [len(mine_by), 0],
                "same_config": {},
                "same_text": same_text(summary, twins, c),
            }
            if len(mine_by) > 1:
                row["same_config"]["adaptive"] = speedup(mine_by[0], mine_by[1], seed + "/same").as_dict()
            k3 = [x for x in cand if x[1].k == 3]
            if k3 and first is not None:
                row["k3_speedup"] = speedup(
                    cells(k3[0][2], "throughput", c), cells(first, "throughput", c), seed + "/k3"
                ).as_dict()
            if cand:
                _, bv, braw = max(cand, key=lambda x: (x[0], -x[1].k))
                row["best_static_k"] = bv.k
                paired_by = by_server(
                    [x for x in res.find(compiled=v.compiled, stretch=v.stretch, k=bv.k) if x[0].side_static], c
                )
                bcells = pooled(paired_by) or cells(braw, "throughput", c)
                row["best_static_side_by_side"] = bool(paired_by)
                row["servers"][1] = len(paired_by) or 1
                if len(paired_by) > 1:
                    row["same_config"]["best_static"] = speedup(
                        paired_by[0], paired_by[1], seed + "/best-same"
                    ).as_dict()
                row["best_static_speedup"] = speedup(
                    bcells, bcs if paired_by else cells(first or base, "throughput", c), seed + "/best"
                ).as_dict()
                row["vs_best_static"] = speedup(mine, bcells, seed + "/vs-best").as_dict()
                row["measured_k"] = sorted(x[1].k for x in cand)
                row["static_same_text"] = {str(x[1].k): same_text(summary, [x[1:]], c) for x in cand}
            if first is not None and base is not first:
                row["nospec_drift"] = speedup(bcs, cells(first, "throughput", c), seed + "/drift").as_dict()
            lo, vb = row["speedup"]["lo"], row.get("vs_best_static", {}).get("value", NAN)
            row.update(never_slower=bool(finite(lo) and lo >= 1.0), within_best=bool(finite(vb) and vb >= WITHIN_BEST))
            out.append(row)
    return sorted(out, key=lambda r: (r["mode"], r["concurrency"]))


BAR = {"point": 1.00, "lo": 0.97, "point_c1": 2.0}  # the shipped default vs no speculation (report_adaptive.BAR_TEXT)


def verdict(c: int, sp: Mapping, same_text: Sequence[int] | None) -> list[str]:
    """What the shipped default misses of :data:`BAR` at concurrency ``c`` (empty: it meets it)."""
    want = BAR["point_c1"] if c == 1 else BAR["point"]
    miss = [] if finite(sp["value"]) and sp["value"] >= want else [f"point < {want:.2f}"]
    miss += [] if finite(sp["lo"]) and sp["lo"] >= BAR["lo"] else [f"lower end < {BAR['lo']:.2f}"]
    return miss + ([] if same_text and same_text[0] == same_text[1] else ["greedy output differs"])


def shipped(res: Results, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per concurrency, for a run with a live (shipped default) server: its servers pooled vs the no-speculation
    server of its stretch (paired over prompts), acceptance length pooled over its requests, the :func:`verdict`."""
    out = []
    for v, _ in res.find(live=True, replica=1):
        base, twins = res.base(v), res.find(live=True, compiled=v.compiled, stretch=v.stretch)
        for c in summary["concurrencies"]:
            mine, bcs = pooled(by_server(twins, c)), cells(base, "throughput", c) if base else []
            if not mine or not bcs:
                continue
            sp = speedup(mine, bcs, f"shipped/{v.key}/{c}").as_dict()
            same = same_text(summary, twins, c)
            counts = [r.counters for r in requests(mine) if r.counters and r.counters[0] > 0]
            out.append(
                {
                    "concurrency": c,
                    "mode": v.mode,
                    "servers": len(by_server(twins, c)),
                    "speedup": sp,
                    "nospec_tok_s": wall_tok_s(bcs),
                    "tok_s": wall_tok_s(mine),
                    "same_text": same,
                    "tau": 1 + sum(x[2] for x in counts) / sum(x[0] for x in counts) if counts else NAN,
                    "misses": verdict(c, sp, same),
                    "live_k": [live_cells.of_cell(cs[-1], True) for cs in by_server(twins, c)],  # per server
                }
            )
    return sorted(out, key=lambda r: (r["mode"], r["concurrency"]))


def advice(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per mode and concurrency: the k with the highest measured throughput (shipped wiring and MLA path), its
    acceptance length, break-even acceptance length, ideal and achieved speedup."""
    out = []
    pool = [v for v in summary["variants"] if Variant.from_dict(v["variant"]).chooses_k]
    for mode in ("eager", "compiled"):
        vs = [v for v in pool if v["variant"]["compiled"] == (mode == "compiled")]
        for c in summary["concurrencies"]:
            cand = [
                (t, v)
                for v in vs  # those with a throughput cell at c
                if finite(t := v["by_concurrency"].get(str(c), {}).get("tok_s", {}).get("value"))
            ]
            if not cand or not any(v["variant"]["k"] == 0 for _, v in cand):
                if cand and any(v["variant"]["k"] == 0 for v in vs):  # its server failed: no advice, say why
                    out.append({"mode": mode, "concurrency": c, "best_k": None, "missing_base": True})
                continue
            best_t, best = max(cand, key=lambda tv: tv[0])
            row = best["by_concurrency"][str(c)]
            out.append(
                {
                    "mode": mode,
                    "concurrency": c,
                    "best_k": best["variant"]["k"],
                    "best_tok_s": best_t,
                    "measured_k": sorted(v["variant"]["k"] for _, v in cand),
                    "tau": (best["acceptance"] or {}).get("tau"),
                    "break_even": row.get("break_even"),
                    "ideal": row.get("ideal", NAN),
                    "model_verify": row.get("model_verify", NAN),
                    "speedup": row.get("speedup"),
                }
            )
    for v in summary["variants"]:  # the SGLang default wiring, measured against its break-even
        if v["variant"]["capture"] == NATIVE and v["variant"]["replica"] == 1:
            for c, row in v["by_concurrency"].items():
                out.append(
                    {
                        "mode": SGLANG_DEFAULT_WIRING,
                        "concurrency": int(c),
                        "best_k": None,
                        "key": v["key"],
                        "tau": (v["acceptance"] or {}).get("tau"),
                        "break_even": row.get("break_even"),
                        "speedup": row.get("speedup") or row.get("speedup_timed"),
                        "speedup_source": "throughput" if row.get("speedup") else "timed",
                    }
                )
    return out
