"""The pure math of ``vllm-eagle3 bench``: statistics, ideal speedup, cost ratio, trace step split, client timing.

No engine runs here (the benchmark itself is never part of the test suite). Each test names the reporting bug it
guards: a wrong number in BENCHMARKS.md looks exactly as credible as a right one.
"""

import json
import math

import pytest

from vllm_eagle3.tools.bench import (
    EMBED_TAP,
    NATIVE,
    NO_SPEC,
    MD_BEGIN,
    MD_END,
    RequestTiming,
    Variant,
    cost_ratio,
    ideal_speedup,
    make_native_draft,
    native_taps,
    stat,
    step_split,
    write_markdown,
)
from vllm_eagle3.tools.metrics import SpecDecodeCounters

pytestmark = pytest.mark.unit


def test_stat_median_and_spread_ignore_nan():
    """A failed round (NaN tok/s) must not turn the median of the others into NaN, nor count as a repeat."""
    s = stat([3.0, float("nan"), 1.0, 2.0, None])
    assert (s.median, s.lo, s.hi, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.fmt(1) == "2.0 [1.0-3.0]"
    empty = stat([float("nan")])
    assert empty.n == 0 and math.isnan(empty.median) and empty.fmt() == "n/a"


def test_ideal_speedup_is_tau_over_one_plus_kc():
    """The ideal next to each achieved speedup is tau / (1 + k c); the verify-aware model divides by v + k c."""
    assert ideal_speedup(2.0, 3, 0.1) == pytest.approx(2.0 / 1.3)
    assert ideal_speedup(1.0, 0, 0.5) == 1.0  # no speculation, no gain, no loss
    assert ideal_speedup(2.0, 3, 0.1, verify_factor=2.0) == pytest.approx(2.0 / 2.3)
    with pytest.raises(ValueError, match="k >= 0"):
        ideal_speedup(2.0, -1, 0.1)


def test_cost_ratio_is_per_draft_forward():
    """c is ONE draft forward over one target forward: the step's draft time is split over its k forwards."""
    assert cost_ratio(30.0, 3, 50.0) == pytest.approx(0.2)
    assert math.isnan(cost_ratio(30.0, 0, 50.0))
    assert math.isnan(cost_ratio(30.0, 3, float("nan")))


def test_step_split_counts_pure_decode_steps_and_attributes_the_draft():
    """Prefill steps must not inflate the verify time, nor the shorter last steps; the draft runs after the
    target forward (in ``sample_tokens``) and belongs to the step before it."""
    k, conc = 3, 1
    rec = [
        ("F", 0.000, 0.080, 64), ("D", 0.085, 0.010, 0),  # prefill of a 64-token prompt (+ first draft)
        ("F", 0.100, 0.040, 4), ("D", 0.145, 0.020, 0),  # pure decode: 1 request x (k + 1) tokens
        ("F", 0.180, 0.060, 4), ("D", 0.245, 0.010, 0),
        ("F", 0.260, 0.050, 4), ("D", 0.315, 0.000, 0),
        ("F", 0.340, 0.030, 2),  # the last step verifies fewer tokens (max_tokens reached): left out
    ]
    s = step_split(rec, conc * (k + 1))
    assert s.steps == 3
    assert s.forward_ms == pytest.approx(50.0)  # (40 + 60 + 50) / 3
    assert s.draft_ms == pytest.approx(10.0)  # (20 + 10 + 0) / 3
    assert s.step_ms == pytest.approx(80.0)  # decode-to-decode starts: 80, 80 ms (the gap to the short step is out)
    assert s.other_ms == pytest.approx(20.0)


def test_step_split_without_decode_steps_is_empty_not_an_error():
    """A round whose timers recorded no pure decode step reports n/a instead of crashing the whole run."""
    s = step_split([("F", 0.0, 0.1, 64)], 4)
    assert s.steps == 0 and math.isnan(s.forward_ms)
    assert step_split([], 1).steps == 0


def test_request_timing_itl_excludes_the_first_token():
    """ITL is measured after the first token (TTFT separate); chunks of several tokens (accepted drafts) count
    each token."""
    t = RequestTiming.from_arrivals([(0.5, 1), (0.6, 3), (0.9, 5)])
    assert (t.tokens, t.ttft, t.latency) == (5, 0.5, 0.9)
    assert t.itl == pytest.approx(0.1)
    assert math.isnan(RequestTiming.from_arrivals([(0.2, 1)]).itl)


def test_counter_deltas_give_round_acceptance():
    """Acceptance of one round is the difference of two /metrics snapshots, not the server's lifetime total."""
    before = SpecDecodeCounters(10, 30, 12, (6.0, 4.0, 2.0))
    after = SpecDecodeCounters(20, 60, 27, (13.0, 9.0, 5.0))
    d = after - before
    assert d.acceptance_length == pytest.approx(2.5)
    assert d.per_position == pytest.approx((0.7, 0.5, 0.3))


def test_variant_rejects_inconsistent_k_and_capture():
    """k=0 with a capture mode (or k>0 without) would mislabel a baseline row as speculative."""
    assert Variant(0, NO_SPEC).key == "nospec"
    assert Variant(3, NATIVE, "[3, 31, 59]").key == "native-k3"
    with pytest.raises(ValueError, match="k=0 means no speculation"):
        Variant(0, EMBED_TAP)
    with pytest.raises(ValueError, match="capture must be one of"):
        Variant(3, "sglang")


def test_native_taps_are_the_incident_default_and_written_in_vllm_ids(tmp_path):
    """The comparison must capture the incident engine's default taps 3/31/59 (SGLang's +1 on (2, L//2, L-3)),
    and the draft copy must name them in vLLM's convention (no shift) with the same weights."""
    assert native_taps(61) == (3, 31, 59)
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [-1, 2, 30],
                                                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30]},
                                                   "vllm_eagle3": {"taps": "[embed, 3, 31]"}}))
    (draft / "model.safetensors").write_bytes(b"x")
    out = make_native_draft(draft, tmp_path / "native", native_taps(61), 61)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]
    assert "vllm_eagle3" not in cfg
    assert (out / "model.safetensors").resolve() == (draft / "model.safetensors").resolve()


def test_write_markdown_keeps_hand_written_text(tmp_path):
    """Re-running the benchmark replaces only the results block, never the method and findings around it."""
    md = tmp_path / "B.md"
    md.write_text(f"# B\n\nmethod text\n\n{MD_BEGIN}\nold\n{MD_END}\n\nfindings text\n")
    write_markdown(md, f"{MD_BEGIN}\nnew\n{MD_END}")
    text = md.read_text()
    assert "method text" in text and "findings text" in text and "new" in text and "old" not in text
