"""Structured output under speculation: greedy output identical with and without speculation, valid every time.

Guards issue 47 item 3. Under speculation the grammar must mask every verified row (each draft is checked against
the grammar state after the tokens before it, the bonus token after all accepted ones) and roll back with the
rejected drafts; a grammar advanced by a rejected draft, or a draft row left unmasked, gives output that differs from
the target alone or breaks the format (SGLang #9187 reports structured output stuck under EAGLE).

Servers: the session's shared ``plugin`` (the shipped pair, EAGLE-3 k = 3) and ``baseline`` (the target alone) from
tests/conftest.py's pool; no engine of this module's own. Requests, all greedy, in vLLM 0.32's channels:
``response_format`` json_schema (completions and chat), ``structured_outputs`` {"regex": ...} and {"choice": [...]}
(vLLM 0.32 reads ``structured_outputs`` from the body, i.e. the OpenAI client's ``extra_body``; its old ``guided_regex``
/ ``guided_choice`` fields are gone). The miniature is trained on Python source: the schemas and regexes ask for
Python-shaped text. Checks: per request, the speculative server's token ids equal the baseline's, it finished by
"stop" (the grammar completed) and the text is valid (schema by jsonschema, regex by ``re.fullmatch``, choice by
membership); over the module, drafts were verified and accepted; one json_schema request streamed gives the same
text as unstreamed. JSON grammars allow any whitespace between tokens, and the miniature, trained on indented Python,
greedily fills it with spaces before a ``true`` / ``false`` until max_tokens (seen with a boolean field, on both
servers alike): the schemas hold strings, integers and enums, which it completes.
Model Runner V2: :func:`offline_cases` (the first prompt's completions cases) run in the two V2 engines of
tests/e2e/test_spec_min_p_logit_bias_v2.py, with and without speculation, under the same checks.
"""

from __future__ import annotations

import json
import re

import pytest

from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters

from test_sampling_options import DRAFT, MODEL, TARGET, assert_healthy, post, post_ok, sse_events  # noqa: E402

MAX_TOKENS = 96

pytestmark = [pytest.mark.e2e]
if not (TARGET / "config.json").is_file() or not (DRAFT / "eval_prompts.json").is_file():
    pytestmark.append(pytest.mark.skip(reason=f"the trained miniature is not built yet ({TARGET}, {DRAFT})"))

PROMPTS = (
    "def parse_config(path):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "import os\n\n\ndef main():\n    ",
)
FUNCTION_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,24}$"},
        "args": {"type": "array", "items": {"type": "string", "pattern": "^[a-z_]{1,12}$"}, "maxItems": 3},
        "kind": {"enum": ["function", "method", "property"]},
    },
    "required": ["name", "args", "kind"],
    "additionalProperties": False,
}
VALUE_SCHEMA = {
    "type": "object",
    "properties": {
        "value": {"type": "integer", "minimum": 0, "maximum": 9999},
        "unit": {"enum": ["bytes", "lines", "items"]},
    },
    "required": ["value", "unit"],
    "additionalProperties": False,
}
SCHEMAS = {"function": FUNCTION_SCHEMA, "value": VALUE_SCHEMA}
REGEXES = {
    "def": r"def [a-z_]{1,16}\((self|[a-z_]{1,10})(, [a-z_]{1,10}){0,2}\):",
    "return": r"return (None|True|False|self\.[a-z_]{1,12}|[0-9]{1,4})",
    "import": r"(import|from) [a-z_]{1,12}(\.[a-z_]{1,12})?",
}
CHOICES = {"bool": ["True", "False", "None"], "keyword": ["return", "yield", "raise", "pass"], "self": ["self", "cls"]}


def response_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def valid_json(schema: dict):
    def check(text: str) -> None:
        import jsonschema

        jsonschema.validate(json.loads(text), schema)

    return check


def valid_regex(pattern: str):
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), f"{text!r} does not match {pattern!r}"

    return check


def valid_choice(choices: list[str]):
    def check(text: str) -> None:
        assert text in choices, f"{text!r} is not one of {choices}"

    return check


