"""Parity fixtures shared across modules: the shipped miniature's prompt and ONE vLLM run on it.

``test_draft_parity.py`` (draft logits) and ``test_sglang_legacy.py`` (SGLang 0.5.12.post1's taps vs the plugin's)
both need what the vLLM plugin hands the draft for the miniature pair; starting the engine once per session instead
of once per module saves one engine start-up (~30-60 s eager on the 2-core CI box).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MINI_TARGET = REPO / "models" / "kimi-k25-mini"
MINI_DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
MINI_SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"


@pytest.fixture(scope="session")
def mini_prompt() -> list[int]:
    """The first held-out evaluation prompt of the shipped draft (token ids)."""
    items = json.loads((MINI_DRAFT / "eval_prompts.json").read_text())["items"]
    return [int(t) for t in items[0]["prompt_token_ids"]]


def record_first_draft_call(target: Path, draft: Path, spec: Path, prompt: list[int]) -> dict:
    """One offline vLLM engine (float32, eager, the plugin with ``spec``) serving ``draft`` for ``prompt``, stopped
    before returning: the first draft step of its first proposal (the prefill proposal: one row per prompt token).
    ``aux`` = the plugin's ``cat`` of the spec's taps BEFORE ``fc`` ``[T, n * hidden]``, ``input_ids``,
    ``positions``, ``logits``, ``sampled`` (the target's 2 greedy tokens), ``draft_classes`` (vLLM's draft model
    class per worker)."""
    from vllm import SamplingParams

    from vllm_eagle3.testing.draft_probe import install_draft_recorder, recorded_draft_calls
    from vllm_eagle3.testing.engine import start_engine, stop_engine

    engine = start_engine(target, draft, env={"EAGLE3_SPEC": str(spec)}, max_model_len=512)
    try:
        names = engine.llm.collective_rpc(install_draft_recorder)
        out = engine.llm.generate(
            [{"prompt_token_ids": prompt}],
            SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
            use_tqdm=False,
        )
        calls = engine.llm.collective_rpc(recorded_draft_calls)[0]
    finally:
        stop_engine(engine)
    assert calls, f"no draft proposal was recorded for {draft.name}: did speculation run?"
    first = calls[0]
    assert first["aux"].shape[0] == len(prompt), (
        f"first proposal has {first['aux'].shape[0]} rows, expected the {len(prompt)}-token prefill"
    )
    return {**first, "sampled": list(out[0].outputs[0].token_ids), "draft_classes": names}


@pytest.fixture(scope="session")
def first_draft_call():
    """``first_draft_call(target, draft, spec, prompt)``: :func:`record_first_draft_call` (one engine start per
    call; request it from a fixture that runs after any other engine fixture has stopped its engine)."""
    return record_first_draft_call


@pytest.fixture(scope="session")
def mini_vllm_draft_call(mini_prompt) -> dict:
    """The first draft step of vLLM's first proposal for ``mini_prompt`` with the shipped head and spec
    ``[embed, 3, 31]`` (:func:`record_first_draft_call`)."""
    return record_first_draft_call(MINI_TARGET, MINI_DRAFT, MINI_SPEC, mini_prompt)
