"""Kimi K2 tool calls streamed under speculation: vLLM's own ``kimi_k2`` parser, fed the multi-token deltas a
speculative step produces (1 to k+1 tokens), yields the same tool calls and content as one token per delta.

Guards issue 47 item 3: the Kimi K2 tool parser broke on multi-token deltas before (vLLM #38274: a speculative step
bundling ``<|tool_call_end|><|tool_call_begin|>`` truncated the first call's arguments; rewritten in #38579, and in 0.32
the parser is the declarative ``vllm/parser/kimi_k2.py`` engine). Each output below is tokenized once, detokenized by
vLLM's own ``FastIncrementalDetokenizer`` (as the engine streams: ``skip_special_tokens=False``, which the parser's
``adjust_request`` sets, multi-byte characters held back until complete) and fed in every chunking: 1 token per delta,
k+1 per delta at every phase offset for k = 1..5, and seeded random steps of 1..k+1. Two of vLLM's paths:
``KimiK2ToolParser.extract_tool_calls_streaming`` as a tool parser, and chat serving's ``Parser.parse_delta`` from
``ParserManager.get_parser`` (tool parser alone, and with the ``kimi_k2`` reasoning parser, as Kimi K2.5 is served);
each must equal the non-streaming parse and the calls written into the output (and, with the reasoning parser, the
reasoning text: a step that holds ``</think>`` and content must not lose or leak either).

Tokenizer: the bundled miniature's byte-level BPE with Kimi's five tool-call markers and ``<think>``/``</think>`` added
as special tokens (vLLM looks each marker up as one vocabulary entry). End to end serving is not tested: the miniature
was trained on Python source and never emits these markers, so no served request of it can hold a tool call.
No engine; importing vLLM is most of the run time.
"""

from __future__ import annotations

import json
import random
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "kimi-k25-mini"
S, E, B, A, Z = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
TOOL_MARKERS = (S, E, B, A, Z)
"""The strings vllm/parser/kimi_k2.py looks up (TOOL_SECTION_START/END, TOOL_CALL_START, TOOL_ARG_START,
TOOL_CALL_END)."""
THINK_MARKERS = ("<think>", "</think>")
MAX_K = 5
"""Drafts per step; a step appends up to MAX_K + 1 tokens (the accepted drafts plus the bonus token)."""
RANDOM_CHUNKINGS = 5
"""Seeded random chunkings per (case, k): steps of 1..k+1 tokens, as acceptance varies step to step."""


def call(name: str, idx: int, args: dict, raw: str | None = None) -> str:
    """One Kimi K2 call: ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>``."""
    return f"{B}functions.{name}:{idx}{A}{raw if raw is not None else json.dumps(args, ensure_ascii=False)}{Z}"


WEATHER = {"city": "Tokyo", "unit": "celsius"}
NESTED = {
    "query": 'say "hi" \\ then ✓ 東京 🚀',
    "filters": {"tags": ["a", "b", {"deep": [1, 2.5, None, True]}], "empty": {}},
    "n": -3,
}
SEARCH = {"q": "vllm eagle3"}


@dataclass(frozen=True)
class Case:
    """A model output and what it holds: content text, (id, name, arguments) per call, and the reasoning text of a
    ``thinking`` output (read by the kimi_k2 reasoning parser)."""

    output: str
    content: str | None
    calls: tuple[tuple[str, str, dict], ...]
    thinking: bool = False
    reasoning: str | None = None


