"""Model Runner V2's EAGLE-3 tap set-up, V2's own function on the capture target: the spec's taps, or a refusal.

One vLLM-CPU engine loads the tiny 61-layer Kimi K2.5 with the capture subclasses and an EAGLE-3 draft whose config
says ids [0, 3, 31] (vLLM convention) under the spec [embed, 3, 31]; inside its worker
(vllm_eagle3/testing/v2_runner.py) V2's ``eagle3_utils.set_eagle3_aux_hidden_state_layers`` (V2's ``load_model`` step)
must accept the capture class and leave the spec's taps captured; with the ids only nested under ``eagle_config`` (V2
reads the top level only and falls back to the model's default (2, 30, 58)) the capture must refuse, not serve other
taps. V2's whole step loop (draft input on every step, greedy, acceptance) runs in tests/e2e/test_model_runner_v2.py.

Guards: a capture that breaks V2's EAGLE-3 contract (``set_aux_hidden_state_layers`` or ``SupportsEagle3`` missing on
the capture class, V2's default ids served silently). Cost: one engine start plus a 10 s checkpoint build.
"""

from __future__ import annotations

import pytest

from vllm_eagle3.spec import EMBED

pytestmark = pytest.mark.parity

LAYERS = 61  # Kimi K2.5's depth: tap 31 is its middle, as in the incident's head
SPEC = ("embed", 3, 31)
TAPS = (EMBED, 3, 31)


@pytest.fixture(scope="module")
def v2_run(tmp_path_factory):
    """V2's tap set-up on the engine's target, with the draft's ids at the top level and nested only."""
    from vllm_eagle3.testing import v2_runner
    from vllm_eagle3.testing.engine import start_engine, stop_engine
    from vllm_eagle3.testing.tiny import build_eagle3_draft, build_kimi_k25, write_spec_yaml

    root = tmp_path_factory.mktemp("v2")
    target = build_kimi_k25(root / "kimi61", num_layers=LAYERS)
    draft = build_eagle3_draft(root / "draft", target, [0, 3, 31])
    spec = write_spec_yaml(root / "spec.yaml", SPEC, num_layers=LAYERS, draft_ids_convention="vllm")
    engine = start_engine(target, draft, env={"EAGLE3_SPEC": str(spec)})
    try:
        out = {
            "set": engine.llm.collective_rpc(v2_runner.v2_set_aux_layers)[0],
            "nested_only": engine.llm.collective_rpc(v2_runner.v2_set_aux_layers_nested_only)[0],
        }
    finally:
        stop_engine(engine)
    return out


def test_v2_sets_the_spec_taps_on_the_capture_class(v2_run):
    """V2's ``set_eagle3_aux_hidden_state_layers`` reads the draft's top-level ids (0, 3, 31), calls the capture
    class (Kimi's name kept), and the spec's taps stay captured in its order."""
    got = v2_run["set"]
    assert got["v2_ids"] == (0, 3, 31)
    assert got["target_class"] == "vllm_eagle3.capture.KimiK25ForConditionalGeneration"
    assert got["capture_taps"] == TAPS


def test_v2_default_ids_are_refused_not_served(v2_run):
    """A draft whose ids sit only under ``eagle_config``: V2 ignores them and asks for the model's default (2, 30,
    58); the capture refuses (naming the spec) instead of feeding the draft taps it was not trained on."""
    said = v2_run["nested_only"]
    assert said.startswith("CaptureSpecError") and "asked to capture ids [2, 30, 58]" in said, said
    assert "top level" in said  # the fix
