"""``vllm-eagle3 bench`` without an engine: statistics, step split, plan, timers' install/remove, analysis and report.

No engine runs here (the benchmark itself is never part of the test suite; ``vllm-eagle3 bench --smoke`` proves
the end-to-end path). Each test names the reporting bug it guards: a wrong number in BENCHMARKS.md looks exactly as
credible as a right one.
"""

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from vllm_eagle3.tools.bench.cli import main
from vllm_eagle3.tools.bench import analysis, plan as plans, report
from vllm_eagle3.tools.bench.client import RequestRecord, spec_counters, summed
from vllm_eagle3.tools.bench.plan import EMBED_TAP, MLA_OFF, NATIVE, NATIVE_CAPTURES, NO_SPEC, Cell, Plan, Variant
from vllm_eagle3.tools.bench.run import make_native_draft, native_taps
from vllm_eagle3.tools.bench.stats import Estimate, bootstrap, cost_ratio, ideal_speedup, paired_ratio, stratified_ratio
from vllm_eagle3.tools.bench.timers import StepTimers, step_split

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------------------------------------ statistics


def test_paired_ratio_cancels_prompt_to_prompt_variation():
    """Prompts differ a lot in speed; if every prompt is exactly 2x faster with speculation the speedup is 2 with
    a zero-width interval. An unpaired bootstrap would report a wide interval and hide real effects."""
    without = {i: (128.0, 1.0 + i) for i in range(16)}  # seconds vary 1..16 across prompts
    with_ = {i: (128.0, (1.0 + i) / 2) for i in range(16)}
    est = paired_ratio(with_, without, "t")
    assert est.value == pytest.approx(2.0) and est.lo == pytest.approx(2.0) and est.hi == pytest.approx(2.0)
    assert est.n == 16 and est.excludes(1.0)


def test_paired_ratio_interval_includes_one_when_the_effect_is_noise():
    """A speedup that is only noise must be reported with an interval that includes 1 (the old report called a
    0.93 'noise' while its ranges did not overlap; the interval is what decides)."""
    without = {i: (100.0, 10.0) for i in range(16)}
    with_ = {i: (100.0, 10.0 * (1.2 if i % 2 else 0.8)) for i in range(16)}
    est = paired_ratio(with_, without, "noise")
    assert est.lo < 1.0 < est.hi


def test_bootstrap_is_deterministic_and_brackets_the_value():
    """Re-rendering BENCHMARKS.md from the same results must give the same text (seeded resampling)."""
    xs = [1.0, 2.0, 3.0, 4.0, 10.0]
    a = bootstrap(xs, lambda r: r.mean(axis=-1), "seed")
    b = bootstrap(xs, lambda r: r.mean(axis=-1), "seed")
    assert a == b and a.lo <= a.value <= a.hi
    assert Estimate(1.234, 1.1, 1.3, 5).fmt() == "1.23 [1.10-1.30]"
    assert Estimate(float("nan")).fmt() == "n/a" and Estimate(2.0).fmt(1) == "2.0"
    assert math.isnan(bootstrap([5.0], lambda r: r.mean(axis=-1), "one").lo)  # one item: no interval, not a fake one


def test_stratified_ratio_is_the_ratio_of_server_means():
    """Two servers per side: each server's mean counts once, whatever its number of steps."""
    est = stratified_ratio([[10.0] * 10, [12.0] * 2], [[20.0, 20.0], [24.0] * 5], "s")
    assert est.value == pytest.approx(11.0 / 22.0)


def test_step_models():
    """The ideal next to each achieved speedup is tau / (1 + k c); c is ONE draft forward over one target forward
    (break-even acceptance = speculative step / plain step: test_analysis_speedup_tau_break_even_and_advice)."""
    assert ideal_speedup(2.0, 3, 0.1) == pytest.approx(2.0 / 1.3)
    assert ideal_speedup(2.0, 3, 0.1, verify_factor=2.0) == pytest.approx(2.0 / 2.3)
    with pytest.raises(ValueError, match="k >= 0"):
        ideal_speedup(2.0, -1, 0.1)
    assert cost_ratio(30.0, 3, 50.0) == pytest.approx(0.2)
    assert math.isnan(cost_ratio(30.0, 0, 50.0))


# ------------------------------------------------------------------------------------------------ timers


