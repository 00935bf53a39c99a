"""Four taps end to end on vLLM (issue 15 item 5): spec ``[embed, 3, 31, 59]`` (configs/kimi_k25_eagle3_4tap.yaml) on
the shipped 61-layer miniature with a Llama-style head whose ``fc`` takes 4 x hidden inputs
(models/kimi-k25-mini-eagle3-4tap, trained on those taps).

Guards what the static 4-tap checks (tests/unit/test_resolve.py, test_convert_inspect.py, checkpoint fan-in) cannot
see: a fourth tap dropped, duplicated or reordered by the plugin's capture (it hands vLLM's DeepSeek model only the
non-embed ids and rebuilds the list in the spec's order), vLLM's runner or proposer assuming three aux states, and a
head trained on four taps being fed something else while serving.

Two engine starts, one after the other (a 2-core box): one offline ``vllm.LLM`` (eager, float32) whose worker is
observed (the taps the target returns, the draft's input before ``fc``), then one ``vllm-eagle3 serve`` server, the
user's path, which is measured from outside (greedy text, ``/metrics``).

Tolerances (float32 everywhere, same weights, same token ids):
- ``embed``: bit-identical to transformers' ``hidden_states[0]`` (an embedding-row lookup, no arithmetic).
- taps 3, 31, 59: every element within ``TAP_REL = 1e-4`` of the position-independent scale max |HF value| of that
  tap. The trained miniature carries massive activations (max |hidden_states[k]| ~10^3), so a fixed ``atol`` would be
  below one float32 ulp of the largest elements; the engines run the same float32 math with other kernels (oneDNN
  GEMMs vs torch matmul, vLLM's fused MoE vs transformers' expert loop, MLA decode vs eager attention) whose
  re-association grows with depth. Measured on the first eval prompt (64 tokens, max |value| ~300): 1.4e-5 at tap 3,
  7.4e-6 at tap 31, 5.5e-6 at tap 59 of max |value|. HF's neighbouring taps are >= 2.1e-2 away (tap 3 vs 2); the
  test asserts > 100 x ``TAP_REL`` for k-1 and k+1, so an off-by-one capture cannot pass.
- The draft's input: the recorded ``cat`` is compared with the recorded taps bit for bit (the same tensors, only
  concatenated), and chunk i with transformers' ``hidden_states[spec tap i]`` as above.
- Served greedy text: exact. Reference = the target's float32 greedy continuation recorded with the prompts
  (``eval_prompts.json``, transformers; vLLM without speculation gives the same tokens: tests/e2e/test_compiled.py),
  which saves a non-speculative server start. A wrong accept/reject changes tokens by O(1) logits, not by a tie.
- Served acceptance: > 1.5 (the shared ``assert_speculation_accepted`` floor, tests/conftest.py) with the TRAINED
  head (measured 2.124 over 242 drafts at k=3, 8 prompts x 64 tokens; its card's served walk at k=3 is 2.231 over 128
  tokens); an untrained head (``EAGLE3_E2E_DRAFT4=/tmp/...`` for development) fails it, as it should.

Measured wall time: 143 s for the module (offline engine ready 39 s, server ready 57 s) under the engine lock.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from vllm_eagle3.spec import EMBED

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = Path(os.environ.get("EAGLE3_E2E_DRAFT4", REPO / "models" / "kimi-k25-mini-eagle3-4tap"))
SPEC = REPO / "configs" / "kimi_k25_eagle3_4tap.yaml"
SERVE_CONFIG = REPO / "configs" / "serve_kimi_k25_mini.yaml"
TAPS = (EMBED, 3, 31, 59)  # the spec's order
HIDDEN = 128
TAP_REL = 1e-4
NUM_PROMPTS = 8
MAX_TOKENS = 64
START_TIMEOUT_S = 900

pytestmark = [pytest.mark.e2e]
if not (DRAFT / "config.json").is_file():
    pytestmark.append(
        pytest.mark.skip(
            reason=f"the four-tap head is not there yet ({DRAFT}); train it with `python -m vllm_eagle3.miniature."
            f"train_draft --spec {SPEC.relative_to(REPO)}` or point EAGLE3_E2E_DRAFT4 at a head"
        )
    )


def say(line: str) -> None:
    print(f"[four-taps] {line}", flush=True)


def eval_items(n: int) -> list[dict]:
    """The first ``n`` held-out prompts with the target's greedy continuation (the head's own file, else the shipped
    head's: both are the target's float32 greedy continuations, independent of the head)."""
    path = DRAFT / "eval_prompts.json"
    if not path.is_file():
        path = REPO / "models" / "kimi-k25-mini-eagle3" / "eval_prompts.json"
    return json.loads(path.read_text())["items"][:n]


def assert_is_tap(where: str, got: torch.Tensor, states, tap: int) -> float:
    """``got`` is transformers' ``hidden_states[tap]`` (bit-exact for the embedding) and not a neighbour; returns the
    relative difference (the shared check, vllm_eagle3/testing/taps.py, at this module's TAP_REL)."""
    from vllm_eagle3.testing.taps import assert_is_tap as check

    return check(got, states, tap, rel=TAP_REL, where=where)


# ------------------------------------------------------------------------------------------------- offline engine


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return [int(t) for t in eval_items(1)[0]["prompt_token_ids"]]


@pytest.fixture(scope="module")
def offline(prompt) -> dict:
    """One offline engine with the 4-tap head: the target's aux list and the draft's first input for ``prompt``'s
    prefill, and the start-up log. The engine is stopped before the server below starts."""
    from vllm import SamplingParams

    from vllm_eagle3.testing.draft_probe import install_draft_recorder, recorded_draft_calls
    from vllm_eagle3.testing.engine import start_engine, stop_engine
    from vllm_eagle3.testing.taps import install_recorder, recorded_taps

    engine = start_engine(TARGET, DRAFT, env={"EAGLE3_SPEC": str(SPEC)}, max_model_len=512)
    try:
        engine.llm.apply_model(install_recorder)
        names = engine.llm.collective_rpc(install_draft_recorder)
        engine.llm.generate(
            [{"prompt_token_ids": prompt}],
            SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
            use_tqdm=False,
        )
        records = engine.llm.apply_model(recorded_taps)[0]
        calls = engine.llm.collective_rpc(recorded_draft_calls)[0]
        log = engine.log()
    finally:
        stop_engine(engine)
    say(f"offline engine ready after {engine.startup_s:.1f} s; draft class {names}")
    prefill = [r for r in records if r and r[0].shape[0] == len(prompt)]
    assert prefill, (
        f"no target forward over the {len(prompt)}-token prompt; got {[[tuple(t.shape) for t in r] for r in records]}"
    )
    assert calls, "no draft proposal was recorded: did speculation run?"
    return {"taps": prefill[0], "draft_aux": calls[0]["aux"], "log": log}


@pytest.fixture(scope="module")
def hf_states(prompt):
    from vllm_eagle3.miniature import export

    model = export.load_text_model(TARGET)
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states


def test_vllm_captures_four_taps_equal_to_transformers(offline, hf_states):
    """The target hands vLLM's runner exactly four aux states, HF ``hidden_states[0], [3], [31], [59]`` in the spec's
    order, and the start-up line names the four taps and the 4 x hidden fan-in."""
    taps = offline["taps"]
    assert len(taps) == len(TAPS), f"vLLM's runner received {len(taps)} aux states, the spec has {len(TAPS)}"
    for got, tap in zip(taps, TAPS):
        assert_is_tap("vLLM plugin", got, hf_states, tap)
    assert "capturing taps [embed, 3, 31, 59]" in offline["log"], "no start-up line naming the four taps"
    assert f"draft fc fan-in {4 * HIDDEN}" in offline["log"]


def test_draft_receives_cat_of_four_taps_in_spec_order(offline, hf_states):
    """The draft's ``combine_hidden_states`` input is ``cat([embed, tap 3, tap 31, tap 59])``: [T, 4 x hidden], the
    captured tensors concatenated in the declared order (not vLLM's sorted order, not three of them)."""
    aux, taps = offline["draft_aux"], offline["taps"]
    assert aux.shape == (taps[0].shape[0], 4 * HIDDEN), f"draft input {tuple(aux.shape)}"
    assert torch.equal(aux, torch.cat(taps, dim=-1)), "the draft's input is not the captured taps concatenated"
    for i, tap in enumerate(TAPS):
        assert_is_tap(f"draft input chunk {i}", aux[:, i * HIDDEN : (i + 1) * HIDDEN], hf_states, tap)


# ------------------------------------------------------------------------------------------------- served


@pytest.fixture(scope="module")
def served(offline):
    """`vllm-eagle3 serve` with the 4-tap head and spec: greedy continuations (token ids) of the eval prompts and the
    speculative-decoding counters over them. Depends on ``offline`` so that the offline engine is gone first."""
    from vllm_eagle3.testing.serving import serve_greedy

    return serve_greedy(
        TARGET,
        DRAFT,
        SPEC,
        SERVE_CONFIG,
        [it["prompt_token_ids"] for it in eval_items(NUM_PROMPTS)],
        max_tokens=MAX_TOKENS,
        in_flight=4,
        cwd=REPO,
        start_timeout=START_TIMEOUT_S,
        progress=say,
    )


def test_served_four_tap_greedy_is_token_identical(served):
    """Speculation with the 4-tap head does not change what the target says (float32 greedy, exact), and the server's
    start-up line names the four taps."""
    from vllm_eagle3.testing.serving import greedy_mismatch

    want = [it["continuation_token_ids"][:MAX_TOKENS] for it in eval_items(NUM_PROMPTS)]
    assert not (bad := greedy_mismatch(served.token_ids, want)), bad
    assert "capturing taps [embed, 3, 31, 59]" in served.log, "the server did not log the four taps"


def test_served_four_tap_head_is_accepted(served, assert_speculation_accepted, record_property):
    """The trained 4-tap head, fed the four taps it was trained on, is accepted (acceptance length > 1.5)."""
    c = served.counters
    length = assert_speculation_accepted(
        {"vllm:spec_decode_num_drafts": c.drafts, "vllm:spec_decode_num_accepted_tokens": c.accepted}
    )
    record_property("four_tap_acceptance_length", round(length, 4))