CASES = {
    "text_then_one_call": Case(
        f"Let me check the weather.{S}{call('get_weather', 0, WEATHER)}{E}",
        "Let me check the weather.",
        (("functions.get_weather:0", "get_weather", WEATHER),),
    ),
    "two_calls": Case(
        f"{S}{call('get_weather', 0, WEATHER)}{call('web_search', 1, SEARCH)}{E}",
        None,
        (("functions.get_weather:0", "get_weather", WEATHER), ("functions.web_search:1", "web_search", SEARCH)),
    ),
    "nested_unicode_escaped_quotes": Case(
        f"Ok — 検索します.{S}{call('web_search', 0, NESTED)}{E}",
        "Ok — 検索します.",
        (("functions.web_search:0", "web_search", NESTED),),
    ),
    "compact_json_then_text_after_section": Case(
        f"Sure.{S}{call('web_search', 0, SEARCH, raw=json.dumps(SEARCH, separators=(',', ':')))}{E} Done.",
        "Sure.",
        (("functions.web_search:0", "web_search", SEARCH),),
    ),
    "newlines_between_markers_empty_args": Case(
        f"{S}\n{B}functions.list_files:0{A}{{}}{Z}\n{call('get_weather', 1, WEATHER)}\n{E}",
        None,
        (("functions.list_files:0", "list_files", {}), ("functions.get_weather:1", "get_weather", WEATHER)),
    ),
    "thinking_then_calls": Case(
        f"<think>The user wants weather; call the tool.</think>Checking.{S}{call('get_weather', 0, WEATHER)}"
        f"{call('web_search', 1, NESTED)}{E}",
        "Checking.",
        (("functions.get_weather:0", "get_weather", WEATHER), ("functions.web_search:1", "web_search", NESTED)),
        thinking=True,
        reasoning="The user wants weather; call the tool.",
    ),
}

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": p}}}
    for n, p in (
        ("get_weather", {"city": {"type": "string"}, "unit": {"type": "string"}}),
        (
            "web_search",
            {
                "q": {"type": "string"},
                "query": {"type": "string"},
                "filters": {"type": "object"},
                "n": {"type": "integer"},
            },
        ),
        ("list_files", {}),
    )
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    tok.add_special_tokens({"additional_special_tokens": list(TOOL_MARKERS + THINK_MARKERS)})
    return tok


def request():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="kimi", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)


# ── Chunkings: lengths of the deltas a stream arrives in ──────────────────────────────────────────────────────────────