def test_step_split_counts_pure_decode_steps_and_attributes_the_draft():
    """Prefill steps must not inflate the verify time, nor the shorter last steps; the draft runs after the
    target forward (in ``sample_tokens``) and belongs to the step before it."""
    rec = [
        ("F", 0.000, 0.080, 64),
        ("D", 0.085, 0.010, 0),  # prefill of a 64-token prompt (+ first draft)
        ("F", 0.100, 0.040, 4),
        ("D", 0.145, 0.020, 0),  # pure decode: 1 request x (k + 1) tokens
        ("F", 0.180, 0.060, 4),
        ("D", 0.245, 0.010, 0),
        ("F", 0.260, 0.050, 4),
        ("D", 0.315, 0.000, 0),
        ("F", 0.340, 0.030, 2),  # the last step verifies fewer tokens (max_tokens reached): left out
    ]
    s = step_split(rec, 4)
    assert s.steps == 3
    assert s.forward_ms == pytest.approx((40.0, 60.0, 50.0))
    assert s.draft_ms == pytest.approx((20.0, 10.0, 0.0))
    assert s.step_ms == pytest.approx((80.0, 80.0))  # the gap to the short step is out
    assert step_split([("F", 0.0, 0.1, 64)], 4).steps == 0 and step_split([], 1).steps == 0


class _Runner:
    """Stands in for the model runner's two methods (the timers' own logic only; no engine behaviour)."""

    def _model_forward(self, input_ids=None, positions=None):
        return "out"

    def propose_draft_token_ids(self, *a):
        return [1]


class _Worker(StepTimers):
    def __init__(self):
        self.model_runner = _Runner()


def test_step_timers_are_removed_after_a_timed_cell():
    """Throughput cells must run the model runner untouched: stop removes the wrappers (the old harness timed
    every cell of every variant)."""
    w = _Worker()
    assert w.bench_timers_start()["draft_timed"] is True
    assert "_model_forward" in vars(w.model_runner)
    import types

    w.model_runner._model_forward(None, positions=types.SimpleNamespace(shape=(4,)))
    w.model_runner.propose_draft_token_ids()
    recs = w.bench_timers_stop()
    assert [r[0] for r in recs] == ["F", "D"] and recs[0][3] == 4
    assert "_model_forward" not in vars(w.model_runner) and "propose_draft_token_ids" not in vars(w.model_runner)
    assert w.bench_timers_stop() == []


# ------------------------------------------------------------------------------------------------ plan


def test_default_plan_has_the_headline_cells_with_enough_prompts():
    """Issue 12: >= 16 prompts per cell, 128 tokens, k=3 vs none at 1/4/16 eager AND compiled, the opt-out, the
    incident wiring, the same-taps capture A/B (second head: plugin vs native) on two servers each, alternating, and
    a duration that fits about an hour on 2 cores (the estimate's speeds are the 2026-12-01 run's: 60.6 min)."""
    p = plans.PLANS["default"]()
    assert p.prompts >= 16 and p.max_tokens >= 128
    # steady load: C in flight over >= 4 x C requests (one wave of 16 is timed by its least-accepted request)
    assert [p.throughput_requests(c) for c in (1, 4, 16)] == [16, 16, 64]
    assert dataclasses.replace(p, waves=1).throughput_requests(16) == 16  # one wave: plan.prompts requests
    keys = [v.key for v in p.variants]
    for key in (
        "nospec",
        "embed-k3",
        "nospec+compiled",
        "embed-k3+compiled",
        "embed-k3+mla-off",
        "native-k3",
        "layers-k3",
        "native-layers-k3",
        "layers-k3#2",
        "native-layers-k3#2",
    ):
        assert key in keys
    for v in p.variants:
        if v.key in ("nospec", "embed-k3", "nospec+compiled", "embed-k3+compiled"):
            assert v.cell_list("throughput") == [1, 4, 16]
    ab = ["layers-k3", "native-layers-k3", "layers-k3#2", "native-layers-k3#2"]
    assert [keys.index(k) for k in ab] == sorted(keys.index(k) for k in ab)
    assert sum(plans.estimate_items(p).values()) < 65 * 60


