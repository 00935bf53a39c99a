"""`vllm-eagle3 serve` with an EAGLE-3 head and a capture spec, measured from outside (test support).

Data flow position: the user's path end to end. One server (:class:`vllm_eagle3.tools.serve.process.VllmServer`) is
started, greedy completions of token-id prompts are requested over the OpenAI API (``return_token_ids``, no EOS
stop, several in flight), vLLM's speculative-decoding counters are read from ``/metrics`` before and after, and the
server is stopped; the caller compares the token ids and counters with its reference.
"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence


@dataclasses.dataclass
class ServedGreedy:
    """What :func:`serve_greedy` measured."""

    token_ids: list[list[int]]  # the greedy continuation of each prompt, in the prompts' order
    counters: Any  # vllm_eagle3.tools.serve.metrics.SpecDecodeCounters over these requests only
    log: str  # the server's whole log
    startup_s: float


def _greedy_completions(server: Any, model_name: str, prompt: Any, max_tokens: int, timeout: float) -> list[list[int]]:
    """One greedy completions request (no EOS stop) for ``prompt`` (token ids, or a list of them): the token ids of
    each choice, in the prompts' order."""
    from openai import OpenAI

    client = OpenAI(base_url=server.openai_url, api_key="EMPTY", max_retries=0, timeout=timeout)
    r = client.completions.create(
        model=model_name,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    return [[int(t) for t in c.model_extra["token_ids"]] for c in sorted(r.choices, key=lambda c: c.index)]


def greedy_token_ids(
    server: Any,
    model_name: str,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    in_flight: int,
    timeout: float = 600.0,
) -> list[list[int]]:
    """Greedy completions (token ids) of ``prompts`` (token ids), ``in_flight`` at a time, ``max_tokens`` each."""

    def one(prompt: Sequence[int]) -> list[int]:
        return _greedy_completions(server, model_name, [int(t) for t in prompt], max_tokens, timeout)[0]

    with ThreadPoolExecutor(in_flight) as ex:
        return list(ex.map(one, prompts))


def greedy_token_ids_together(
    server: Any, model_name: str, prompts: Sequence[Sequence[int]], max_tokens: int, timeout: float = 600.0
) -> list[list[int]]:
    """Greedy completions of ``prompts`` sent as ONE completions request (a list of prompts): vLLM's API server submits
    them to the engine together, so they join the batch within a step or two of each other. Concurrent HTTP requests
    (:func:`greedy_token_ids`) can reach the engine far apart on a loaded box."""
    return _greedy_completions(server, model_name, [[int(t) for t in p] for p in prompts], max_tokens, timeout)


def serve_greedy(
    target: Path,
    draft: Path,
    capture_spec: Path,
    serve_config: Path,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    in_flight: int,
    cwd: Path,
    num_speculative_tokens: int = 3,
    start_timeout: float = 900.0,
    request_timeout: float = 600.0,
    progress: Callable[[str], None] = print,
) -> ServedGreedy:
    """Start `vllm-eagle3 serve TARGET --config SERVE_CONFIG` with ``draft`` as an EAGLE-3 head
    (``num_speculative_tokens``) and ``--capture-spec``, run :func:`greedy_token_ids` on ``prompts`` (the model
    ``GET /v1/models`` names), read the spec-decode counters over those requests and the log, stop the server (also
    on failure)."""
    from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters
    from vllm_eagle3.tools.serve.process import VllmServer, served_model_name

    eagle3 = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": num_speculative_tokens})
    server = VllmServer(
        [
            str(target),
            "--config",
            str(serve_config),
            "--speculative-config",
            eagle3,
            "--additional-config",
            "{}",
            "--capture-spec",
            str(capture_spec),
        ],
        cwd=cwd,
    )
    server.start()
    try:
        startup = server.wait_ready(timeout=start_timeout, progress=progress, progress_every=30)
        before = SpecDecodeCounters.fetch(server.base_url)
        model = served_model_name(server.base_url)
        got = greedy_token_ids(server, model, prompts, max_tokens, in_flight, request_timeout)
        counters = SpecDecodeCounters.fetch(server.base_url) - before
        log = server.log_text()
    finally:
        server.stop()
    progress(f"server ready after {startup:.1f} s; {counters.summary()}")
    return ServedGreedy(got, counters, log, startup)


def greedy_mismatch(got: Sequence[Sequence[int]], want: Sequence[Sequence[int]]) -> str | None:
    """None when every continuation equals its reference token for token; else a message naming the first one
    that differs."""
    if len(got) != len(want):
        return f"{len(got)} continuations for {len(want)} references"
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if list(g) != list(w)]
    if not bad:
        return None
    i = bad[0]
    return (
        f"{len(bad)}/{len(got)} greedy continuations differ from the target's; first: prompt {i}: "
        f"{list(got[i])} vs {list(want[i])}"
    )


def reference_mismatch(
    server: Any, model_name: str, items: Sequence[dict], max_tokens: int, together: Sequence[int] = (1, 4)
) -> str | None:
    """``items`` (a head's eval_prompts.json entries) served greedily, the first ``n`` in one request for each ``n``
    in ``together``, against their transformers float32 continuations: None when every one is identical, else
    :func:`greedy_mismatch`'s message for the first ``n`` that differs."""
    for n in together:
        got = greedy_token_ids_together(server, model_name, [it["prompt_token_ids"] for it in items[:n]], max_tokens)
        bad = greedy_mismatch(got, [it["continuation_token_ids"][:max_tokens] for it in items[:n]])
        if bad is not None:
            return f"{n} prompt(s) in one request: {bad}"
    return None
