"""Offline ``vllm.LLM`` with an EAGLE-3 draft through the plugin, taps [embed, 3, 31], on a DeepSeek-V3 target.

Guards: (1) stock vLLM 0.32 crashes on tap 0 on this path (tests/e2e/test_stock_vllm.py) — with the plugin the
engine serves; (2) speculative decoding must never change greedy output: token-identical to the
non-speculative run (float32, so random-model near-ties cannot flip); (3) the incident's silent miswiring —
the start-up log must name the taps and where they came from, and a draft whose ids disagree with the spec,
or whose ids have no declared convention, must stop the engine with a clear message.
"""

from __future__ import annotations

import re

import pytest

from vllm_eagle3.testing.engine import prompt_ids, start_engine, stop_engine
from vllm_eagle3.testing.tiny import write_spec_yaml

pytestmark = pytest.mark.e2e

MAX_TOKENS = 32  # tests/conftest.py OFFLINE_MAX_TOKENS


@pytest.fixture(scope="module")
def runs(dsv3_dir, dsv3_eagle3_run):
    """Greedy tokens without the draft (this module's engine) and with it (the session's shared speculative engine,
    tests/conftest.py), and the speculative engine's log."""
    from vllm import SamplingParams

    plain = start_engine(dsv3_dir)
    try:
        params = SamplingParams(max_tokens=dsv3_eagle3_run["max_tokens"], temperature=0.0, ignore_eos=True)
        outs = plain.llm.generate(
            [{"prompt_token_ids": prompt_ids(p)} for p in dsv3_eagle3_run["prompts"]], params, use_tqdm=False
        )
        reference = [list(o.outputs[0].token_ids) for o in outs]
    finally:
        stop_engine(plain)
    print(f"engine start-up: plain {plain.startup_s:.1f} s, eagle3 {dsv3_eagle3_run['startup_s']:.1f} s")
    return reference, dsv3_eagle3_run["greedy"], dsv3_eagle3_run["log"], dsv3_eagle3_run["spec"]


def test_greedy_output_identical_to_non_speculative(runs):
    """EAGLE-3 with taps [embed, 3, 31] changes nothing in greedy output (and does not crash on tap 0)."""
    reference, speculative, _, _ = runs
    assert all(len(r) == MAX_TOKENS for r in reference)
    assert len({t for r in reference for t in r}) > 4, f"degenerate reference output {reference}"
    assert speculative == reference


def test_startup_log_names_taps_and_source(runs):
    """One worker log line names the taps [embed, 3, 31], the spec file they came from and vLLM's ids."""
    _, _, log, spec_path = runs
    lines = [line for line in log.splitlines() if "vllm-eagle3: capturing taps" in line]
    assert len(lines) == 1, f"expected one start-up tap line, got {lines}"
    assert "capturing taps [embed, 3, 31]" in lines[0]
    assert f"from {spec_path}" in lines[0]
    assert "vLLM runner ids [0, 3, 31]" in lines[0]
    assert re.match(r"\((Worker|EngineCore)[^)]*\)", lines[0]), "the line must come from the engine's processes"


@pytest.mark.parametrize(
    "draft_ids, env, message",
    [
        pytest.param(
            [2, 16, 29],
            {"EAGLE3_SPEC": "SPEC"},
            "and the draft config disagree: its ids [2, 16, 29] read as vllm are taps [2, 16, 29]",
            id="draft-ids-disagree-with-spec",
        ),
        pytest.param([0, 3, 31], {}, "have no stated convention", id="no-declared-convention"),
    ],
)
def test_engine_refuses_to_capture_other_taps(dsv3_dir, make_draft, tmp_path, draft_ids, env, message):
    """The incident's wiring (draft ids = vLLM's default (2, L//2, L-3) while the head wants [embed, 3, 31]), or ids
    with no stated convention, stop the engine at start-up with the reason, instead of serving other taps."""
    spec = write_spec_yaml(tmp_path / "spec.yaml", ["embed", 3, 31], num_layers=32, draft_ids_convention="vllm")
    env = {k: (str(spec) if v == "SPEC" else v) for k, v in env.items()}
    engine = None
    with pytest.raises(Exception) as info:
        engine = start_engine(dsv3_dir, make_draft(dsv3_dir, draft_ids), env=env)
    stop_engine(engine)
    log = getattr(info.value, "engine_log", "")
    assert "CaptureSpecError" in log and message in log, log[-3000:]