def test_variant_validation_and_labels():
    """k=0 with a capture mode (or k>0 without) would mislabel a baseline row as speculative."""
    assert Variant(0, NO_SPEC).key == "nospec"
    assert Variant(3, NATIVE, replica=2).key == "native-k3#2"
    assert Variant(3, EMBED_TAP, MLA_OFF, compiled=True).key == "embed-k3+mla-off+compiled"
    assert "opted out" in Variant(3, EMBED_TAP, MLA_OFF).label
    with pytest.raises(ValueError, match="k=0 means no speculation"):
        Variant(0, EMBED_TAP)
    with pytest.raises(ValueError, match="capture must be one of"):
        Variant(3, "sglang")
    with pytest.raises(ValueError, match="replica=2"):
        Plan("x", (Variant(0, NO_SPEC), Variant(0, NO_SPEC)))
    v = Variant(3, cells=(Cell("throughput", 4),))
    assert Variant.from_dict(json.loads(json.dumps(v.as_dict()))) == v


def test_check_off_variant_key_label_and_old_results():
    """A check-off server must never be mistaken for the shipped one (its own key and label), and a results file
    written before the field reads as the check on (no check-off variant), so old runs render as they did."""
    off = Variant(3, EMBED_TAP, check=False, replica=2, cells=(Cell("throughput", 1),))
    assert off.key == "embed-k3+check-off#2" and off.config_key == "embed-k3+check-off"
    assert Variant(3, EMBED_TAP, check=False, compiled=True).key == "embed-k3+check-off+compiled"
    assert ", online wiring check off" in off.label and "check" not in Variant(3).label
    assert Variant(3).key == "embed-k3"
    old = Variant(3, cells=(Cell("throughput", 4),)).as_dict()
    del old["check"]
    assert Variant.from_dict(old).check is True
    assert Variant.from_dict(json.loads(json.dumps(off.as_dict()))) == off
    for k, capture in ((0, NO_SPEC), (3, NATIVE)):  # the check runs in the plugin's capture only
        with pytest.raises(ValueError, match="check=False needs"):
            Variant(k, capture, check=False)


def test_check_plan_measures_the_shipped_server_with_the_check_on_and_off(capsys):
    """Plan ``check``: EAGLE-3 k=3 with the embed tap, eager, the check on vs off, two servers each started on,
    off, off, on (a drift of the machine falls on both sides), throughput cells at 1/4/16 with the headline's
    sizes, in the 20-30 minutes the brief allows; the headline-only flags are refused, not silently ignored."""
    p = plans.PLANS["check"]()
    assert [v.key for v in p.variants] == ["embed-k3", "embed-k3+check-off", "embed-k3+check-off#2", "embed-k3#2"]
    assert all(v.k == 3 and v.capture == EMBED_TAP and not v.compiled for v in p.variants)
    assert all(
        [(c.kind, c.concurrency) for c in v.cells] == [("throughput", c) for c in (1, 4, 16)] for v in p.variants
    )
    assert (p.prompts, p.waves, p.max_tokens) == (16, 4, 128)
    assert 20 * 60 <= sum(plans.estimate_items(p).values()) <= 30 * 60
    assert main(["--plan", "check", "--dry-run", "--concurrency", "1", "4"]) == 0
    assert "embed-k3+check-off#2" in capsys.readouterr().out
    for flag in ("--no-opt-out", "--no-capture-ab"):
        with pytest.raises(SystemExit):
            main(["--plan", "check", "--dry-run", flag])
    assert "--no-opt-out: not part of --plan check" in capsys.readouterr().err


def test_check_off_server_gets_its_capture_spec_with_the_check_disabled(tmp_path):
    """The check-off server differs from its twin in ``check.enabled`` only: the spec's taps and its other check
    settings are kept, and the check-on server keeps the spec it was given."""
    from vllm_eagle3.resolve import load_spec_file
    from vllm_eagle3.tools.bench.run import REPO, Wiring, serve_args

    shipped = REPO / "configs/kimi_k25_eagle3.yaml"
    wiring = Wiring(tmp_path, ("--capture-spec", str(shipped)))
    assert serve_args(Variant(3), wiring, tmp_path / "s.yaml", tmp_path) == [
        "--config",
        str(tmp_path / "s.yaml"),
        "--capture-spec",
        str(shipped),
    ]
    args = serve_args(Variant(3, check=False, replica=2), wiring, tmp_path / "s.yaml", tmp_path)
    sf, orig = load_spec_file(args[-1]), load_spec_file(shipped)
    assert sf.check.enabled is False and sf.spec.taps == orig.spec.taps and sf.num_layers == orig.num_layers
    own = tmp_path / "own.yaml"
    own.write_text(shipped.read_text() + "check: {sample_every: 2}\n")
    args = serve_args(Variant(3, check=False), Wiring(tmp_path, ("--capture-spec", str(own))), own, tmp_path)
    sf = load_spec_file(args[-1])
    assert (sf.check.enabled, sf.check.sample_every) == (False, 2)


