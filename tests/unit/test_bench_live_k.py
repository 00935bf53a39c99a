"""The benchmark sees live k (issue 49): every cell of a server with ``live_k`` keeps the report of
``GET /v1/eagle3/wiring`` in results.json, with the k its bucket ended on and the changes during the cell; the pages
show them; an emulated host is labelled and never counted as a host kind; a sustained cell is long enough for live k
to move. No engine: fake servers and synthetic results files."""

import json

import pytest

from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.bench import analysis, cli, live_cells, report, run
from vllm_eagle3.tools.bench.client import RequestRecord
from vllm_eagle3.tools.bench.plan import JUDGE_LOADED, NO_SPEC, Cell, Plan, Variant
from vllm_eagle3.tools.bench.report_adaptive import counts_as_host_kind, shipped_block, shipped_repo_block

pytestmark = pytest.mark.unit


def _report(table, changes, steps_at_k) -> dict:
    """A LiveK.report as the endpoint shows it (the keys the bench reads, plus one it only keeps)."""
    return {
        "state": "on",
        "table": table,
        "changes": changes,
        "steps_at_k": steps_at_k,
        "gain_pct": {"27-38": {"3": 12.2}},
    }


BEFORE = _report([[1, 1, 5], [27, 38, 2]], 1, {"2": 100, "5": 40})
AFTER = _report([[1, 1, 5], [27, 38, 3], [39, 53, 2]], 3, {"2": 290, "3": 24, "5": 40})


def test_cell_entry_keeps_the_whole_report_and_the_cells_k_and_changes():
    """Guards: the results file held no live-k report, so 'no bucket changed k' lived only in commit messages."""
    e = live_cells.cell_entry(BEFORE, AFTER, 32)
    assert e["report"] == AFTER  # whole, not a digest
    assert (e["bucket"], e["k"], e["k_before"], e["changes"]) == ("27-38", 3, 2, 2)
    assert e["steps_at_k"] == {"2": 190, "3": 24}  # drafted during the cell; k=5's 40 were before it
    assert live_cells.text(live_cells.of_cell({"live_k": e}, True)) == "k 2->3 (2 changes)"
    first = live_cells.cell_entry(None, AFTER, 45)  # the first cell: no report before, bucket 39-53 new
    assert (first["bucket"], first["k"], first["k_before"], first["changes"]) == ("39-53", 2, None, 3)
    assert live_cells.text(first) == "k=2 (3 changes)"
    same = live_cells.cell_entry(AFTER, AFTER, 1)
    assert (same["k"], same["changes"], same["steps_at_k"]) == (5, 0, {})
    assert live_cells.text(same) == "k=5 (0 changes)"
    assert live_cells.text({**same, "changes": 1}) == "k=5 (1 change)"
    assert live_cells.text({**same, "state": "off: ValueError: x"}) == "k=5 (0 changes), live k off: ValueError: x"
    assert live_cells.cell_entry(BEFORE, None, 32) == {
        "report": None,
        "error": "the server showed no live_k report after the cell",
    }


def test_servers_without_live_k_say_none_and_old_files_say_not_recorded():
    assert live_cells.of_cell({"kind": "throughput"}, False) == "none"
    assert live_cells.of_cell({"kind": "throughput", "live_k": None}, False) == "none"
    assert live_cells.of_cell({"kind": "throughput"}, True) == "not recorded"  # a live server, file from before
    assert live_cells.text(None) == "none"
    failed = {"report": None, "error": "GET /v1/eagle3/wiring: URLError: refused (after the cell)"}
    assert live_cells.text(live_cells.of_cell({"live_k": failed}, True)) == f"error: {failed['error']}"


def test_after_cell_records_a_failed_read_instead_of_faking_a_report(monkeypatch):
    def refused(url, *a, **kw):
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(live_cells, "read", refused)
    before = live_cells.snapshot("http://127.0.0.1:1")
    assert before == "GET /v1/eagle3/wiring: ConnectionRefusedError: refused"
    assert live_cells.after_cell("http://127.0.0.1:1", before, 4) == {
        "report": None,
        "error": before + " (before the cell)",
    }
    monkeypatch.setattr(live_cells, "read", lambda url: AFTER)
    assert live_cells.after_cell("u", before, 4)["error"].endswith("(before the cell)")
    assert live_cells.after_cell("u", BEFORE, 32)["k"] == 3


LIVE = Variant(5, adaptive=True, live=True, schedule=((1, 8, 5), (9, 4096, 2)), cells=(Cell("throughput", 32),))


class _Server:
    def __init__(self, url: str) -> None:
        self.base_url = url

    def stop(self) -> None:
        pass


def _fake_client(monkeypatch, reports: dict[str, list]) -> list:
    """client.cell answers every request with 16 tokens; each server URL's live-k reads come from ``reports``."""
    sent = []

    def cell(url, model, prompts, c, tokens, stream=False):
        sent.append((url, [p for p, _ in prompts]))
        return 1.0, [RequestRecord(p, 16, 0.5, f"t{p}") for p, _ in prompts]

    monkeypatch.setattr(run.client, "cell", cell)
    monkeypatch.setattr(live_cells, "read", lambda url: reports[url].pop(0))
    return sent