def cases() -> dict[str, tuple[str, dict, object]]:
    """name -> (endpoint, body, validity check of the text)."""
    out = {}
    for i, prompt in enumerate(PROMPTS):
        base = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        for name, schema in SCHEMAS.items():
            out[f"json_schema_{name}_{i}"] = (
                "/v1/completions",
                {**base, "response_format": response_format(name)},
                valid_json(schema),
            )
        for name, pattern in REGEXES.items():
            out[f"regex_{name}_{i}"] = (
                "/v1/completions",
                {**base, "structured_outputs": {"regex": pattern}},
                valid_regex(pattern),
            )
        for name, choices in CHOICES.items():
            out[f"choice_{name}_{i}"] = (
                "/v1/completions",
                {**base, "structured_outputs": {"choice": choices}},
                valid_choice(choices),
            )
    for name, schema in SCHEMAS.items():
        out[f"chat_json_schema_{name}"] = (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPTS[0]}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "return_token_ids": True,
                "response_format": response_format(name),
            },
            valid_json(schema),
        )
    return out


CASES = cases()


def offline_cases(prompt: int = 0) -> dict[str, tuple[str, dict, object]]:
    """The completions cases of prompt ``prompt`` as an offline engine takes them: name -> (prompt text,
    ``StructuredOutputsParams`` keywords, validity check). tests/e2e/test_spec_min_p_logit_bias_v2.py runs them on
    Model Runner V2."""
    out = {}
    for name, (path, body, check) in CASES.items():
        if path == "/v1/completions" and name.endswith(f"_{prompt}"):
            fmt = body.get("response_format")
            out[name] = (
                body["prompt"],
                {"json": fmt["json_schema"]["schema"]} if fmt else body["structured_outputs"],
                check,
            )
    return out


def text_and_ids(path: str, r: dict) -> tuple[str, list[int]]:
    choice = r["choices"][0]
    if path == "/v1/chat/completions":
        return choice["message"]["content"], choice["token_ids"]
    return choice["text"], choice["token_ids"]


@pytest.fixture(scope="module")
def servers(server_pool, shipped_keys):
    """The shared speculative ``plugin`` server and the ``baseline`` server (target alone), and the plugin's
    spec-decode counters before this module's requests."""
    spec = server_pool.get(shipped_keys["plugin"])
    plain = server_pool.get(shipped_keys["baseline"])
    return spec, plain, SpecDecodeCounters.fetch(spec.base_url)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_identical_and_valid(servers, name):
    """Greedy structured output: the speculative server's tokens equal the target alone's; finished by "stop";
    the text satisfies the schema / regex / choice."""
    spec, plain, _ = servers
    path, body, check = CASES[name]
    got = post_ok(spec, path, body)
    want = post_ok(plain, path, body)
    (text, ids), (_, want_ids) = text_and_ids(path, got), text_and_ids(path, want)
    print(f"[structured] {name}: {text!r}", flush=True)
    assert ids == want_ids, f"speculative {text!r} {ids} != non-speculative {text_and_ids(path, want)}"
    assert got["choices"][0]["finish_reason"] == "stop", f"grammar not completed in {MAX_TOKENS} tokens: {text!r}"
    check(text)


def test_streamed_equals_unstreamed(servers):
    """json_schema streamed under speculation (several tokens per step): the deltas join to the unstreamed text."""
    spec, _, _ = servers
    path, body, check = CASES["json_schema_function_0"]
    body = {k: v for k, v in body.items() if k != "return_token_ids"}
    whole = post_ok(spec, path, body)["choices"][0]["text"]
    status, text = post(spec, path, {**body, "stream": True})
    assert status == 200, text[:500]
    streamed = "".join(e["choices"][0]["text"] for e in sse_events(text) if e.get("choices"))
    assert streamed == whole
    check(streamed)


def test_speculation_ran(servers):
    """Structured requests (this module's, and one more here) are served with drafts verified and accepted; the
    server is alive."""
    spec, _, before = servers
    path, body, check = CASES["regex_def_0"]
    check(text_and_ids(path, post_ok(spec, path, body))[0])
    counters = SpecDecodeCounters.fetch(spec.base_url) - before
    print(f"[structured] module: {counters.summary()}", flush=True)
    assert counters.drafts > 0 and counters.accepted > 0, counters
    assert_healthy(spec, "the structured-output requests")
