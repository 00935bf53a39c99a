#!/usr/bin/env python3
"""Query a running vllm-eagle3 / vLLM server with the OpenAI client: completions, chat, streaming chat.

Prints each answer, tokens/s, and, when the server speculates, the acceptance length and per-position acceptance
measured over these requests from vLLM's Prometheus counters on ``/metrics``
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``,
``..._num_accepted_tokens_per_pos_total``).

    examples/serve_miniature.sh &            # or: vllm-eagle3 serve --config configs/serve_kimi_k25_mini.yaml ...
    python examples/client.py --base-url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import sys

from vllm_eagle3.tools.demo import CHAT_MESSAGES, COMPLETION_PROMPTS, STREAM_MESSAGES, run_queries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    p.add_argument("--model", default=None, help="model name (default: the first one /v1/models lists)")
    p.add_argument("--prompt", action="append", default=None,
                   help="completion prompt (repeatable; default: three Python snippets)")
    p.add_argument("--chat", action="append", default=None, help="chat message (repeatable)")
    p.add_argument("--stream", action="append", default=None, help="streaming chat message (repeatable)")
    p.add_argument("--no-chat", action="store_true", help="skip chat and streaming chat (a model without a chat "
                                                          "template answers them with an error)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default %(default)s)")
    args = p.parse_args(argv)
    chats = () if args.no_chat else (args.chat or CHAT_MESSAGES)
    streams = () if args.no_chat else (args.stream or STREAM_MESSAGES)
    run_queries(args.base_url, model=args.model, completion_prompts=args.prompt or COMPLETION_PROMPTS,
                chat_messages=chats, stream_messages=streams, max_tokens=args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