def test_a_cell_of_a_live_server_keeps_its_report_and_a_plain_server_none(monkeypatch):
    plan = Plan("t", (LIVE,), prompts=4, max_tokens=16, waves=1)
    _fake_client(monkeypatch, {"live": [BEFORE, AFTER]})
    rec = run._run_cell("live", "m", LIVE, "throughput", 32, plan, [[1, 2]] * 40)
    assert rec["live_k"]["k"] == 3 and rec["live_k"]["changes"] == 2 and rec["live_k"]["report"] == AFTER
    nospec = Variant(0, NO_SPEC, cells=(Cell("throughput", 32),))
    monkeypatch.setattr(live_cells, "read", lambda url: pytest.fail("a server without live k is not asked"))
    assert run._run_cell("plain", "m", nospec, "throughput", 32, plan, [[1, 2]] * 40)["live_k"] is None


def test_side_by_side_cells_read_live_k_around_all_of_a_cells_turns(monkeypatch, tmp_path):
    """The shipped plan runs its servers in turns: the report before the cell's first turn and after its last."""
    live = Variant(5, adaptive=True, live=True, stretch=JUDGE_LOADED, cells=(Cell("throughput", 32),))
    nospec = Variant(0, NO_SPEC, stretch=JUDGE_LOADED, cells=(Cell("throughput", 32),))
    plan = Plan("shipped", (nospec, live), prompts=4, max_tokens=16, waves=2)
    sent = _fake_client(monkeypatch, {"live": [BEFORE, AFTER]})
    servers = {nospec.key: _Server("plain"), live.key: _Server("live")}
    monkeypatch.setattr(run, "_start", lambda v, *a, **kw: (servers[v.key], {}, tmp_path / "log"))
    monkeypatch.setattr(run, "_ready", lambda *a, **kw: True)
    monkeypatch.setattr(run, "served_model_name", lambda url: "m")
    monkeypatch.setattr(run, "memory_short", lambda kv: "")
    wirings = {NO_SPEC: None, live.capture: None}
    recs = run.run_stretch([nospec, live], plan, {}, wirings, [[1, 2]] * 64, tmp_path, tmp_path, lambda m: None)
    assert [url for url, _ in sent] == ["plain", "live", "live", "plain"]  # two turns, order reversed
    plain_cell, live_cell = recs[0]["cells"][0], recs[1]["cells"][0]
    assert plain_cell["live_k"] is None
    assert (live_cell["live_k"]["bucket"], live_cell["live_k"]["k"], live_cell["live_k"]["changes"]) == ("27-38", 3, 2)
    assert json.loads(json.dumps(live_cell))["live_k"]["report"]["gain_pct"] == {"27-38": {"3": 12.2}}


def _results(live_k_of_cell, machine_extra=None) -> dict:
    """A two-server shipped run at c=32 (no speculation, the shipped default 2x faster); the live cell's ``live_k``
    as given (absent: a file from before cells kept it)."""
    live = Variant(5, adaptive=True, live=True, stretch=JUDGE_LOADED, cells=(Cell("throughput", 32),))
    nospec = Variant(0, NO_SPEC, stretch=JUDGE_LOADED, cells=(Cell("throughput", 32),))
    plan = Plan("shipped", (nospec, live), prompts=16, max_tokens=128, waves=2)
    variants = []
    for v in plan.variants:
        reqs = [
            {"prompt": p, "tokens": 128, "latency_s": 10.0 / (2 if v.k else 1) + p % 3, "text": f"t{p}"}
            for p in range(64)
        ]
        cell = {"kind": "throughput", "concurrency": 32, "split": None, "requests": reqs, "wall_s": 20.0 / (v.k or 1)}
        cell["counters"] = None
        if v.live and live_k_of_cell is not None:
            cell["live_k"] = live_k_of_cell
        elif not v.live:
            cell["live_k"] = None
        variants.append({**run._record(v), "cells": [cell]})
    machine = {
        "cpu": "AMD EPYC",
        "nproc": "2",
        "memory": "8 GiB",
        "flags": "avx512f avx2",
        "python": "3.11",
        "torch": "2",
        "vllm": "0.32",
        "openai": "1",
        "commit": "abc1234",
        **(machine_extra or {}),
    }
    meta = {
        "date": "2026-01-02 03:04 UTC",
        "command": "vllm-eagle3 bench --plan shipped",
        "duration_min": 1.0,
        "load_before": "0.1",
        "load_after": "0.2",
        "machine": machine,
    }
    return {"schema": 2, "meta": meta, "plan": plan.as_dict(), "variants": variants}


