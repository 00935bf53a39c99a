"""The default-on CPU MLA verify-as-decode patch (vllm_eagle3/model_patches/vllm_cpu_mla_verify_decode.py) keeps EAGLE-3
exact on every batch shape a real scheduler produces, and ``EAGLE3_CPU_MLA_VERIFY_AS_DECODE=0`` gives vLLM's own path.

Guards: a row expansion one token off (a draft token attending to its own future, or missing its own latent), a
request's rows given another request's block table or length, a short prompt or padding row misplaced in a
non-uniform batch, or a misclassified mixed batch changes the verified logits, so a greedy continuation drifts from
the target's; the first version of the patch raised on non-uniform batches and was opt-in, so served EAGLE-3 ran 0.65x
of no speculation at concurrency 4.

One engine as shipped (no variable set), float32, k=3, fed a workload built to hit the hard shapes: prompts of
1-4 tokens (whole prompts on the decode kernel) among 64-191-token ones (vLLM's prefill path), more requests than
``max_num_seqs`` so new prompts join running decodes (mixed steps, non-uniform decode query lengths), ``max_tokens``
1, 2, 9, 17 that end requests mid-draft, requests that run into ``max_model_len`` (the scheduler trims their drafts),
and a KV cache of 20 blocks (320 tokens) so requests are preempted and recomputed: the workload may or may not
preempt (requests reach the engine core while it steps, so which run together depends on timing; a fresh-clone
make test on an AMX Xeon saw none), so two 100-token prompts of 96 tokens each follow on their own, admitted together
(7 + 7 blocks) and growing to 13 blocks each: one of them must be preempted. The worker's counters must show
each shape was really taken; the preemption counter comes from vLLM's metrics. Chunked prefill cannot be exercised:
vLLM-CPU disables it for MLA (``platforms/cpu.py``). A second, small engine with ``=0`` checks the opt-out.

Reference: the target's float32 transformers greedy continuation of the same token ids — the model card's
eval_prompts.json for its prompts (a prompt extended by the first n continuation tokens continues with the rest), and
transformers' greedy (``greedy_continue`` on ``load_text_model``, the code that wrote eval_prompts.json) for the
1-4-token prompts and past the 128 stored tokens. Exact equality, no
tolerance: float32 greedy, and a wrong attention prefix moves logits by O(1), not by rounding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_eagle3.model_patches.vllm_cpu_mla_verify_decode import ENV

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
MAX_MODEL_LEN = 200
ENGINE_ARGS = dict(max_model_len=MAX_MODEL_LEN, max_num_seqs=4, num_gpu_blocks_override=20, disable_log_stats=False)
# (eval item, continuation tokens appended to its 64-token prompt, max_tokens), in arrival order; None = a short prompt
PLAN = [
    (0, 0, 24),
    (11, 1, 12),
    (1, 120, 30),
    (2, 0, 2),
    (12, 2, 12),
    (3, 40, 9),
    (4, 0, 1),
    (13, 3, 12),
    (5, 100, 24),
    (6, 0, 17),
    (14, 4, 12),
    (7, 127, 24),
    (8, 60, 40),
]
SHORT = {11, 12, 13, 14}  # these items contribute only their first `extra` prompt tokens (1-4-token prompts)
PREEMPT = [(9, 36, 96), (10, 36, 96)]  # sent on their own after PLAN: 2 x 13 blocks of KV > 20, both admitted at 7


def workload() -> list[tuple[list[int], int, list[int] | None]]:
    """(prompt ids, max_tokens, reference continuation or None = compute with transformers) per request."""
    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    out = []
    for i, extra, max_tokens in PLAN + PREEMPT:
        it = items[i]
        if i in SHORT:
            out.append((it["prompt_token_ids"][:extra], max_tokens, None))
        else:
            cont = it["continuation_token_ids"]
            out.append((it["prompt_token_ids"] + cont[:extra], max_tokens, cont[extra:]))
    return out


@pytest.fixture(scope="module")
def requests() -> list[dict]:
    """Each request with its expected tokens: the reference, cut to max_tokens and to what fits in max_model_len."""
    import torch

    from vllm_eagle3.miniature.evaluate import greedy_continue
    from vllm_eagle3.miniature.export import load_text_model

    model = load_text_model(TARGET)
    out = []
    for ids, max_tokens, ref in workload():
        n = min(max_tokens, MAX_MODEL_LEN - len(ids))
        ref = ref or []
        if len(ref) < n:  # short prompts, and requests running past the 128 stored tokens into max_model_len
            seq = greedy_continue(model, torch.tensor([ids + ref]), n - len(ref), batch=1)
            ref = seq[0, len(ids) :].tolist()
        out.append({"ids": ids, "max_tokens": max_tokens, "want": ref[:n], "n": n})
    return out


def generate(engine, reqs: list[dict]) -> list[list[int]]:
    from vllm import SamplingParams

    outs = engine.llm.generate(
        [{"prompt_token_ids": r["ids"]} for r in reqs],
        [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, ignore_eos=True) for r in reqs],
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def run_engine(env_value: str | None, *batches: list[dict]) -> dict:
    """One engine; each batch of requests generated in one call, after the one before it."""
    from vllm_eagle3.testing.engine import (
        counter_totals,
        start_engine,
        stop_engine,
        worker_applied_patches,
        worker_attention_builders,
        worker_mla_verify_calls,
    )

    engine = start_engine(TARGET, DRAFT, env={"EAGLE3_SPEC": str(SPEC), ENV: env_value}, **ENGINE_ARGS)
    try:
        got = [g for reqs in batches for g in generate(engine, reqs)]
        return {
            "got": got,
            "patches": engine.llm.collective_rpc(worker_applied_patches),
            "builders": engine.llm.collective_rpc(worker_attention_builders),
            "calls": engine.llm.collective_rpc(worker_mla_verify_calls),
            "metrics": counter_totals(engine.llm),
        }
    finally:
        stop_engine(engine)


@pytest.fixture(scope="module")
def default_run(requests) -> dict:
    """The engine as shipped: the variable unset (start_engine removes it from the environment it starts with)."""
    return run_engine(None, requests[: len(PLAN)], requests[len(PLAN) :])


@pytest.fixture(scope="module")
def opt_out_run(default_run, requests) -> dict:
    """``=0``, after the default engine has stopped (one engine at a time): three requests, one of each kind."""
    return run_engine("0", [requests[0], requests[1], requests[2]])


def assert_greedy(reqs: list[dict], got: list[list[int]], what: str) -> None:
    for r, g in zip(reqs, got):
        assert len(g) == r["n"], f"{len(r['ids'])}-token prompt, max_tokens {r['max_tokens']}: {len(g)} tokens"
        first = next((j for j, (a, b) in enumerate(zip(g, r["want"])) if a != b), None)
        assert g == r["want"], (
            f"{what}: {len(r['ids'])}-token prompt differs from the target's greedy tokens from "
            f"position {first}: {g[first : first + 5]} vs {r['want'][first : first + 5]}"
        )


def test_default_engine_verifies_on_the_decode_kernel(default_run):
    """No variable set: the worker applied the patch, its CPU MLA builder is the VARLEN one, and verification steps
    (a request with > 1 query token) ran through the decode kernel."""
    for lines, builders, calls in zip(default_run["patches"], default_run["builders"], default_run["calls"]):
        print(f"worker: {calls}, builders {builders}")
        assert any(line.startswith("vllm_cpu_mla_verify_decode: applied") for line in lines), lines
        assert builders.get("CPU_MLA") == "CPUMLAVarlenDecodeBuilder", builders
        assert calls["verify"] > 0 and calls["forward"] > 0, calls


def test_hard_batch_shapes_were_taken(default_run):
    """The workload really produced the shapes the fast path must handle, on the decode kernel: non-uniform query
    lengths, whole short prompts, steps mixed with vLLM's prefill path, prefill-only steps, and a preemption."""
    calls = default_run["calls"][0]
    for kind in ("varlen", "prompt", "mixed", "prefill_only"):
        assert calls[kind] > 0, f"no {kind!r} step in {calls}: the workload no longer exercises it"
    preemptions = default_run["metrics"].get("vllm:num_preemptions", 0)
    assert preemptions > 0, f"no preemption with a 20-block KV cache: {default_run['metrics']}"


def test_greedy_tokens_equal_the_target_greedy_continuation(default_run, requests):
    assert_greedy(requests, default_run["got"], "EAGLE-3, MLA verify on the decode kernel")


def test_drafts_were_verified_and_accepted(default_run, assert_speculation_accepted):
    """Speculation ran and the head is still accepted (a broken verify accepts ~nothing)."""
    assert_speculation_accepted(default_run["metrics"])


def test_opt_out_runs_vllms_own_path(opt_out_run, requests):
    """``=0``: vLLM's own CPU MLA builder, nothing through the patched path, same greedy tokens."""
    for builders, calls in zip(opt_out_run["builders"], opt_out_run["calls"]):
        assert builders.get("CPU_MLA") != "CPUMLAVarlenDecodeBuilder", builders
        assert not any(calls.values()), f"the patched path ran with {ENV}=0: {calls}"
    assert opt_out_run["metrics"].get("vllm:spec_decode_num_drafts", 0) > 0
    assert_greedy(requests[:3], opt_out_run["got"], f"EAGLE-3 with {ENV}=0")
