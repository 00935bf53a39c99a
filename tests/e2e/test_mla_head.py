"""The MLA-style EAGLE-3 head served for real (issue 15 item 2): `vllm-eagle3 serve` with the miniature Kimi K2.5 and
models/kimi-k25-mini-eagle3-mla (vLLM 0.32 ``Eagle3DeepseekV2ForCausalLM``: DeepSeek-V2 multi-latent attention in the
draft layer, EAGLE-3.1 ``fc_norm`` + ``norm_output``), spec ``[embed, 3, 31]`` (configs/kimi_k25_eagle3.yaml).

Guards what only serving the MLA head shows: the plugin's capture feeding an MLA draft (another draft class, another
``combine_hidden_states``, its own MLA KV cache next to the target's), ``fc_norm`` applied per tap chunk,
``norm_output`` feeding the POST-norm state back to later draft steps (a pre-norm feed-back still drafts, only worse:
the served acceptance comparison catches it), and the MLA draft's verify/accept bookkeeping on vLLM-CPU.

One server start (a 2-core box; CI time is short): the non-speculative reference is the target's float32 greedy
continuation recorded with the card's prompts (``eval_prompts.json``, transformers; vLLM-CPU without speculation
gives the same tokens on them: tests/e2e/test_compiled.py and test_four_taps.py compare against the same record), so
no baseline server is started.

Tolerances:
- greedy tokens: exact (float32 both sides; a wrong accept/reject moves tokens by O(1) logits, not by a near-tie);
- served acceptance length vs the card's ``served_walk`` on the same prompts (k = 3): within ``ACCEPTANCE_TOL = 0.1``
  tokens per step, the same bound and reasons as tests/e2e/test_serving.py's Llama-head test (the simulation cannot
  score the last draft or two of each prompt, whose chains run past the 128 recorded tokens; rare float32 argmax
  near-ties between the training code and vLLM's kernels, whose draft logits agree to the tolerance of
  tests/parity/test_draft_parity.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = Path(os.environ.get("EAGLE3_E2E_DRAFT_MLA", REPO / "models" / "kimi-k25-mini-eagle3-mla"))
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
SERVE_CONFIG = REPO / "configs" / "serve_kimi_k25_mini.yaml"
DRAFT_CLASS = "Eagle3DeepseekV2ForCausalLM"
K = 3  # num_speculative_tokens, as configs/serve_kimi_k25_mini.yaml serves the Llama head
NUM_PROMPTS = 8  # x 128 tokens: >= 250 drafts, enough for the +-0.1 comparison (which needs >= 100)
MAX_TOKENS = 128  # eval_prompts.json's continuations are 128 tokens: the walk is scored on all of them
IN_FLIGHT = 8
START_TIMEOUT_S = 900
ACCEPTANCE_TOL = 0.1

pytestmark = [pytest.mark.e2e]
if not (DRAFT / "config.json").is_file():
    pytestmark.append(
        pytest.mark.skip(
            reason=f"the MLA head is not there ({DRAFT}); train it with `python -m "
            "vllm_eagle3.miniature.train_draft --arch mla --fc-norm --norm-output`"
        )
    )


def say(line: str) -> None:
    print(f"[mla-head] {line}", flush=True)


def eval_items(n: int) -> list[dict]:
    return json.loads((DRAFT / "eval_prompts.json").read_text())["items"][:n]


@pytest.fixture(scope="module")
def served():
    """`vllm-eagle3 serve` with the MLA head: greedy continuations (token ids) of the card's first NUM_PROMPTS prompts,
    the spec-decode counters over them, and the server log."""
    from vllm_eagle3.testing.serving import serve_greedy

    return serve_greedy(
        TARGET,
        DRAFT,
        SPEC,
        SERVE_CONFIG,
        [it["prompt_token_ids"] for it in eval_items(NUM_PROMPTS)],
        max_tokens=MAX_TOKENS,
        in_flight=IN_FLIGHT,
        cwd=REPO,
        num_speculative_tokens=K,
        start_timeout=START_TIMEOUT_S,
        progress=say,
    )


def card_served_walk(k: int, num_prompts: int) -> float:
    """The card's offline served walk (``eval.json`` ``simulated_acceptance.served_walk``) pooled over the first
    ``num_prompts`` prompts: 1 + accepted / drafts, what vLLM's counters measure."""
    walk = json.loads((DRAFT / "eval.json").read_text())["simulated_acceptance"]["served_walk"][str(k)]
    per = walk["per_sequence"][:num_prompts]
    assert len(per) == num_prompts, f"eval.json served_walk has {len(per)} prompts, {num_prompts} served"
    return 1.0 + sum(a for _, a in per) / sum(d for d, _ in per)


def test_mla_head_greedy_is_token_identical(served):
    """Speculation with the MLA head does not change what the target says (float32 greedy, exact)."""
    from vllm_eagle3.testing.serving import greedy_mismatch

    want = [it["continuation_token_ids"][:MAX_TOKENS] for it in eval_items(NUM_PROMPTS)]
    assert not (bad := greedy_mismatch(served.token_ids, want)), bad


def test_mla_head_served_acceptance_matches_model_card(served, assert_speculation_accepted, record_property):
    """Served acceptance length at k = 3 equals the card's served walk on the same prompts within 0.1, and the head is
    really accepted (the shared floor, tests/conftest.py)."""
    c = served.counters
    length = assert_speculation_accepted(
        {"vllm:spec_decode_num_drafts": c.drafts, "vllm:spec_decode_num_accepted_tokens": c.accepted}
    )
    offline = card_served_walk(len(c.accepted_per_pos), NUM_PROMPTS)
    record_property("mla_served_acceptance_length", round(length, 4))
    record_property("mla_card_served_walk", round(offline, 4))
    say(
        f"served acceptance length {length:.3f} ({c.drafts:.0f} drafts) vs card served walk {offline:.3f}; "
        f"per position {[round(x, 3) for x in c.per_position]}"
    )
    assert len(c.accepted_per_pos) == K, f"the server drafted {len(c.accepted_per_pos)} tokens per step, not {K}"
    assert c.drafts >= 100, f"only {c.drafts:.0f} drafts measured: too few to compare"
    assert abs(length - offline) <= ACCEPTANCE_TOL, (
        f"served acceptance length {length:.3f} is not within {ACCEPTANCE_TOL} of the card's served walk {offline:.3f}"
    )


def test_mla_head_startup_line_names_taps_and_draft_class(served):
    """The plugin's start-up line names the taps and the MLA draft class, and vLLM really built that class."""
    lines = [ln for ln in served.log.splitlines() if "vllm-eagle3: capturing taps [embed, 3, 31]" in ln]
    assert lines, "no 'vllm-eagle3: capturing taps [embed, 3, 31]' line in the server log"
    assert any(f"draft class {DRAFT_CLASS}" in ln for ln in lines), (
        f"the taps line does not name {DRAFT_CLASS}: {lines}"
    )
    others = "\n".join(ln for ln in served.log.splitlines() if "vllm-eagle3: capturing taps" not in ln)
    assert DRAFT_CLASS in others, f"vLLM's own log never names {DRAFT_CLASS}: it built another draft class"
