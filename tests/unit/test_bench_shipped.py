"""``vllm-eagle3 bench --plan shipped``: the shipped default (live_k) against no speculation, judged on issue 41's bar.
No engine: the plan, the serve YAML, the verdict and the pages from synthetic results."""

import copy
import json

import pytest
import yaml

from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.bench import analysis, report, run
from vllm_eagle3.tools.bench.cli import build_plan, parser
from vllm_eagle3.tools.bench.plan import JUDGE, JUDGE_LOADED, NO_SPEC, Variant
from vllm_eagle3.tools.bench.report_adaptive import host_kind, shipped_block, shipped_repo_block

pytestmark = pytest.mark.unit

BASE = {
    "model": "models/kimi-k25-mini",
    "dtype": "float32",
    "port": 8000,
    "speculative-config": {
        "method": "eagle3",
        "model": "models/kimi-k25-mini-eagle3",
        "num_speculative_tokens": 5,
        "num_speculative_tokens_per_batch_size": [[1, 8, 5], [9, 4096, 2]],
    },
    "additional-config": {"vllm_eagle3": {"live_k": True, "capture_spec": {"taps": ["embed", 3, 31]}}},
}


def test_plan_runs_only_the_judging_stretches():
    plan = build_plan(parser().parse_args(["--plan", "shipped"]))
    assert [(v.key, v.stretch) for v in plan.variants] == [
        ("nospec@3", JUDGE),
        ("embed-live@3", JUDGE),
        ("embed-live#2@3", JUDGE),
        ("nospec@4", JUDGE_LOADED),
        ("embed-live@4", JUDGE_LOADED),
    ]
    assert [v.cell_list("throughput") for v in plan.variants] == [[1, 4, 16]] * 3 + [[32, 64]] * 2
    assert all(c.kind == "throughput" for v in plan.variants for c in v.cells)
    assert (plan.prompts, plan.waves, plan.max_tokens) == (16, 2, 128)
    with pytest.raises(ValueError, match="--k"):
        build_plan(parser().parse_args(["--plan", "shipped", "--k", "3"]))


def test_shipped_variant_serves_the_base_config(tmp_path):
    live = next(v for v in build_plan(parser().parse_args(["--plan", "shipped"])).variants if v.live)
    v = run.as_shipped(live, BASE)
    assert (v.k, v.schedule) == (5, ((1, 8, 5), (9, 4096, 2)))
    assert "k per batch size measured live, starting from 1-8: k=5, 9+: k=2" in v.label
    cfg = yaml.safe_load(run.serve_yaml(BASE, v, tmp_path, tmp_path / "s.yaml").read_text())
    assert cfg["additional-config"] == {"vllm_eagle3": {"live_k": True}}  # the spec comes by --capture-spec
    assert cfg["speculative-config"]["num_speculative_tokens"] == 5
    assert cfg["speculative-config"]["num_speculative_tokens_per_batch_size"] == [[1, 8, 5], [9, 4096, 2]]
    plain = yaml.safe_load(run.serve_yaml(BASE, Variant(0, NO_SPEC), tmp_path, tmp_path / "n.yaml").read_text())
    assert "additional-config" not in plain and "speculative-config" not in plain
    off = copy.deepcopy(BASE)
    off["additional-config"]["vllm_eagle3"]["live_k"] = False
    with pytest.raises(SystemExit, match="live_k"):
        run.as_shipped(live, off)
    with pytest.raises(ValueError, match="adaptive variants"):
        Variant(3, live=True)


@pytest.mark.parametrize(
    "c, point, lo, same, misses",
    [
        (4, 1.00, 0.97, [16, 16], []),
        (4, 0.999, 0.97, [16, 16], ["point < 1.00"]),
        (4, 1.10, 0.96, [16, 16], ["lower end < 0.97"]),
        (1, 2.0, 1.9, [16, 16], []),
        (1, 1.99, 1.9, [16, 16], ["point < 2.00"]),
        (16, 1.2, 1.1, [31, 32], ["greedy output differs"]),
        (16, float("nan"), float("nan"), None, ["point < 1.00", "lower end < 0.97", "greedy output differs"]),
    ],
)
def test_verdict_against_issue_41s_bar(c, point, lo, same, misses):
    assert analysis.verdict(c, {"value": point, "lo": lo, "hi": point}, same) == misses


