"""What STOCK vLLM 0.32 does with EAGLE-3 ids [0, 3, 31] on a DeepSeek-V3 target (the plugin's capture excluded).

Guards against forgetting why the plugin exists: vLLM's DeepSeek/Kimi forward computes
``hidden_states + residual`` before layer 0, where ``residual`` is None, so the first generate dies with
``TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'``. If a vLLM release fixes this,
this test fails and tells us to re-check (and maybe retire) the capture subclasses.

Only the plugin's model patches are loaded (``VLLM_PLUGINS=vllm_eagle3_model_patches``): without the CPU
block-size patch the engine would stop earlier, at KV-cache set-up, for an unrelated reason.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from vllm_eagle3.testing.engine import prompt_ids, start_engine, stop_engine

pytestmark = pytest.mark.e2e

PATCHES_ONLY = "vllm_eagle3_model_patches"


def test_stock_vllm_crashes_on_embedding_tap(dsv3_dir, make_draft):
    """Stock vLLM accepts ids (0, 3, 31), then the first forward dies on Tensor + None."""
    from vllm import SamplingParams

    names = {e.name for e in entry_points(group="vllm.general_plugins")}
    assert PATCHES_ONLY in names, (
        f"entry point {PATCHES_ONLY} is not installed (found {sorted(names)}); pyproject.toml needs "
        f'`{PATCHES_ONLY} = "vllm_eagle3.model_patches.vllm_plugin:register"` under vllm.general_plugins, '
        "then pip install -e ."
    )
    engine = start_engine(dsv3_dir, make_draft(dsv3_dir, [0, 3, 31]), env={"VLLM_PLUGINS": PATCHES_ONLY})
    try:
        with pytest.raises(Exception) as info:
            engine.llm.generate(
                [{"prompt_token_ids": prompt_ids()}], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False
            )
        log = engine.log()
    finally:
        stop_engine(engine)
    assert type(info.value).__name__ == "EngineDeadError", repr(info.value)
    assert "Using auxiliary layers from speculative config: (0, 3, 31)" in log
    assert "vllm-eagle3: capturing taps" not in log, "the plugin's capture was loaded; this must be stock vLLM"
    assert "unsupported operand type(s) for +: 'Tensor' and 'NoneType'" in log, log[-3000:]