def fixed(n: int, size: int, offset: int) -> list[int]:
    """``size`` tokens per delta after a first delta of ``offset`` tokens. E.g. (7, 3, 1) -> [1, 3, 3]."""
    lengths = [offset] if offset else []
    rest = n - offset
    return lengths + [size] * (rest // size) + ([rest % size] if rest % size else [])


def steps(n: int, k: int, seed: int) -> list[int]:
    """Speculative steps of 1..k+1 tokens each, seeded."""
    rng, lengths = random.Random(seed), []
    while sum(lengths) < n:
        lengths.append(min(rng.randint(1, k + 1), n - sum(lengths)))
    return lengths


def chunkings(n: int, k: int) -> dict[str, list[int]]:
    """Every chunking tested for k drafts per step, by name."""
    out = {f"{k + 1}/step from offset {o}": fixed(n, k + 1, o) for o in range(k + 1)}
    out |= {f"random 1..{k + 1}/step seed {s}": steps(n, k, 1000 * k + s) for s in range(RANDOM_CHUNKINGS)}
    return out


def detokenized(tok, ids: list[int], lengths: list[int]) -> list[tuple[str, list[int]]]:
    """(delta_text, delta_token_ids) per step, from vLLM's own incremental detokenizer, as the engine streams them."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    req = types.SimpleNamespace(
        request_id="r", prompt_token_ids=[], sampling_params=SamplingParams(skip_special_tokens=False)
    )
    detok, out, start = FastIncrementalDetokenizer(tok, req), [], 0
    for i, length in enumerate(lengths):
        chunk = ids[start : start + length]
        start += length
        detok.update(chunk, False)
        out.append((detok.get_next_output_text(i == len(lengths) - 1, True), chunk))
    assert "".join(t for t, _ in out) == tok.decode(ids, skip_special_tokens=False)
    return out


# ── What a client reassembles from the deltas ─────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Result:
    content: str | None
    calls: tuple[tuple[str | None, str, str], ...]  # (id, name, arguments as the client concatenates them)
    reasoning: str | None = None


def reassemble(deltas) -> Result:
    """Concatenate as an OpenAI client does; a call's first delta must carry its id and name, later ones neither."""
    content, reasoning, calls = "", "", {}
    for m in deltas:
        if m is None:
            continue
        content += m.content or ""
        reasoning += m.reasoning or ""
        for tc in m.tool_calls or []:
            first = tc.index not in calls
            assert first == bool(tc.id) == bool(tc.function and tc.function.name), f"call {tc.index}: {tc}"
            c = calls.setdefault(tc.index, {"id": tc.id, "name": "", "args": ""})
            if tc.function:
                c["name"] += tc.function.name or ""
                c["args"] += tc.function.arguments or ""
    calls_ = tuple((c["id"], c["name"], c["args"]) for _, c in sorted(calls.items()))
    return Result(content or None, calls_, reasoning or None)


def stream_tool_parser(tok, steps_: list[tuple[str, list[int]]]) -> Result:
    """KimiK2ToolParser as a tool parser: accumulated previous/current text and ids, then finish_streaming()."""
    from vllm.tool_parsers.kimi_k2_tool_parser import KimiK2ToolParser

    req = request()
    parser = KimiK2ToolParser(tok, req.tools)
    prev_text, prev_ids, deltas = "", [], []
    for text, ids in steps_:
        cur_text, cur_ids = prev_text + text, prev_ids + ids
        deltas.append(parser.extract_tool_calls_streaming(prev_text, cur_text, text, prev_ids, cur_ids, ids, req))
        prev_text, prev_ids = cur_text, cur_ids
    deltas.append(parser.finish_streaming())
    return reassemble(deltas)


def serving_parser(tok, thinking: bool):
    """The per-request Parser the chat server builds for ``--tool-call-parser kimi_k2 [--reasoning-parser kimi_k2]``."""
    from vllm.parser import ParserManager

    cls = ParserManager.get_parser(
        tool_parser_name="kimi_k2",
        reasoning_parser_name="kimi_k2" if thinking else None,
        enable_auto_tools=True,
        tokenizer=tok,
    )
    return cls(tok, TOOLS, chat_template_kwargs={}, model_config=None)


def stream_serving(tok, steps_: list[tuple[str, list[int]]], thinking: bool) -> Result:
    """Chat serving's streaming loop: parse_delta per engine output, finished on the last."""
    parser, req = serving_parser(tok, thinking), request()
    deltas = [
        parser.parse_delta(text, ids, req, prompt_token_ids=[7, 8], finished=i == len(steps_) - 1)
        for i, (text, ids) in enumerate(steps_)
    ]
    return reassemble(deltas)


def serving_whole(tok, output: str, ids: list[int], thinking: bool) -> Result:
    """Chat serving's non-streaming answer: Parser.parse on the whole output."""
    reasoning, content, calls = serving_parser(tok, thinking).parse(
        output, request(), enable_auto_tools=True, model_output_token_ids=ids
    )
    return Result(content, tuple((c.id, c.name, c.arguments) for c in calls or ()), reasoning)


def tool_parser_whole(tok, output: str) -> Result:
    """KimiK2ToolParser.extract_tool_calls on the whole output."""
    from vllm.tool_parsers.kimi_k2_tool_parser import KimiK2ToolParser

    info = KimiK2ToolParser(tok, TOOLS).extract_tool_calls(output, request())
    return Result(info.content, tuple((c.id, c.function.name, c.function.arguments) for c in info.tool_calls))


def assert_written(result: Result, case: Case, where: str) -> None:
    """The calls are the ones written into the output: ids, names, arguments parsed as JSON; the content and the
    reasoning."""
    got = [(i, n, json.loads(a)) for i, n, a in result.calls]
    assert got == list(case.calls), f"{where}: calls {result.calls}"
    assert result.content == case.content, f"{where}: content {result.content!r}"
    assert result.reasoning == case.reasoning, f"{where}: reasoning {result.reasoning!r}"


# ── Tests ─────────────────────────────────────────────────────────────────────────────────────────────────────────────


def test_markers_are_single_tokens(tokenizer):
    """The parser looks each marker up with get_vocab(); a marker split into BPE pieces would never be seen."""
    vocab = tokenizer.get_vocab()
    for marker in TOOL_MARKERS + THINK_MARKERS:
        assert tokenizer.encode(marker, add_special_tokens=False) == [vocab[marker]], marker


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.thinking])
def test_one_token_per_delta_matches_whole_output(tokenizer, name):
    """Reference: 1 token per delta equals the non-streaming parse and the calls written into the output."""
    case = CASES[name]
    ids = tokenizer.encode(case.output, add_special_tokens=False)
    one = detokenized(tokenizer, ids, [1] * len(ids))
    for where, result in (
        ("tool parser, non-streaming", tool_parser_whole(tokenizer, case.output)),
        ("tool parser, 1 token/delta", stream_tool_parser(tokenizer, one)),
        ("chat serving, non-streaming", serving_whole(tokenizer, case.output, ids, False)),
        ("chat serving, 1 token/delta", stream_serving(tokenizer, one, False)),
    ):
        assert_written(result, case, where)


