"""k per batch size measured while serving (``live_k``, issue 41) on a real `vllm-eagle3 serve` server of the shipped
pair: vLLM's own scheduler asks the plugin's lookup for k at every step, the lookup probes neighbouring k, and the
text does not change.

Server: the shipped serve config's speculation (k up to 5, table [[1, 8, 5], [9, 4096, 2]]) with live k probing
often (``explore_every`` 3, ``hold`` 2) so a few short requests reach every branch. Which k the controller settles on
depends on the step times, so on how busy the box is: nothing here asserts it. Asserted, on counts and tokens:

- the start-up line says live k is on, over k 0..5, from the configured table;
- greedy output at one and at four requests per step is token-identical to transformers' float32 continuation (the
  head's eval_prompts.json reference) while k moves between steps;
- a seeded sampled request gives the same tokens twice (live k holds k while one is served: the rejection sampler
  draws per draft token, so the text of a seeded request depends on the k of every step);
- ``GET /v1/eagle3/wiring`` carries the engine's live-k report: on, the two batch sizes' buckets in its table, steps
  at more than one k (the probes ran), every k within 0..5; the watch does not read the probes as a wrong wiring.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_eagle3.tools.serve.process import http_get

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
TABLE = [[1, 8, 5], [9, 4096, 2]]
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def server(server_pool):
    from vllm_eagle3.testing.pool import ServerKey
    from vllm_eagle3.testing.shipped import SERVE_CONFIG, SERVER_ENV, SPEC, TARGET

    argv = [
        str(TARGET),
        "--config",
        str(SERVE_CONFIG),
        "--speculative-config",
        json.dumps(
            {
                "method": "eagle3",
                "model": str(DRAFT),
                "num_speculative_tokens": 5,
                "num_speculative_tokens_per_batch_size": TABLE,
            }
        ),
        "--additional-config",
        json.dumps({"vllm_eagle3": {"live_k": {"explore_every": 3, "hold": 2}}}),
        "--capture-spec",
        str(SPEC),
    ]
    return server_pool.get(ServerKey.of("live k", argv, SERVER_ENV))


def test_live_k_probes_and_greedy_is_unchanged(server):
    from vllm_eagle3.testing.serving import reference_mismatch
    from vllm_eagle3.testing.shipped import MODEL_NAME

    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    bad = reference_mismatch(server, MODEL_NAME, items, MAX_TOKENS, together=(1, 4))
    assert bad is None, bad

    log = server.log_text()
    on = [x for x in log.splitlines() if "vllm-eagle3 live k: on; k in 0..5" in x]
    assert on and "starting from the configured num_speculative_tokens_per_batch_size" in on[0], log[-3000:]
    assert "live k: OFF" not in log

    status, raw = http_get(server.base_url + "/v1/eagle3/wiring")
    assert status == 200, raw[:500]
    body = json.loads(raw)
    live = body["live_k"]
    print(f"[e2e] live k report: {live}", flush=True)
    assert live and live["state"] == "on", body
    buckets = {(lo, hi) for lo, hi, _ in live["table"]}
    assert {(1, 1), (4, 4)} <= buckets, live["table"]
    assert all(0 <= k <= 5 for _, _, k in live["table"]), live["table"]
    steps = {int(k): n for k, n in live["steps_at_k"].items()}
    assert len(steps) >= 2 and all(0 <= k <= 5 for k in steps), f"no probe ran: {steps}"
    assert body["judges"]["watch"] != "wrong", body["engines"]


def test_seeded_sampling_is_reproducible_while_live_k_probes(server):
    """The same request twice, sampled with a seed, on a server that probes every 3 steps: the same tokens (a probe in
    one of the two runs and not the other changed them before live k held k for seeded requests)."""
    from openai import OpenAI

    from vllm_eagle3.testing.shipped import MODEL_NAME

    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    client = OpenAI(base_url=server.openai_url, api_key="EMPTY", max_retries=0, timeout=300)

    def once() -> list[int]:
        r = client.completions.create(
            model=MODEL_NAME,
            prompt=items[5]["prompt_token_ids"],
            max_tokens=48,
            temperature=1.0,
            top_p=0.95,
            seed=1234,
            extra_body={"top_k": 50, "ignore_eos": True, "return_token_ids": True},
        )
        return [int(t) for t in r.choices[0].model_extra["token_ids"]]

    first = once()
    greedy_between = items[6]["prompt_token_ids"]  # steps in between: the probe schedule moves on
    client.completions.create(model=MODEL_NAME, prompt=greedy_between, max_tokens=17, temperature=0)
    assert once() == first
