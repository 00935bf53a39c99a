"""Capture parity: the taps a real vLLM target hands the EAGLE-3 draft are transformers' hidden states.

Guards the incident's bug (the draft trained on ``cat([embed, layer 3, layer 31])`` was fed other hidden
states) and vLLM 0.32's DeepSeek/Kimi path, which crashes on tap 0 and sorts taps by layer: for the same
weights and prompt, the aux tensors vLLM's runner receives (read in the worker by a forward hook,
``vllm_eagle3.testing.taps``) must be HF ``output_hidden_states[k]`` for each spec tap k, in the spec's order.

Tolerances (float32 everywhere, every prompt position):
- ``embed``: bit-identical (both engines look up the same float32 embedding rows).
- every other tap: ``rtol=1e-4, atol=1e-4`` element-wise. The engines run the same float32 math with different
  kernels (oneDNN GEMMs vs torch matmul, vLLM's fused MoE vs transformers' expert loop, SDPA vs eager softmax),
  so only reassociation separates them: measured max abs difference ~1e-6 at tap 3 and ~1e-5 at tap 31 on
  these weights (hidden-state magnitudes ~1-10). HF's neighbouring taps k-1 and k+1 are > 1e-2 away, so an
  off-by-one capture cannot pass.
- Before ``vllm_eagle3/model_patches/vllm_cpu_rope_3d.py`` vLLM-CPU rotated MLA queries wrongly (3-D strided q in the
  CPU rope kernel): positions >= 1 differed by O(1) while position 0 matched. Comparing every position guards it.
"""

from __future__ import annotations

import pytest
import torch

from vllm_eagle3.testing.engine import prompt_ids, start_engine, stop_engine
from vllm_eagle3.testing.taps import assert_is_tap, prefill_taps
from vllm_eagle3.testing.tiny import load_kimi_k25_hf, write_spec_yaml

pytestmark = pytest.mark.parity

DRAFT_IDS = [0, 3, 31]  # vLLM convention: tap k is id k


def vllm_prefill_taps(target, draft, spec_path) -> tuple[list[torch.Tensor], str]:
    """Start vLLM with the plugin + draft + spec, prefill the prompt once, return its aux list and the log."""
    engine = start_engine(target, draft, env={"EAGLE3_SPEC": str(spec_path)})
    try:
        return prefill_taps(engine, prompt_ids()), engine.log()
    finally:
        stop_engine(engine)


def assert_tap_matches(got: torch.Tensor, hf_states: tuple[torch.Tensor, ...], tap: int) -> None:
    """The module docstring's tolerances, through the shared check (vllm_eagle3/testing/taps.py)."""
    assert_is_tap(got, hf_states, tap, atol=1e-4, rtol=1e-4, neighbour=1e-2, where="vLLM plugin")


@pytest.fixture(scope="module")
def dsv3_case(dsv3_dir, dsv3_eagle3_run):
    """The session's shared tiny DeepSeek-V3 + EAGLE-3 engine (tests/conftest.py, spec [embed, 3, 31], draft ids
    [0, 3, 31]): the aux list its runner received at prefill, and transformers' hidden states for the same prompt."""
    taps, log = dsv3_eagle3_run["prefill_taps"], dsv3_eagle3_run["log"]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(dsv3_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        states = hf(torch.tensor([prompt_ids()]), output_hidden_states=True).hidden_states
    return taps, states, log


@pytest.fixture(scope="module")
def kimi_case(kimi_dir, make_draft, tmp_path_factory):
    """Kimi K2.5 with the spec in a NON-ascending order: [31, embed, 3]."""
    spec = write_spec_yaml(
        tmp_path_factory.mktemp("spec") / "spec.yaml", [31, "embed", 3], num_layers=32, draft_ids_convention="vllm"
    )
    taps, log = vllm_prefill_taps(kimi_dir, make_draft(kimi_dir, DRAFT_IDS), spec)
    hf = load_kimi_k25_hf(kimi_dir)
    with torch.no_grad():
        states = hf(input_ids=torch.tensor([prompt_ids()]), output_hidden_states=True).hidden_states
    return taps, states, log


def test_deepseek_v3_taps_equal_hf_hidden_states(dsv3_case):
    """Spec [embed, 3, 31] on DeepSeek-V3: aux = [HF hs[0], hs[3], hs[31]] (stock vLLM crashes on tap 0)."""
    taps, states, _ = dsv3_case
    assert len(taps) == 3
    for got, tap in zip(taps, (0, 3, 31)):
        assert_tap_matches(got, states, tap)


def test_kimi_k25_taps_follow_spec_order(kimi_case):
    """Spec [31, embed, 3] on Kimi K2.5: aux = [hs[31], hs[0], hs[3]] — the spec's order, not vLLM's sorted one."""
    taps, states, log = kimi_case
    assert len(taps) == 3
    for got, tap in zip(taps, (31, 0, 3)):
        assert_tap_matches(got, states, tap)
    assert "capturing taps [31, embed, 3]" in log