@pytest.mark.parametrize("k", range(1, MAX_K + 1))
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.thinking])
def test_multi_token_deltas_match_one_token(tokenizer, name, k):
    """Deltas of up to k+1 tokens (a speculative step) give exactly the calls and content of 1 token per delta, through
    the tool parser and through chat serving's parse_delta; across the k+1 phase offsets each marker shares a delta with
    the text on either side of it."""
    case = CASES[name]
    ids = tokenizer.encode(case.output, add_special_tokens=False)
    one = detokenized(tokenizer, ids, [1] * len(ids))
    want_tool, want_serving = stream_tool_parser(tokenizer, one), stream_serving(tokenizer, one, False)
    for label, lengths in chunkings(len(ids), k).items():
        steps_ = detokenized(tokenizer, ids, lengths)
        assert stream_tool_parser(tokenizer, steps_) == want_tool, f"tool parser, {label}: {lengths}"
        assert stream_serving(tokenizer, steps_, False) == want_serving, f"chat serving, {label}: {lengths}"


def test_chunkings_bundle_markers_with_text(tokenizer):
    """The chunkings above do feed the shapes that broke before (else they prove nothing): a delta holding
    ``<|tool_call_argument_begin|>`` and argument text, and one holding ``<|tool_call_end|><|tool_call_begin|>``
    (#38274)."""
    vocab = tokenizer.get_vocab()
    ids = tokenizer.encode(CASES["two_calls"].output, add_special_tokens=False)
    end = ids.index(vocab[Z])
    assert ids[end + 1] == vocab[B]
    for k, want in ((1, Z + B), (3, Z + B), (3, A + "{")):
        deltas = [
            t
            for label, lengths in chunkings(len(ids), k).items()
            if "offset" in label
            for t, _ in detokenized(tokenizer, ids, lengths)
        ]
        assert any(want in t for t in deltas), (k, want)


@pytest.mark.parametrize("k", [0, *range(1, MAX_K + 1)])
def test_thinking_then_calls_served_with_reasoning_parser(tokenizer, k):
    """Kimi K2.5 as served (reasoning and tool parser kimi_k2): a step may hold the end of reasoning, content and the
    section start together; the calls, content and reasoning equal the non-streaming parse at every chunking (k = 0:
    1 token)."""
    case = CASES["thinking_then_calls"]
    ids = tokenizer.encode(case.output, add_special_tokens=False)
    assert_written(serving_whole(tokenizer, case.output, ids, True), case, "chat serving, non-streaming")
    lengths_by_label = {"1/step": [1] * len(ids)} if k == 0 else chunkings(len(ids), k)
    for label, lengths in lengths_by_label.items():
        assert_written(
            stream_serving(tokenizer, detokenized(tokenizer, ids, lengths), True),
            case,
            f"chat serving, {label}: {lengths}",
        )