def test_pages_show_the_k_each_cell_ended_on_and_its_changes():
    data = _results(live_cells.cell_entry(BEFORE, AFTER, 32))
    s = analysis.summarize(data)
    (row,) = s["shipped"]
    assert row["live_k"] == [{k: v for k, v in live_cells.cell_entry(BEFORE, AFTER, 32).items() if k != "report"}]
    by_key = {v["key"]: v["by_concurrency"]["32"]["live_k"] for v in s["variants"]}
    assert by_key["nospec@4"] == "none" and by_key["embed-live@4"]["k"] == 3
    page = shipped_block(s, report.run_block(data["meta"], data["plan"]), data["meta"]["machine"])
    line = next(ln for ln in page.splitlines() if ln.startswith("| 32 |"))
    assert line.endswith("| k 2->3 (2 changes) | yes |")
    cells = report.all_cells(s).splitlines()
    assert any(ln.startswith("| no speculation") and ln.endswith("| none |") for ln in cells)
    assert any(ln.startswith("| EAGLE-3 as shipped") and ln.endswith("| k 2->3 (2 changes) |") for ln in cells)
    host = next(ln for ln in shipped_repo_block([data]).splitlines() if ln.startswith("| AMD EPYC"))
    assert host.endswith("| **meets it** | c=32 k 2->3 (2 changes) |")
    old = next(ln for ln in shipped_repo_block([_results(None)]).splitlines() if ln.startswith("| AMD EPYC"))
    assert old.endswith("| **meets it** | not recorded |")


def test_emulated_rows_are_labelled_and_never_count_as_a_host_kind():
    """Guards: BENCHMARKS.md listed 'AMD EPYC, AVX2 emulated ... meets it' as a host kind, although it ran on the
    AVX-512 machine's cores (docs/adaptive-k.md: such a row does not count)."""
    emulated = _results(None, {"flags": "avx2", "emulated": "vllm-eagle3 emulate avx2 on a CPU with avx512f"})
    real = _results(None)
    assert not counts_as_host_kind(emulated["meta"]["machine"]) and counts_as_host_kind(real["meta"]["machine"])
    block = shipped_repo_block([emulated, real])
    rows = [ln for ln in block.splitlines() if ln.startswith("| AMD EPYC")]
    assert rows[0].startswith("| AMD EPYC, AVX-512 |") and "| **meets it** |" in rows[0]
    assert rows[1].startswith("| AMD EPYC, AVX2 emulated |")  # listed after the host kinds
    assert "| **emulated: does not count** as a host kind (its cells: meets it) |" in rows[1]
    assert "**meets it** |" not in rows[1]
    assert "Host kinds that meet the bar: 1 of 1 (AMD EPYC, AVX-512). Emulated, not counted: 1 (AMD EPYC, AVX2" in block
    only = shipped_repo_block([emulated])
    assert "Host kinds that meet the bar: 0 of 0. Emulated, not counted: 1" in only
    s = analysis.summarize(emulated)
    page = shipped_block(s, report.run_block(emulated["meta"], emulated["plan"]), emulated["meta"]["machine"])
    assert "Verdict: **emulated: does not count** as a host kind (its cells: meets it)." in page


def test_sustained_cells_hold_enough_steps_for_live_k_to_move(capsys):
    """Guards: at c >= 16 a shipped cell held ~110 steps, while live k needs up to ~600 in a bucket to reach the best
    k from a wrong start (tests/unit/test_live_k.py)."""
    shipped = cli.build_plan(cli.parser().parse_args(["--plan", "shipped"]))
    plan = cli.build_plan(cli.parser().parse_args(["--plan", "sustained"]))
    assert [v.key for v in plan.variants] == ["nospec@3", "embed-live@3", "nospec@4", "embed-live@4"]
    assert [v.cell_list("throughput") for v in plan.variants] == [[1, 4, 16]] * 2 + [[32, 64]] * 2
    assert plan.steps == 720 and plan.throughput_requests(32) == 576 and plan.throughput_requests(64) == 1152
    assert all(plan.steps_at(c) >= 720 > 2 * shipped.steps_at(c) for c in (16, 32, 64))
    longer = cli.build_plan(cli.parser().parse_args(["--plan", "shipped", "--sustained-steps", "1000"]))
    assert longer.throughput_requests(32) == 32 * (-(-1000 * 3 // 128) + 1) and longer.steps_at(32) >= 1000
    assert cli.main(["--plan", "sustained", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sustained load (--sustained-steps 720): throughput cells of c=1: 18 requests, ~768" in out
    assert "c=32: 576 requests, ~768" in out and "estimated duration" in out
    assert Plan("x", (), steps=0).sustained_waves() == 0
    with pytest.raises(ValueError, match="steps >= 0"):
        Plan("x", (), steps=-1)


def test_a_sustained_cell_sends_the_prompt_file_again_under_its_indices():
    prompts = [[i] for i in range(256)]
    assert run.cycled(prompts, range(254, 258)) == [(254, [254]), (255, [255]), (0, [0]), (1, [1])]
    assert run.cycled(prompts, range(3)) == list(enumerate(prompts[:3]))


def test_the_repository_page_keeps_its_benchmark_tables_generated():
    text = (REPO / "BENCHMARKS.md").read_text()
    assert "| **emulated: does not count** as a host kind" in text
    assert "live k at the end of each cell (changes in the cell)" in text
