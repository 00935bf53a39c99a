"""The opt-in CPU MLA patch (``VLLM_EAGLE3_CPU_MLA_VERIFY_AS_DECODE=1``, model_patches/vllm_cpu_mla_verify_decode.py)
keeps EAGLE-3 exact: the shipped miniature + its head, served with speculative tokens verified on the MLA decode
kernel (one row per query token), gives the target's greedy tokens.

Guards: a row expansion one token off (a draft token attending to its own future, or missing its own latent) or a
misclassified batch changes the verified logits, so a greedy continuation drifts from the target's. The reference
is the model card's float32 transformers greedy continuation of the same token ids (eval_prompts.json), which vLLM
without the patch reproduces (tests/e2e/test_serving.py: speculative == non-speculative; tests/parity: vLLM ==
transformers to ~1e-6). Exact equality, no tolerance: float32 greedy, and a wrong attention prefix moves logits by
O(1), not by rounding. One engine; BENCHMARKS.md has its speed (1.5-1.7x verify forward).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_patches.vllm_cpu_mla_verify_decode import ENV

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
NUM_PROMPTS = 4
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def run() -> dict:
    from vllm import SamplingParams

    from vllm_eagle3.testing.engine import (counter_totals, start_engine, stop_engine, worker_applied_patches,
                                            worker_mla_verify_calls)

    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"][:NUM_PROMPTS]
    engine = start_engine(TARGET, DRAFT, env={"VLLM_EAGLE3_SPEC": str(SPEC), ENV: "1"}, max_model_len=512,
                          disable_log_stats=False)
    try:
        patches = engine.llm.collective_rpc(worker_applied_patches)
        outs = engine.llm.generate([{"prompt_token_ids": it["prompt_token_ids"]} for it in items],
                                   SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
                                   use_tqdm=False)
        calls = engine.llm.collective_rpc(worker_mla_verify_calls)
        metrics = counter_totals(engine.llm)
    finally:
        stop_engine(engine)
    return {"patches": patches, "calls": calls, "greedy": [list(o.outputs[0].token_ids) for o in outs],
            "want": [it["continuation_token_ids"][:MAX_TOKENS] for it in items], "metrics": metrics}


def test_worker_verifies_on_the_decode_kernel(run):
    """The patch really ran in the worker (not only in the test process): installed there, and its multi-token
    (verification) path was taken."""
    for lines, calls in zip(run["patches"], run["calls"]):
        assert any(line.startswith("vllm_cpu_mla_verify_decode: applied") for line in lines), lines
        print(f"worker: {calls}")
        assert calls["expanded"] > 0, f"no verification step went through the decode kernel: {calls}"


def test_greedy_tokens_equal_the_target_greedy_continuation(run):
    for i, (got, want) in enumerate(zip(run["greedy"], run["want"])):
        first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, f"prompt {i}: EAGLE-3 with the MLA decode-kernel verify differs from the target's " \
                            f"greedy tokens from position {first}: {got[first:first + 5]} vs {want[first:first + 5]}"


def test_drafts_were_verified_and_accepted(run):
    """Speculation ran through the patched path and the head is still accepted (a broken verify accepts ~nothing)."""
    m = run["metrics"]
    drafts, accepted = m.get("vllm:spec_decode_num_drafts", 0), m.get("vllm:spec_decode_num_accepted_tokens", 0)
    print(f"drafts {drafts}, accepted tokens {accepted}, acceptance length {1 + accepted / max(1, drafts):.3f}")
    assert drafts > 0 and 1 + accepted / drafts > 2.0, m
