"""k per batch size measured while serving (``live_k``, issue 41) on a real `vllm-eagle3 serve` server of the shipped
pair: vLLM's own scheduler asks the plugin's lookup for k at every step, the lookup probes neighbouring k, and the
text does not change.

Server: the shipped serve config's speculation (k up to 5) started deliberately wrong, at k = 1 for every batch size
(the shipped table says 5 up to batch 8; ``host_table`` off, so not this host kind's table either), with live k
sweeping fast (``settle_every`` 2, ``hold`` 4, ``evidence`` 8, then ``explore_every`` 8).
Asserted, on counts and tokens:

- the start-up line says live k is on, over k 0..5, from the configured table;
- greedy output at one and at four requests per step is token-identical to transformers' float32 continuation (the
  head's eval_prompts.json reference) while k moves between steps;
- a seeded sampled request gives the same tokens twice (live k holds k while one is served: the rejection sampler
  draws per draft token, so the text of a seeded request depends on the k of every step);
- ``GET /v1/eagle3/wiring`` carries the engine's live-k report: on, the two batch sizes' buckets in its table, steps
  at more than one k (the probes ran), every k within 0..5; the watch does not read the probes as a wrong wiring;
- live k moves: one request at a time until batch 1's bucket has swept every k and settled (a bounded number of
  requests), it has left k = 1 for a larger k. That direction is the tokens', not the clock's: the head emits 1.83
  tokens per step at k = 1 and 2.55 at k = 2 on its greedy evaluation (eval.json), +39 %, while a step of one request
  verifies one token more; with a step timer that returned 0, or a controller that cannot move, this test fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_eagle3.tools.serve.process import http_get

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
TABLE = [[1, 4096, 1]]  # wrong on purpose: live k must find a larger k at batch 1
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
        json.dumps(
            {
                "vllm_eagle3": {
                    "live_k": {"settle_every": 2, "explore_every": 8, "hold": 4, "evidence": 8, "host_table": False}
                }
            }
        ),
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
    """The same request twice, sampled with a seed, on a server that probes every few steps: the same tokens (a probe in
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


def live_k_report(server) -> dict:
    status, raw = http_get(server.base_url + "/v1/eagle3/wiring")
    assert status == 200, raw[:500]
    return json.loads(raw)["live_k"]


def test_live_k_moves_from_a_wrong_start(server):
    """Batch 1 starts at k = 1; one greedy request at a time until its bucket has swept every k and settled (at most
    40 requests of 64 tokens: the sweep needs 5 k x 3 probes x 6 steps = 90 steps, ~25 requests at k = 1), then
    its k is larger than 1 and at least one change was made. Not asserted: which larger k (the cost of a step
    decides between 2..5, and that is the machine's)."""
    from openai import OpenAI

    from vllm_eagle3.testing.shipped import MODEL_NAME

    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    client = OpenAI(base_url=server.openai_url, api_key="EMPTY", max_retries=0, timeout=300)
    live = live_k_report(server)
    for i in range(40):
        if [1, 1] in live["settled"]:
            break
        prompt = items[i % len(items)]["prompt_token_ids"]
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=64, temperature=0)
        live = live_k_report(server)
    print(f"[e2e] live k after {i} requests: {live}", flush=True)
    assert [1, 1] in live["settled"], f"batch 1 did not settle in {i} requests: {live}"
    k1 = {(lo, hi): k for lo, hi, k in live["table"]}[(1, 1)]
    assert k1 > 1 and live["changes"] >= 1, f"live k did not move batch 1 from k = 1: {live}"