def test_native_taps_are_the_incident_default_and_written_in_vllm_ids(tmp_path):
    """The comparison must capture the incident engine's default taps 3/31/59 (SGLang's +1 on (2, L//2, L-3)),
    and the draft copy must name them in vLLM's convention (no shift) with the same weights."""
    assert native_taps(61) == (3, 31, 59)
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(
        json.dumps(
            {
                "eagle_aux_hidden_state_layer_ids": [-1, 2, 30],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30]},
                "vllm_eagle3": {"taps": "[embed, 3, 31]"},
            }
        )
    )
    (draft / "model.safetensors").write_bytes(b"x")
    out = make_native_draft(draft, tmp_path / "native", native_taps(61), 61)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]
    assert "vllm_eagle3" not in cfg
    assert (out / "model.safetensors").resolve() == (draft / "model.safetensors").resolve()


def test_request_record_and_per_request_counters():
    """ITL is measured after the first token; a request's acceptance is what vLLM's per-request metrics say of it
    (the response's ``metrics.speculative_decoding``), per position as the /metrics counters count it; a cell's
    counters are its requests' summed."""
    from openai.types import Completion
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    r = RequestRecord(0, 5, 0.9, "", ttft_s=0.5)
    assert r.itl_s == pytest.approx(0.1)
    assert math.isnan(RequestRecord(0, 5, 0.9).itl_s)
    m = RequestSpecDecodeMetrics.new(3)
    for accepted in (3, 1, 0, 2):  # four verify steps of 3 drafts each
        m.observe(3, accepted)
    resp = Completion.model_validate(
        {
            "id": "x",
            "created": 0,
            "model": "m",
            "object": "text_completion",
            "choices": [],
            "metrics": {"speculative_decoding": m.to_dict()},
        }
    )
    counters = spec_counters(resp)
    assert counters == (4, 12, 6, (3.0, 2.0, 1.0))  # position 0 accepted in 3 steps, 1 in 2, 2 in 1
    assert spec_counters(Completion.model_validate({**resp.model_dump(), "metrics": None})) is None
    assert summed([RequestRecord(0, 5, 1.0, counters=counters)] * 2 + [RequestRecord(1, 5, 1.0)]) == [
        8,
        24,
        12,
        [6.0, 4.0, 2.0],
    ]


# ------------------------------------------------------------------------------------------------ analysis


