#!/usr/bin/env python3
"""Query a running vLLM server (vllm-eagle3 or plain vLLM) with the OpenAI client: completions, chat, streaming chat.

Prints each answer and its tokens/s and, when the server speculates, the acceptance over these requests from vLLM's
Prometheus counters on ``/metrics`` (``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total``).

    vllm-eagle3 serve --config configs/serve_kimi_k25_mini.yaml &     # or any OpenAI-compatible vLLM server
    python examples/client.py                        # or --base-url http://HOST:8000/v1, or $OPENAI_BASE_URL

Standalone: needs only ``pip install openai``; copy it into an application as it is.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.request

# The bundled miniature was trained on Python source code: prompts it can continue.
COMPLETION_PROMPTS = ("def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main(argv):\n")
CHAT_MESSAGES = ("Write a Python function that reverses a string.",)
STREAM_MESSAGES = ("Show me how to read a JSON file in Python.",)
SPEC_PREFIX = "vllm:spec_decode_num_"
DEFAULT_BASE_URL = "http://localhost:8000/v1"  # vLLM's OpenAI-compatible server, as vLLM's docs write it


def urls(base_url: str) -> tuple[str, str]:
    """(OpenAI base URL, server root) from either form: http://localhost:8000/v1 or http://localhost:8000 both give
    ("http://localhost:8000/v1", "http://localhost:8000"); the root serves /metrics and /health."""
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return root + "/v1", root


def connection_args(p: argparse.ArgumentParser) -> None:
    """--base-url and --api-key, defaulting to the OpenAI client's own environment variables."""
    p.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
        help=f"the server's OpenAI base URL, with or without /v1 (default: $OPENAI_BASE_URL, else {DEFAULT_BASE_URL})",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY") or "EMPTY",
        help="the server's --api-key, if it has one (default: $OPENAI_API_KEY, else EMPTY)",
    )


def spec_counters(base_url: str) -> dict[str, float] | None:
    """vLLM's speculative-decoding counters (summed over labels; per position keyed ``accepted_tokens_per_pos/<i>``),
    or None when the server does not speculate. ``base_url``: with or without /v1."""
    with urllib.request.urlopen(urls(base_url)[1] + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^vllm:spec_decode_num_(\w+?)_total(\{[^}]*\})?\s+(\S+)$", line)
        if not m:
            continue
        name = m.group(1)
        pos = re.search(r'position="(\d+)"', m.group(2) or "")
        key = f"{name}/{pos.group(1)}" if pos else name
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out or None


def acceptance_line(before: dict[str, float], after: dict[str, float]) -> str:
    """Mean acceptance length (1 + accepted tokens per draft) and per-position acceptance over the requests sent."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = d.get("drafts", 0.0)
    if not drafts:
        return "speculative decoding: on, no drafts in these requests"
    positions = sorted((int(k.split("/")[1]), v) for k, v in d.items() if k.startswith("accepted_tokens_per_pos/"))
    per_pos = ", ".join(f"{v / drafts:.2f}" for _, v in positions)
    return (
        f"speculative decoding: {int(drafts)} drafts, {int(d.get('accepted_tokens', 0))} of "
        f"{int(d.get('draft_tokens', 0))} drafted tokens accepted, acceptance length "
        f"{1 + d.get('accepted_tokens', 0) / drafts:.2f}, per position [{per_pos}]"
    )


def report(kind: str, tokens: int, seconds: float, text: str | None) -> None:
    print(f"  [{kind}] {tokens} tokens in {seconds:.2f} s = {tokens / seconds if seconds else 0:.1f} tok/s")
    if text is not None:
        print("      | " + text.replace("\n", "\n      | "))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    connection_args(p)
    p.add_argument("--model", default=None, help="model name (default: the first one /v1/models lists)")
    p.add_argument(
        "--prompt", action="append", default=None, help="completion prompt (repeatable; default: two Python snippets)"
    )
    p.add_argument("--chat", action="append", default=None, help="chat message (repeatable)")
    p.add_argument("--stream", action="append", default=None, help="streaming chat message (repeatable)")
    p.add_argument(
        "--no-chat",
        action="store_true",
        help="skip chat and streaming chat (a model without a chat template answers them with an error)",
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default %(default)s)")
    args = p.parse_args(argv)

    from openai import OpenAI

    client = OpenAI(base_url=urls(args.base_url)[0], api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    before = spec_counters(args.base_url)

    for prompt in args.prompt or COMPLETION_PROMPTS:
        print(f"- completion, prompt {prompt!r}")
        t0 = time.perf_counter()
        r = client.completions.create(model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0.0)
        report("completion", r.usage.completion_tokens, time.perf_counter() - t0, r.choices[0].text)
    for message in () if args.no_chat else (args.chat or CHAT_MESSAGES):
        print(f"- chat, user: {message!r}")
        t0 = time.perf_counter()
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": message}], max_tokens=args.max_tokens, temperature=0.0
        )
        report("chat", r.usage.completion_tokens, time.perf_counter() - t0, r.choices[0].message.content or "")
    for message in () if args.no_chat else (args.stream or STREAM_MESSAGES):
        print(f"- streaming chat, user: {message!r}\n      | ", end="", flush=True)
        t0, tokens = time.perf_counter(), 0
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": message}],
            max_tokens=args.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
            for choice in chunk.choices:
                print((choice.delta.content or "").replace("\n", "\n      | "), end="", flush=True)
        print()
        report("stream", tokens, time.perf_counter() - t0, None)

    after = spec_counters(args.base_url)
    print(
        "speculative decoding: off (no vllm:spec_decode_* counters in /metrics)"
        if before is None or after is None
        else acceptance_line(before, after)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