def _results(speedup: float) -> dict:
    """A shipped run: no speculation 10 tok/s per request, the shipped server ``speedup`` x that, same text."""
    plan = build_plan(parser().parse_args(["--plan", "shipped", "--concurrency", "1", "32"]))
    variants = []
    for v in plan.variants:
        v = run.as_shipped(v, BASE)
        fast = speedup if v.k else 1.0
        cells = []
        for c in v.cell_list("throughput"):
            reqs = [
                {
                    "prompt": p,
                    "tokens": 100,
                    "latency_s": (10.0 + p % 3) / fast,
                    "text": f"t{p}",
                    "counters": [10, 30, 20, [8, 7, 5]] if v.k else None,
                }
                for p in range(plan.throughput_requests(c))
            ]
            cells.append(
                {
                    "kind": "throughput",
                    "concurrency": c,
                    "round": 0,
                    "split": None,
                    "requests": reqs,
                    "wall_s": sum(r["latency_s"] for r in reqs) / c,
                    "counters": None,
                    "chunks": 2,
                }
            )
        variants.append({**run._record(v), "cells": cells})
    meta = {
        "date": "2026-01-02 03:04 UTC",
        "command": "vllm-eagle3 bench --plan shipped",
        "duration_min": 1.0,
        "load_before": "0.1",
        "load_after": "0.2",
        "machine": {
            "cpu": "AMD EPYC 9R14",
            "nproc": "2",
            "memory": "8 GiB",
            "flags": "avx512f avx2",
            "python": "3.11",
            "torch": "2",
            "vllm": "0.32",
            "openai": "1",
            "commit": "abc1234",
        },
    }
    return {"schema": 2, "meta": meta, "plan": plan.as_dict(), "variants": variants}


def test_shipped_rows_and_pages(tmp_path, monkeypatch):
    assert host_kind({"cpu": "Intel(R) Xeon(R) Platinum 8481C", "flags": "avx512f amx_tile avx2"}) == (
        "Intel(R) Xeon(R) Platinum 8481C, AMX",
        "intel-xeon-amx",
    )
    # a run under `vllm-eagle3 emulate avx2` is never filed as an AVX2 machine (its cores are this one's)
    assert host_kind(
        {"cpu": "AMD EPYC", "flags": "avx2", "emulated": "vllm-eagle3 emulate avx2 on a CPU with avx512f"}
    ) == ("AMD EPYC, AVX2 emulated", "amd-epyc-avx2-emulated")
    data = _results(2.5)
    s = analysis.summarize(data)
    assert [(o["concurrency"], o["servers"], o["same_text"], o["misses"]) for o in s["shipped"]] == [
        (1, 2, [32, 32], []),
        (32, 1, [64, 64], []),
    ]
    assert s["shipped"][0]["speedup"]["value"] == pytest.approx(2.5)
    assert s["shipped"][0]["tau"] == pytest.approx(3.0)
    assert s["adaptive"] == []  # the live servers are not the adaptive-k plan's
    page = shipped_block(s, report.run_block(data["meta"], data["plan"]), data["meta"]["machine"])
    assert "## The shipped default against no speculation (AMD EPYC 9R14, AVX-512)" in page
    assert "Verdict: **meets it**." in page and "commit abc1234" in page
    assert "| 1 | 2 | " in page and "32/32" in page
    # the repository's page: none found, then one results file
    assert "_No run on any host kind yet:" in shipped_repo_block([])
    row = next(ln for ln in shipped_repo_block([data]).splitlines() if ln.startswith("| AMD EPYC 9R14"))
    assert row.startswith("| AMD EPYC 9R14, AVX-512 | 2026-01-02 03:04 UTC | abc1234 | 2.50")
    assert row.endswith("| **meets it** | not recorded |")  # its cells carry no live-k report
    slow = next(ln for ln in shipped_repo_block([_results(1.5)]).splitlines() if ln.startswith("| AMD EPYC 9R14"))
    assert "**misses it**: c=1 (point < 2.00" in slow
    monkeypatch.setattr(report, "REPO", tmp_path)
    assert "_No run on any host kind yet:" in report.render(None, None, adaptive_runs=[])
    (tmp_path / "bench" / "shipped-amd-epyc-avx512").mkdir(parents=True)
    (tmp_path / "bench" / "shipped-amd-epyc-avx512" / "results.json").write_text(json.dumps(data))
    text = report.render(None, None, adaptive_runs=[])
    assert "## The shipped default on each host kind" in text and row in text
    assert "## The shipped default" not in report.render(None, None)  # another page: no such section
    assert REPO.exists()
