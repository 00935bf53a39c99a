"""Speculation per request (issue 47 item 2), served: a client turns it off for one request, and a request whose
drafts all fail stops costing drafts within :func:`vllm_eagle3.request_speculation.drafting_steps` steps.

Guards vllm_eagle3/request_speculation_vllm.py. Without it vLLM 0.32 verifies every request's drafts every step:
``vllm_xargs {"speculation": false}`` is ignored (the request still drafts) and a request whose head never agrees
pays k drafts on every one of its steps. Counts are vLLM's own per-request spec-decode metrics
(``--per-request-spec-decode-metrics detailed`` -> ``metrics.speculative_decoding`` in each response): tokens and
steps, never clocks.

Servers: the session's shared ``plugin`` server (the shipped head: greedy output with speculation off equals the
output with it on, a bad value is a 400), and one of this module: the shipped pair with a head that never agrees
(its ``d2t`` maps every draft id to one target token the target never emits on these prompts, so every draft is
rejected), per-request metrics on, the default back-off.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vllm_eagle3.request_speculation import KEY, Backoff, drafting_steps
from vllm_eagle3.tools.serve.process import VllmServer

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
MODEL = "kimi-k25-mini"
REQUEST_TIMEOUT_S = 300
K = 3  # num_speculative_tokens of the shipped serve command (testing/shipped.py eagle3_config)

pytestmark = [pytest.mark.e2e]
if not (TARGET / "config.json").is_file() or not (DRAFT / "eval_prompts.json").is_file():
    pytestmark.append(pytest.mark.skip(reason=f"the trained miniature is not built yet ({TARGET}, {DRAFT})"))


def post(server: VllmServer, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(
        server.base_url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def greedy(server: VllmServer, prompt: list[int], n: int, speculation=None) -> dict:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    if speculation is not None:
        body["vllm_xargs"] = {KEY: speculation}
    status, text = post(server, body)
    assert status == 200, f"{json.dumps(body)[:300]} answered {status}: {text[:500]}"
    return json.loads(text)


def token_ids(r: dict) -> list[int]:
    return r["choices"][0]["token_ids"]


def spec_metrics(r: dict) -> dict:
    m = (r.get("metrics") or {}).get("speculative_decoding")
    assert m is not None, f"no per-request spec-decode metrics in the response: {json.dumps(r)[:400]}"
    return m


def eval_items() -> list[dict]:
    return json.loads((DRAFT / "eval_prompts.json").read_text())["items"]


# ------------------------------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def plugin_server(server_pool, shipped_keys) -> VllmServer:
    return server_pool.get(shipped_keys["plugin"])


@pytest.fixture(scope="module")
def never_token() -> int:
    """A target token in none of the eval prompts and greedy continuations: the never-agreeing head's only draft."""
    seen = Counter()
    for item in eval_items():
        seen.update(item["prompt_token_ids"])
        seen.update(item["continuation_token_ids"])
    config = json.loads((TARGET / "config.json").read_text())
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    return max(t for t in range(vocab) if t not in seen)


@pytest.fixture(scope="module")
def never_server(server_pool, tmp_path_factory, never_token) -> VllmServer:
    """The shipped pair with a head whose every draft is ``never_token``; per-request metrics on (detailed)."""
    import torch
    from safetensors.torch import load_file, save_file

    from vllm_eagle3.testing.pool import ServerKey
    from vllm_eagle3.testing.shipped import SERVER_ENV, shipped_server_argv

    out = tmp_path_factory.mktemp("never-agrees") / "kimi-k25-mini-eagle3-never"
    out.mkdir()
    weights = load_file(str(DRAFT / "model.safetensors"))
    d2t = weights["d2t"]  # [draft_vocab]: target id = draft id + d2t[draft id]
    weights["d2t"] = never_token - torch.arange(d2t.shape[0], dtype=d2t.dtype)
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text((DRAFT / "config.json").read_text())
    argv = shipped_server_argv(out, draft_backoff=True) + ["--per-request-spec-decode-metrics", "detailed"]
    return server_pool.get(ServerKey.of("never-agrees", argv, SERVER_ENV))


# ------------------------------------------------------------------------------------------------- the switch


def test_speculation_off_is_greedy_identical_on_the_shipped_head(plugin_server):
    """Greedy output of a request with speculation off equals the same request with it on and the target's float32
    continuation (a dropped draft must never change a token)."""
    item = eval_items()[0]
    prompt, want = item["prompt_token_ids"], item["continuation_token_ids"][:64]
    on, off = greedy(plugin_server, prompt, 64), greedy(plugin_server, prompt, 64, speculation=False)
    assert token_ids(off) == token_ids(on) == want


@pytest.mark.parametrize("value", ["maybe", 2, 0.5, ["off"]])
def test_bad_value_is_a_400_naming_the_fix(plugin_server, value):
    """A bad ``speculation`` value is refused with a 400 that says what to send, and the engine serves on."""
    status, text = post(
        plugin_server, {"model": MODEL, "prompt": "def f(x):", "max_tokens": 4, "vllm_xargs": {KEY: value}}
    )
    assert status == 400, f"{value!r}: answered {status}: {text[:400]}"
    assert KEY in text and "true or false" in text, text[:400]
    greedy(plugin_server, eval_items()[0]["prompt_token_ids"], 4)


def test_speculation_off_drafts_nothing_while_a_concurrent_request_drafts(never_server, never_token):
    """Two requests at once on one engine: the one with ``speculation: false`` verifies 0 drafts in its per-request
    metrics, the other drafts; both return the target's greedy continuation."""
    item = eval_items()[1]
    prompt, want = item["prompt_token_ids"], item["continuation_token_ids"][:32]
    with ThreadPoolExecutor(2) as pool:
        on = pool.submit(greedy, never_server, prompt, 32)
        off = pool.submit(greedy, never_server, prompt, 32, False)
        on, off = on.result(), off.result()
    m_on, m_off = spec_metrics(on), spec_metrics(off)
    print(f"speculation on: {m_on}\nspeculation off: {m_off}")
    assert token_ids(off) == token_ids(on) == want
    assert never_token not in want
    assert m_off["num_draft_tokens"] == 0 and m_off["num_spec_steps"] == 0, m_off
    assert m_on["num_draft_tokens"] >= K * Backoff().misses, m_on


# ------------------------------------------------------------------------------------------------- the back-off


@pytest.mark.parametrize("n", [128])
def test_failing_drafts_stop_within_the_bound(never_server, never_token, n):
    """A request whose every draft fails verifies drafts on at most ``drafting_steps(Backoff(), n - 1)`` of its
    n - 1 decode steps (defaults: 7 of 127, not 127), each of them accepting nothing; its output is the target's."""
    item = eval_items()[2]
    prompt, want = item["prompt_token_ids"], item["continuation_token_ids"][:n]
    r = greedy(never_server, prompt, n)
    m = spec_metrics(r)
    bound = drafting_steps(Backoff(), n - 1)
    print(
        f"{n} tokens: {m['num_spec_steps']} verify steps with drafts, {m['num_draft_tokens']} drafts "
        f"(bound {bound} steps, {K * bound} drafts; without back-off {n - 1} steps, {K * (n - 1)} drafts); "
        f"per step drafted {m.get('per_step_drafted')}, accepted {m.get('per_step_accepted')}"
    )
    assert token_ids(r) == want and never_token not in want
    assert m["num_accepted_draft_tokens"] == 0, m
    assert Backoff().misses <= m["num_spec_steps"] <= bound, m
    assert m["num_draft_tokens"] <= K * bound, m