def synthetic_results(
    spec_speed: float = 2.0,
    native_slow: float = 1.0,
    native_server_slow: float = 1.0,
    plan: str = "smoke",
    check_slow: float = 1.0,
    second_server_slow: float = 1.0,
) -> dict:
    """A schema-2 results file from ``plan`` (smoke) with made-up, deterministic timings: plain decode 10 ms per
    token per prompt (varying by prompt), speculation ``spec_speed`` x faster, tau 3, the incident tau 1.
    ``native_slow`` slows the native servers' target forward only (a capture cost), ``native_server_slow`` their
    forward and draft alike (a slower server process); ``check_slow`` the requests of servers with the online
    wiring check on, ``second_server_slow`` those of every replica-2 server (server-to-server noise)."""
    p = plans.PLANS[plan]()
    variants = []
    for v in p.variants:
        speed = 1.0 if v.k == 0 else 0.5 if v.capture == NATIVE else spec_speed
        speed /= (check_slow if v.check else 1.0) * (second_server_slow if v.replica == 2 else 1.0)
        cells = []
        for cell in v.cells:
            n = {"throughput": p.prompts, "stream": p.stream_prompts}.get(cell.kind, p.split_requests(cell.concurrency))
            toks = p.max_tokens if cell.kind in ("throughput", "stream") else p.split_tokens
            reqs = []
            for i in range(n):
                lat = toks * 0.01 * (1 + 0.1 * i) / speed
                acc = 0 if v.capture == NATIVE else 2 * (toks // 3)
                counters = [toks // 3, v.k * (toks // 3), acc, [acc / 2, acc / 2, 0.0]] if v.k else None
                reqs.append(
                    {
                        "prompt": i,
                        "tokens": toks,
                        "latency_s": lat,
                        "text": f"t{i}",
                        "ttft_s": 0.05 if cell.kind == "stream" else float("nan"),
                        "counters": counters if cell.concurrency == 1 and cell.kind == "throughput" else None,
                    }
                )
            cell_counters = ([n * x for x in counters[:3]] + [[n * y for y in counters[3]]]) if v.k else None
            split = None
            if cell.kind == "split":
                server = native_server_slow if v.capture in NATIVE_CAPTURES else 1.0
                fwd = (10.0 if v.k == 0 else 14.0) * (native_slow if v.capture in NATIVE_CAPTURES else 1.0) * server
                split = {
                    "forward_ms": [fwd + 0.1 * (i % 3) for i in range(30)],
                    "draft_ms": [0.0 if v.k == 0 else 3.0 * server] * 30,
                    "step_ms": [fwd + 5.0] * 29,
                }
            cells.append(
                {
                    "kind": cell.kind,
                    "concurrency": cell.concurrency,
                    "round": 0,
                    "split": split,
                    "wall_s": sum(r["latency_s"] for r in reqs) / cell.concurrency,
                    "requests": reqs,
                    "counters": cell_counters,
                    "draft_timed": v.k > 0,
                }
            )
        variants.append(
            {
                "key": v.key,
                "variant": v.as_dict(),
                "label": v.label,
                "ready_s": 30.0,
                "error": None,
                "capture_line": "x" if v.k else "",
                "mla_calls": {"verify": 5} if v.k else {},
                "cells": cells,
            }
        )
    meta = {
        "date": "2026-12-01 12:00 UTC",
        "command": "vllm-eagle3 bench --smoke",
        "duration_min": 5.0,
        "load_before": "0.10 0.10 0.10",
        "load_after": "1.00 0.50 0.20",
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
    return {"schema": 2, "meta": meta, "plan": p.as_dict(), "variants": variants}


def test_analysis_speedup_tau_break_even_and_advice():
    """The headline numbers follow from the requests: 2x faster per prompt -> speedup 2 [2-2]; tau from the
    per-request counters; break-even = step ratio; the advice picks the faster k and flags the incident."""
    s = analysis.summarize(synthetic_results())
    emb = next(v for v in s["variants"] if v["key"] == "embed-k3")
    row = emb["by_concurrency"]["1"]
    assert row["speedup"]["value"] == pytest.approx(2.0) and row["speedup"]["lo"] == pytest.approx(2.0)
    assert emb["acceptance"]["tau"]["value"] == pytest.approx(3.0)
    assert row["break_even"]["value"] == pytest.approx((14.1 + 5.0) / (10.1 + 5.0), rel=1e-2)
    assert row["same_text"] == [4, 4]
    assert emb["mla_verify_on_decode_kernel"] and not s["variants"][0]["mla_verify_on_decode_kernel"]
    adv = [a for a in s["advice"] if a["mode"] == "eager" and a["concurrency"] == 1][0]
    assert adv["best_k"] == 3
    inc = [a for a in s["advice"] if a["mode"] == plans.SGLANG_DEFAULT_WIRING]
    assert inc and all(a["tau"]["value"] == pytest.approx(1.0) for a in inc)


def test_capture_verdict_uses_the_interval_and_the_same_config_servers():
    """A gap between plugin and native capture that is no larger than between two identical servers is not called a
    real difference, and an identical pair is 'within noise'. Both pairs are compared: the same-taps one (second
    head, same acceptance) and the shipped head's embed tap vs the incident wiring (acceptance 3 vs 1)."""
    same = analysis.summarize(synthetic_results(native_slow=1.0))["capture_ab"]
    assert {o["plugin"] for o in same} == {"layers", "embed"}
    assert all("within noise" in o["verdict"] for o in same)
    assert all(o["tau"][0] == pytest.approx(3.0) for o in same)
    assert [o["tau"][1] for o in same if o["plugin"] == "embed"] == [pytest.approx(1.0)] * 2
    slow = analysis.summarize(synthetic_results(native_slow=1.5))["capture_ab"]
    assert slow and all(o["ratio"]["hi"] < 1.0 for o in slow)
    assert all(o["normalized"]["ratio"]["hi"] < 1.0 for o in slow)  # a capture cost survives the normalization


def test_capture_cost_normalized_by_the_draft_cancels_a_slower_server():
    """A native server process that is 20 % slower at everything (forward AND draft: the shared VM's per-process
    speed) shows as a raw forward-time gap, but not once each step's forward is divided by its draft time."""
    rows = analysis.summarize(synthetic_results(native_server_slow=1.2))["capture_ab"]
    assert rows and all(o["ratio"]["hi"] < 0.9 for o in rows)
    assert all(o["normalized"]["ratio"]["value"] == pytest.approx(1.0, abs=0.01) for o in rows)
    assert all("within noise" in o["normalized"]["verdict"] for o in rows)
    text = report.capture_block(analysis.summarize(synthetic_results(native_server_slow=1.2)))
    assert "forward / draft, plugin capture (per server)" in text


def test_check_cost_is_a_paired_ratio_set_against_two_identical_servers():
    """Check on / off throughput per concurrency: servers 25 % slower with the check read 0.80 [0.80-0.80], a real
    difference; a gap smaller than between two servers of one side is not called one; no check-off server, no
    section (a headline run's page is unchanged). No advice from a plan without a no-speculation server."""
    s = analysis.summarize(synthetic_results(plan="check", check_slow=1.25))
    rows = s["check_cost"]
    assert [o["concurrency"] for o in rows] == [1, 4, 16] and all(o["servers"] == [2, 2] for o in rows)
    assert all(o["ratio"]["value"] == pytest.approx(0.8) and o["ratio"]["hi"] == pytest.approx(0.8) for o in rows)
    assert all("a real difference" in o["verdict"] for o in rows)
    assert s["advice"] == []
    text = report.render(synthetic_results(plan="check", check_slow=1.25))
    assert "### What the online wiring check costs" in text and "**0.800 [0.800-0.800]**" in text and "{{" not in text
    noisy = analysis.summarize(synthetic_results(plan="check", check_slow=1.1, second_server_slow=1.3))["check_cost"]
    assert all(o["ratio"]["value"] == pytest.approx(1 / 1.1) for o in noisy)
    assert all("within server-to-server noise" in o["verdict"] for o in noisy)
    assert [o["ratio"]["value"] for o in analysis.summarize(synthetic_results(plan="check"))["check_cost"]] == [
        pytest.approx(1.0)
    ] * 3
    assert analysis.summarize(synthetic_results())["check_cost"] == []
    assert "wiring check costs" not in report.render(synthetic_results())


def test_report_renders_every_slot_and_the_no_run_page(tmp_path):
    """BENCHMARKS.md is the template with every slot filled (a forgotten slot would print '{{name}}')."""
    text = report.render(synthetic_results())
    assert "{{" not in text and "**2.00 [2.00-2.00]**" in text and "abc1234" in text
    assert "(1 round(s))" in text  # as the committed pages say: their results were written with a "rounds" field
    empty = report.render(None)
    assert "{{" not in empty and report.NO_RUN in empty


def test_from_json_writes_the_documents(tmp_path, capsys):
    """One command regenerates BENCHMARKS.md and the plot from a results file, without any engine."""
    from vllm_eagle3.tools.bench.report_soak import NO_SOAK

    res = tmp_path / "results.json"
    res.write_text(json.dumps(synthetic_results()))
    assert main(["--from-json", str(res), "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "BENCHMARKS.md").read_text() == report.render(
        json.loads(res.read_text()), "bench.png", soak=NO_SOAK
    )
    assert (tmp_path / "bench.png").stat().st_size > 0 and "](bench.png)" in (tmp_path / "BENCHMARKS.md").read_text()
    assert "advice" in capsys.readouterr().out


def test_without_matplotlib_the_page_and_advice_are_still_written(tmp_path, capsys, monkeypatch):
    """Issue 40: matplotlib is only in the [bench] extra, and the plot was drawn before the page and the advice, so a
    run without it ended in an ImportError with both lost. Now: one line naming the extra, the page written without a
    link to a plot that was not drawn, the advice printed, the soak's plot skipped the same way."""
    import builtins

    from vllm_eagle3.tools.soak import plot_rss

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    res = tmp_path / "results.json"
    res.write_text(json.dumps(synthetic_results()))
    assert main(["--from-json", str(res), "--out-dir", str(tmp_path)]) == 0
    page = (tmp_path / "BENCHMARKS.md").read_text()
    assert "{{" not in page and "**2.00 [2.00-2.00]**" in page and "![benchmark plot]" not in page
    assert not (tmp_path / "bench.png").exists()
    out = capsys.readouterr().out
    assert "=== vllm-eagle3 bench: advice ===" in out
    assert [ln for ln in out.splitlines() if "skipped" in ln] == [
        f"[plot] {tmp_path / 'bench.png'} skipped: matplotlib is not installed (pip install 'vllm-eagle3[bench]')"
    ]
    assert plot_rss({"rss_mb_series": {"t": [], "processes": {}}}, tmp_path / "rss.png") is False
    assert not (tmp_path / "rss.png").exists()


def test_progress_counts_cells_and_minutes_left_from_the_plans_estimate():
    """Issue 40: an hour's run printed elapsed seconds only. Each cell now says 'cell i/N, ~M min left', M from the
    same estimate --dry-run prints: the whole plan's before the first cell, nothing after the last."""
    plan = plans.PLANS["default"]()
    progress = plans.Progress(plan)
    total = sum(len(v.cells) for v in plan.variants)
    est = plans.estimate_items(plan)
    assert sum(progress.left.values()) == pytest.approx(sum(est.values()))
    cells = [(v, c) for v in plan.variants for c in v.cells]
    first = progress(cells[0][0], cells[0][1].kind, cells[0][1].concurrency)
    assert first.startswith(f"cell 1/{total}, ~") and first.endswith(" min left")
    # the first server's start and its first cell are done
    done = est[(cells[0][0].key,)] + est[(cells[0][0].key, cells[0][1].kind, cells[0][1].concurrency)]
    assert first == f"cell 1/{total}, ~{(sum(est.values()) - done) / 60:.0f} min left"
    for v, c in cells[1:]:
        last = progress(v, c.kind, c.concurrency)
    assert last == f"cell {total}/{total}, ~0 min left"
    failed = plans.Progress(plan)
    failed.drop(plan.variants[0])  # a server that did not start: its cells leave the count and the estimate
    v, c = cells[len(plan.variants[0].cells)]
    assert failed(v, c.kind, c.concurrency).startswith(f"cell 1/{total - len(plan.variants[0].cells)}, ~")


def _soak_result(**over):
    verdict = {
        "no_5xx": True,
        "no_transport_errors": True,
        "only_expected_4xx": True,
        "memory_bounded": True,
        "greedy_unchanged": True,
        "healthy_at_end": True,
        "speculation_ran": True,
    }
    base = {
        "date_utc": "2026-12-01 15:00",
        "machine": "x86_64, 2 cores",
        "commit": "abc1234",
        "load_before": "0.5",
        "duration_s": 600.0,
        "warmup_s": 60.0,
        "concurrency": 8,
        "requests": 1200,
        "by_status": {"200": 1150, "400": 50},
        "transport_errors": 0,
        "early_disconnects": 40,
        "refusals_4xx": {"The min_p and logit_bias sampling parameters are not yet supported": 50},
        "completion_tokens": 30000,
        "first_errors": [],
        "rss_mb_first_last": [2000.0, 2050.0],
        "rss_growth_mb": 50.0,
        "max_growth_mb": 200.0,
        "acceptance_length": 2.5,
        "drafts": 900,
        "verdict": verdict,
        "passed": True,
    }
    base.update(over)
    return base


def test_soak_section_renders_each_check_and_the_verdict():
    """BENCHMARKS.md's soak section: counts, memory, every check by name, and a failed check stands out."""
    from vllm_eagle3.tools.bench import report_soak as soak

    ok = soak.soak_block(_soak_result())
    assert "**passed**" in ok and "1150 x 200" in ok and "2000 -> 2050" in ok and "commit abc1234" in ok
    assert "memory bounded yes" in ok and '50 x "The min_p' in ok
    bad = _soak_result(
        passed=False, verdict={**_soak_result()["verdict"], "no_5xx": False}, first_errors=["500 completion-n2: boom"]
    )
    text = soak.soak_block(bad)
    assert "**FAILED**" in text and "no 5xx **NO**" in text and "`500 completion-n2: boom`" in text
    assert soak.soak_block(None) == soak.NO_SOAK
    rendered = report.render(None, soak=soak.soak_block(_soak_result()))
    assert "## Soak" in rendered and "**passed**" in rendered


@pytest.fixture()
def fake_repo(tmp_path, monkeypatch):
    """A stand-in clone and output home: (repo, home) with bench's and soak's module globals pointed at them."""
    from vllm_eagle3.tools import soak
    from vllm_eagle3.tools.bench import cli, report_soak

    repo, home = tmp_path / "repo", tmp_path / "home"
    (repo / "bench").mkdir(parents=True)
    for module in (cli, report, report_soak, soak):
        monkeypatch.setattr(module, "REPO", repo)
    monkeypatch.setattr(cli, "OUTPUT_HOME", home)
    monkeypatch.setattr(soak, "DEFAULT_OUT_DIR", home / "soak")
    return repo, home


def test_bench_writes_outside_the_repository_by_default():
    """Issue 48: ``vllm-eagle3 bench`` overwrote the committed BENCHMARKS.md, bench/results.json and docs/bench.png
    (and ``--plan shipped`` bench/shipped-<host>/) by default. Every plan now writes under OUTPUT_HOME unless given
    --out-dir, relative paths meaning the current folder."""
    from vllm_eagle3.tools import OUTPUT_HOME, REPO
    from vllm_eagle3.tools.bench.cli import outputs, parser

    assert not OUTPUT_HOME.resolve().is_relative_to(REPO.resolve())
    for plan in plans.PLANS:
        for path in outputs(parser().parse_args(["--plan", plan])):
            assert path.is_relative_to(OUTPUT_HOME / f"bench-{plan}"), path
    assert outputs(parser().parse_args(["--out-dir", "x"]))[0] == Path("x") / "results.json"


def test_from_json_publishes_only_when_asked(fake_repo, tmp_path):
    """--from-json writes its page into the output folder; with --publish, where the repository keeps the plan's run
    (the default plan: BENCHMARKS.md, bench/results.json, docs/bench.png) and nothing in the output folder."""
    repo, home = fake_repo
    res = tmp_path / "results.json"
    res.write_text(json.dumps(synthetic_results(plan="default")))
    assert main(["--from-json", str(res)]) == 0
    assert (home / "bench-default" / "BENCHMARKS.md").exists() and not (repo / "BENCHMARKS.md").exists()
    assert main(["--from-json", str(res), "--publish"]) == 0
    assert json.loads((repo / "bench" / "results.json").read_text()) == json.loads(res.read_text())
    assert "**2.00 [2.00-2.00]**" in (repo / "BENCHMARKS.md").read_text() and (repo / "docs" / "bench.png").exists()


def test_publish_refuses_a_plan_the_repository_keeps_no_run_of(fake_repo, tmp_path, capsys):
    res = tmp_path / "results.json"
    res.write_text(json.dumps(synthetic_results(plan="smoke")))
    with pytest.raises(SystemExit) as e:
        main(["--from-json", str(res), "--publish"])
    assert e.value.code == 2 and "--publish: the repository keeps no --plan smoke run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--plan", "check", "--publish", "--dry-run"])
    assert list(fake_repo[0].rglob("*")) == [fake_repo[0] / "bench"]


def test_soak_publishes_only_when_asked(fake_repo, monkeypatch):
    """Issue 48: ``vllm-eagle3 soak`` wrote bench/soak.json and BENCHMARKS.md by default. Now soak.json goes to
    --out-dir (default outside the repository) and --publish also writes the repository's copy and page."""
    from vllm_eagle3.tools import soak

    repo, home = fake_repo
    result = {**_soak_result(), "stale_keepalive_retries": 0, "rss_late_growth_mb": 1.0, "wiring_alarms": []}
    monkeypatch.setattr(soak, "soak", lambda *a, **k: result)
    monkeypatch.setattr(soak, "plot_rss", lambda result, path: False)
    assert soak.main(["--duration", "1"]) == 0
    assert json.loads((home / "soak" / "soak.json").read_text()) == result
    assert not (repo / soak.PUBLISHED).exists() and not (repo / "BENCHMARKS.md").exists()
    assert soak.main(["--out", str(home / "mla.json"), "--publish"]) == 0
    assert (home / "mla.json").exists() and json.loads((repo / soak.PUBLISHED).read_text()) == result
    assert "**passed**" in (repo / "BENCHMARKS.md").read_text()
