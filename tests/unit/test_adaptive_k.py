"""Speculation that adapts to load (issue 29), without an engine: the k-per-batch-size table chosen from measured
throughput, read the way vLLM 0.32 reads it, the run-time resolution of the plan's search and adaptive servers, the
report's verdicts, the KV cache and memory each side-by-side server is given, the held-out prompts, and the shipped
serve configs carrying the measured table.

Guards: a table vLLM would read differently from what the advice meant (ranges off by one, a first range not
starting at 1, k above ``num_speculative_tokens``); an adaptive server judged against a different baseline than the
static ones; a verdict that says "never slower" when the lower end of the interval is below 1; shipped configs whose
table is not the one the committed measurement gives; benchmark prompts a model trained on.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.bench import advise, analysis, heldout, report
from vllm_eagle3.tools.bench import plan as plans
from vllm_eagle3.tools.bench.cli import DOCS
from vllm_eagle3.tools.bench.plan import Variant, k_at

pytestmark = pytest.mark.unit

SHIPPED_SERVE_CONFIGS = ("configs/serve_kimi_k25_mini.yaml", "configs/serve_kimi_k25_mini_vision.yaml")
ADAPTIVE_RESULTS = REPO / "bench" / "adaptive" / "results.json"
BF16_CONFIG = "configs/serve_kimi_k25_mini_bf16.yaml"
BF16_RESULTS = REPO / DOCS["adaptive_bf16"]  # AMX_MLA, measured on an AMX host


def test_schedule_takes_the_fastest_k_per_concurrency_and_splits_at_geometric_means():
    pts = {
        1: {0: 10, 1: 15, 2: 18, 3: 20, 4: 19},
        4: {0: 30, 1: 45, 2: 50, 3: 50},
        16: {0: 80, 1: 100, 2: 95, 3: 90},
        32: {0: 100, 1: 104, 3: 90},
        64: {0: 120, 1: 110, 3: 80},
    }
    table = advise.schedule(pts)
    # 1 -> k=3; 4 -> tie 2/3 goes to 2; 16 and 32 -> 1 (merged); 64 -> 0; ends at floor(sqrt(1*4))=2, sqrt(64)=8,
    # sqrt(512)=22, sqrt(2048)=45
    assert table == ((1, 2, 3), (3, 8, 2), (9, 45, 1), (46, advise.OPEN_END, 0))
    assert [k_at(table, b) for b in (1, 2, 3, 8, 9, 45, 46, 500)] == [3, 3, 2, 2, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="no measured throughput"):
        advise.schedule({})


def test_schedule_never_raises_k_with_the_batch():
    """The run of 2026-12-03 measured k = 3, 1, 3, 1, 1 best at 1, 4, 16, 32, 64 (k = 1 and 3 within 1 % at 16):
    a k that rises with load is noise, and the table keeps the lower concurrency's k."""
    pts = {
        1: {0: 19.9, 1: 30.9, 3: 39.9},
        4: {0: 53.8, 1: 91.1, 3: 83.7},
        16: {0: 123.7, 1: 142.3, 3: 143.8},
        32: {0: 136.1, 1: 167.8, 3: 146.9},
        64: {0: 143.0, 1: 143.8, 3: 143.5},
    }
    assert advise.schedule(pts) == ((1, 2, 3), (3, advise.OPEN_END, 1))


def test_vllm_reads_the_table_as_the_advice_means_it():
    """vLLM 0.32's own expansion of the table (the scheduler's dense lookup) gives k_at at every batch size, with
    num_speculative_tokens = the table's largest k, as config_lines writes it."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    table = ((1, 2, 4), (3, 8, 3), (9, 22, 2), (23, 45, 1), (46, advise.OPEN_END, 0))
    cfg = yaml.safe_load(advise.config_lines(table))["speculative-config"]
    assert cfg["num_speculative_tokens"] == 4
    lookup = build_dynamic_sd_schedule_lookup(
        cfg["num_speculative_tokens_per_batch_size"], 256, cfg["num_speculative_tokens"]
    )
    assert lookup[1:] == [k_at(table, b) for b in range(1, 257)]


def _raw(v: Variant, tok_s: dict[int, float], text=lambda i: f"t{i}") -> dict:
    """A results-file record: every throughput cell 4 prompts x 100 tokens, per-prompt latencies around the cell's
    tok/s (spread +-10 %), wall clock = tokens / tok/s."""
    cells = []
    for cell in v.cells:
        if cell.kind != "throughput" or cell.concurrency not in tok_s:
            continue
        t = tok_s[cell.concurrency]
        reqs = [
            {
                "prompt": i,
                "tokens": 100,
                "latency_s": 100 / t * cell.concurrency * (0.9 + 0.05 * i),
                "text": text(i),
                "ttft_s": float("nan"),
                "counters": None,
            }
            for i in range(4)
        ]
        cells.append(
            {
                "kind": "throughput",
                "concurrency": cell.concurrency,
                "round": 0,
                "split": None,
                "wall_s": 400 / t,
                "requests": reqs,
                "counters": None,
            }
        )
    return {
        "key": v.key,
        "variant": v.as_dict(),
        "label": v.label,
        "ready_s": 30.0,
        "error": None,
        "capture_line": "",
        "check_line": "",
        "mla_calls": {},
        "cells": cells,
    }


SPEEDS = {  # k -> {concurrency: tok/s}: k=3 best at 1, k=2 at 4, k=1 at 16, no speculation at 64
    0: {1: 10, 4: 30, 16: 80, 64: 120},
    1: {1: 15, 4: 45, 16: 100, 64: 110},
    2: {1: 18, 4: 52, 16: 95, 64: 100},
    3: {1: 20, 4: 50, 16: 90, 64: 85},
    4: {1: 19, 4: 40, 16: 70, 64: 60},
    5: {1: 17, 4: 35, 16: 60, 64: 50},
}


def _run(adaptive_speed, concs=(1, 4, 16, 64), second_server: float = 1.0) -> dict:
    """What ``cli.execute`` does with the plan, on made-up speeds: stretch by stretch, resolve each variant from the
    records of the stretches before it (a replica #2 runs at ``second_server`` x its configuration's speed)."""
    p = plans.adaptive_plan(concurrencies=concs, prompts=4, waves=1, max_tokens=100)
    raws = []
    for stretch in sorted({v.stretch for v in p.variants}):
        ran = []
        for v in (v for v in p.variants if v.stretch == stretch):
            v = advise.resolve(v, raws)
            if not v.cells:
                continue
            if v.adaptive:
                speeds = {c: adaptive_speed(c, k_at(v.schedule, c)) for c in concs}
            else:
                speeds = SPEEDS[v.k]
            ran.append(_raw(v, {c: t * (second_server if v.replica == 2 else 1.0) for c, t in speeds.items()}))
        raws += ran
    meta = {
        "date": "2026-12-03 08:00 UTC",
        "command": "vllm-eagle3 bench --plan adaptive",
        "duration_min": 60.0,
        "load_before": "0.1 0.1 0.1",
        "load_after": "2.0 1.9 1.5",
        "machine": {
            "cpu": "CPU",
            "nproc": "2",
            "memory": "23 GiB",
            "flags": "avx2",
            "python": "3.11",
            "torch": "2",
            "vllm": "0.32",
            "openai": "1",
            "commit": "abc1234",
            "dirty": "no",
        },
    }
    return {"schema": 2, "meta": meta, "plan": p.as_dict(), "variants": raws}


def test_plan_chooses_k_side_by_side_and_serves_the_measured_table():
    """Every k at the light concurrencies; under load only the k the light table left possible (k never rises with
    the batch: the table drafts 1 at 16, so k >= 2 cannot be chosen at 64); the adaptive server gets the table."""
    data = _run(lambda c, k: SPEEDS[k][c])
    ran = {r["key"]: [c["concurrency"] for c in r["cells"] if c["kind"] == "throughput"] for r in data["variants"]}
    assert all(ran[f"embed-k{k}@1"] == [1, 4, 16] for k in range(1, 6)) and ran["nospec@1"] == [1, 4, 16]
    assert ran["nospec@2"] == [64] and ran["embed-k1@2"] == [64]
    assert not any(f"embed-k{k}@2" in ran for k in range(2, 6))
    ad = Variant.from_dict(next(r for r in data["variants"] if r["key"] == "embed-adaptive@3")["variant"])
    assert ad.schedule == ((1, 2, 3), (3, 8, 2), (9, 32, 1), (33, advise.OPEN_END, 0)) and ad.k == 3
    assert advise.from_results(data) == ad.schedule
    serve = plans.PLAN_PROMPTS["adaptive"]
    assert serve == "bench/heldout_prompts.json"


def test_judging_stretches_run_the_statics_the_adaptive_server_is_compared_with_two_servers_each_at_light_load():
    """Two judging stretches, light and loaded: no speculation again, each static k only where the table serves it
    or where it measured the best (k >= 1) in the choosing stretches, and the adaptive server; at light load two
    servers of each speculating configuration, and the adaptive rows pool them (a ratio over servers, with the ratio
    between the two servers of one configuration beside it)."""
    data = _run(lambda c, k: SPEEDS[k][c], second_server=0.8)
    side = {
        r["key"]: [c["concurrency"] for c in r["cells"]]
        for r in data["variants"]
        if r["variant"]["stretch"] in plans.JUDGING
    }
    # table 1-2: k=3, 3-8: k=2, 9-32: k=1, 33+: k=0; best k >= 1: 3 at 1, 2 at 4, 1 at 16 and 64
    assert side == {
        "nospec@3": [1, 4, 16],
        "embed-k1@3": [16],
        "embed-k2@3": [4],
        "embed-k3@3": [1],
        "embed-adaptive@3": [1, 4, 16],
        "embed-adaptive#2@3": [1, 4, 16],
        "embed-k1#2@3": [16],
        "embed-k2#2@3": [4],
        "embed-k3#2@3": [1],
        "nospec@4": [64],
        "embed-adaptive@4": [64],
        "embed-k1@4": [64],
    }
    summary = analysis.summarize(data)
    rows = {r["concurrency"]: r for r in summary["adaptive"]}
    assert sorted(rows) == [1, 4, 16, 64]
    assert all(r["side_by_side"] and r["best_static_side_by_side"] for r in rows.values())
    assert rows[1]["servers"] == [2, 2] and rows[64]["servers"] == [1, 1] and rows[64]["stretch"] == plans.JUDGE_LOADED
    # both sides pooled over a full-speed and a 0.8x server: adaptive (k=3 at c=1) / best static (k=3) = 1
    assert rows[1]["vs_best_static"]["value"] == pytest.approx(1.0)
    assert rows[1]["same_config"]["adaptive"]["value"] == pytest.approx(1 / 0.8)
    assert rows[1]["same_config"]["best_static"]["value"] == pytest.approx(1 / 0.8)
    # against the one no-speculation server: the two servers' tokens over their seconds, 800 / (20 + 25) tok/s over 10
    assert rows[1]["speedup"]["value"] == pytest.approx(800 / 45 / 10) and rows[1]["same_text"] == [8, 8]
    text = report.adaptive_block(summary, "run")
    assert "side by side" in text and "1.25" in text


def test_side_by_side_servers_get_the_kv_cache_of_their_busiest_cell_and_start_only_if_they_fit():
    """A 1 GiB KV cache holds ~38 requests of 64 + 128 tokens: a c=64 cell would queue a third of its requests.
    A server that would not fit next to the others is not started (recorded), instead of an OOM kill mid-stretch."""
    from vllm_eagle3.tools.bench.run import kv_cache_gib, memory_short

    p = plans.PLANS["adaptive"]()
    kv = {v.key: kv_cache_gib(v, p, 64) for v in p.variants}
    assert kv["embed-k5@1"] == 1 and kv["nospec@2"] == 2 and kv["embed-adaptive@4"] == 2
    assert kv["embed-adaptive@3"] == kv["embed-adaptive#2@3"] == kv["embed-k5#2@3"] == 1  # light judging: 1 GiB
    # bf16 (the AMX config): half the bytes per token, so a c=64 cell fits in 1 GiB
    assert kv_cache_gib(next(v for v in p.variants if v.key == "embed-k1@2"), p, 64, "bfloat16") == 1
    assert memory_short(2, "MemAvailable:   6000000 kB\n") == ""
    assert "4.8 GiB of memory available" in memory_short(2, "MemAvailable:   5000000 kB\n")


def test_side_by_side_turns_mirror_and_cover_every_prompt():
    from vllm_eagle3.tools.bench.run import chunks, turn_order

    assert [list(r) for r in chunks(16, 1)] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert [list(r) for r in chunks(16, 4)] == [list(range(8)), list(range(8, 16))]
    assert [len(r) for r in chunks(128, 64)] == [64, 64] and [len(r) for r in chunks(64, 64)] == [64]
    assert [turn_order(3, i) for i in range(3)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]
    with pytest.raises(ValueError, match="throughput and split cells only"):
        Variant(0, plans.NO_SPEC, stretch=plans.JUDGE, cells=(plans.Cell("stream", 1),))


def test_adaptive_verdicts_follow_the_intervals():
    """Served at the static speeds its table picks: >= 1.0x where k >= 1 was picked and within 10 % of the best
    everywhere; at 64 (k=0, which still pays the draft's first pass) 5 % slower than no speculation: 'no'."""
    good = analysis.summarize(_run(lambda c, k: SPEEDS[k][c] * (0.95 if k == 0 else 1.0)))
    rows = {r["concurrency"]: r for r in good["adaptive"]}
    assert [rows[c]["k"] for c in (1, 4, 16, 64)] == [3, 2, 1, 0]
    assert rows[1]["never_slower"] and rows[4]["within_best"] and rows[1]["best_static_k"] == 3
    assert rows[1]["speedup"]["value"] == pytest.approx(2.0)
    assert rows[1]["vs_best_static"]["value"] == pytest.approx(1.0)
    assert not rows[64]["never_slower"] and rows[64]["best_static_k"] == 1
    assert rows[64]["vs_best_static"]["value"] == pytest.approx(114 / 110)
    assert rows[1]["same_text"] == [8, 8] and rows[1]["nospec_drift"]["value"] == pytest.approx(1.0)
    slow = analysis.summarize(_run(lambda c, k: SPEEDS[k][c] * 0.85))
    # 15 % below the best static k where it speculates; at 64 its k=0 still beats 0.9 x the best static (k=1)
    assert [r["within_best"] for r in slow["adaptive"]] == [False, False, False, True]
    text = report.adaptive_block(good, "run")
    assert "k per batch size 1-2: k=3, 3-8: k=2, 9-32: k=1, 33+: k=0" in text and "| 64 |" in text
    assert "**no**" in text  # the failed target at 64 is visible
    # the advice of the headline never picks the adaptive server as "the best k"
    assert all(a["best_k"] in (0, 1, 2, 3, 4) for a in good["advice"] if a["mode"] == "eager")


def test_greedy_difference_is_counted():
    data = _run(lambda c, k: SPEEDS[k][c])
    for raw in data["variants"]:
        if raw["key"] == "embed-adaptive@3":
            raw["cells"][0]["requests"][1]["text"] = "different"
    rows = {r["concurrency"]: r for r in analysis.summarize(data)["adaptive"]}
    assert rows[1]["same_text"] == [7, 8] and rows[4]["same_text"] == [8, 8]  # two adaptive servers at light load


def test_variant_rules():
    with pytest.raises(ValueError, match="adaptive variants"):
        Variant(0, plans.NO_SPEC, adaptive=True)
    with pytest.raises(ValueError, match="drafts at most"):
        Variant(2, plans.EMBED_TAP, adaptive=True, schedule=((1, 4096, 3),))
    v = Variant(3, plans.EMBED_TAP, adaptive=True, schedule=((1, 2, 3), (3, 4096, 1)))
    assert v.key == "embed-adaptive" and Variant.from_dict(json.loads(json.dumps(v.as_dict()))) == v
    with pytest.raises(ValueError, match="stretch must be one of"):
        Variant(0, plans.NO_SPEC, stretch=7)


# ------------------------------------------------------------------------------------------------ held-out prompts


def test_heldout_windows_and_corpus_check(tmp_path):
    from vllm_eagle3.miniature.tokenizer import load_tokenizer

    tok = load_tokenizer(REPO / heldout.TOKENIZER_DIR)
    text = "".join(f"def f{i}(x):\n    return x * {i} + unique_name_{i}\n\n" for i in range(200))
    ws = heldout.windows(tok, text, 64, 3)
    assert len(ws) == 3 and all(len(ids) == 64 for _, ids in ws)
    starts = [ln for ln, _ in ws]
    assert starts == sorted(starts) and len(set(starts)) == 3
    corpus = tmp_path / "lib"
    corpus.mkdir()
    (corpus / "copied.py").write_text("import os\n" + tok.decode(ws[1][1]) + "\n")
    hits, n = heldout.corpus_hits([tok.decode(ids) for _, ids in ws], [corpus], progress=False)
    assert n == 1 and hits == [False, True, False]


def test_committed_heldout_prompts_are_what_they_say():
    """Every prompt: 64 tokens of a file first committed after the last model commit (moved or deleted since, it
    stays a file no model trained on), its text decoded from its ids; the file records the corpus check it passed."""
    path = REPO / heldout.DEFAULT_OUT
    data = json.loads(path.read_text())
    c = data["checks"]
    assert c["dropped_seen_in_corpus"] >= 0 and c["corpus_files"] > 1000 and c["after"] == heldout.DEFAULT_AFTER
    assert len(data["items"]) >= 128  # a c=64 cell of 2 waves
    try:
        added = set(
            heldout.git("log", "--diff-filter=A", "-M", "--name-only", "--format=", f"{c['after']}..HEAD").split()
        )
    except subprocess.CalledProcessError:
        pytest.skip(f"this clone has no history back to {c['after']} (shallow): the git clock cannot be read")
    from vllm_eagle3.miniature.tokenizer import load_tokenizer

    tok = load_tokenizer(REPO / heldout.TOKENIZER_DIR)
    for it in data["items"]:
        assert len(it["prompt_token_ids"]) == c["prompt_tokens"]
        assert it["source"].rsplit(":", 1)[0] in added, f"{it['source']} was not added after {c['after']}"
        assert tok.decode(it["prompt_token_ids"]) == it["prompt"]


# ------------------------------------------------------------------------------------------------ shipped configs


def test_shipped_serve_configs_carry_the_measured_table():
    if not ADAPTIVE_RESULTS.exists():
        pytest.fail(
            f"{ADAPTIVE_RESULTS.relative_to(REPO)} is missing: run vllm-eagle3 bench --plan adaptive "
            "--out-dir bench/adaptive"
        )
    table = advise.from_results(json.loads(ADAPTIVE_RESULTS.read_text()))
    want = yaml.safe_load(advise.config_lines(table))["speculative-config"]
    for name in SHIPPED_SERVE_CONFIGS:
        spec = yaml.safe_load((REPO / name).read_text())["speculative-config"]
        got = [tuple(e) for e in spec.get("num_speculative_tokens_per_batch_size") or []]
        assert got == list(table), (
            f"{name}: num_speculative_tokens_per_batch_size {got} is not the table of "
            f"{ADAPTIVE_RESULTS.relative_to(REPO)} {list(table)}: paste the lines of "
            f"vllm-eagle3 bench --from-json bench/adaptive/results.json --advise"
        )
        assert spec["num_speculative_tokens"] == want["num_speculative_tokens"], name


def test_the_bf16_config_carries_the_table_measured_on_amx_mla_or_none():
    """bf16 is the AMX_MLA fast path: its table comes from a bf16 run on an AMX host (bench/adaptive-bf16), never from
    the float32 CPU_MLA run; without such a run it drafts a fixed k."""
    spec = yaml.safe_load((REPO / BF16_CONFIG).read_text())["speculative-config"]
    got = [tuple(e) for e in spec.get("num_speculative_tokens_per_batch_size") or []]
    if not BF16_RESULTS.exists():
        assert got == [], f"{BF16_CONFIG} carries a table but {BF16_RESULTS.relative_to(REPO)} does not exist"
        return
    data = json.loads(BF16_RESULTS.read_text())
    assert (data["meta"]["dtype"], data["meta"]["attention"]) == ("bfloat16", "AMX_MLA"), data["meta"]
    table = advise.from_results(data)
    assert got == list(table), (
        f"{BF16_CONFIG}: {got} is not the table of {BF16_RESULTS.relative_to(REPO)} "
        f"{list(table)}: paste the lines of vllm-eagle3 bench --from-json "
        f"{BF16_RESULTS.relative_to(REPO)} --advise"
    )
    assert spec["num_speculative_tokens"] == max(k for _, _, k in table), BF16_CONFIG


def test_watch_rates_divide_by_the_drafts_that_reached_each_position():
    """Under k per batch size a k=1 step's drafts have no position 2 or 3: dividing by all drafts would read the
    later positions as falling acceptance. Position 0 and the acceptance length are unchanged."""
    from vllm_eagle3.watch import AcceptanceWindow

    w = AcceptanceWindow(1000, 3)
    w.add(10, [8, 6, 4])  # a fixed k=3 step (vLLM before num_draft_tokens_per_pos: every draft had each position)
    w.add(10, [8, 0, 0], [10, 0, 0])  # 10 drafts of 1 token
    assert w.rates() == pytest.approx([16 / 20, 6 / 10, 4 / 10])
    assert w.acceptance_length() == pytest.approx(1 + 26 / 20)
    w2 = AcceptanceWindow(15, 3)  # the window slides whole steps, with their per-position drafts
    w2.add(10, [8, 6, 4], [10, 10, 10])
    w2.add(10, [5, 0, 0], [10, 0, 0])
    w2.add(10, [5, 0, 0], [10, 0, 0])
    assert w2.drafts == 20 and w2.rates() == pytest.approx([0.5, 0.0, 0.0])


def test_k_flag_sets_the_adaptive_plans_largest_k_and_refuses_zero():
    from vllm_eagle3.tools.bench import cli

    plan = cli.build_plan(cli.parser().parse_args(["--plan", "adaptive", "--k", "2"]))
    assert sorted({v.k for v in plan.variants if v.stretch == plans.CHOOSE_LIGHT}) == [0, 1, 2]
    with pytest.raises(ValueError, match="--k 0: speculative tokens must be >= 1"):
        cli.build_plan(cli.parser().parse_args(["--plan", "adaptive", "--k", "0"]))


def test_a_judging_replica_that_failed_to_start_still_renders_the_page():
    """A second adaptive server that did not start (memory, a port) is a failed row on the page, not a ValueError
    after results.json was written (which left the run without a page); a results file from before the judging
    stretches had replicas (no second adaptive server planned at all) is still refused."""
    from vllm_eagle3.tools.bench.report_adaptive import adaptive_block

    data = json.loads(ADAPTIVE_RESULTS.read_text())
    for v in data["variants"]:
        if v["variant"]["adaptive"] and v["variant"]["replica"] == 2:
            v["error"], v["cells"] = "server did not start: simulated", []
    page = report.render(data, png_rel=None)
    assert "**Failed:** embed-adaptive#2@3: server did not start: simulated" in page
    assert "Speculation that adapts to load" in page
    data["variants"] = [v for v in data["variants"] if v["variant"]["replica"] == 1]
    with pytest.raises(ValueError, match="before the judging stretches had replicas"):
        adaptive_block(analysis.summarize(data))
