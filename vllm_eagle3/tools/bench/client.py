"""The load generator of ``vllm-eagle3 bench``: what a measuring client sends, and what it reads around it.

Data flow position: outside the server, between ``run.py`` (which says which prompts, how many in flight, how many
tokens) and the results file. The client must weigh on the 2-core server as little as a real one, so:

- :func:`plain_cell` (throughput cells): plain non-streaming ``/v1/completions`` (``openai`` async client), greedy,
  ``ignore_eos``; the token count comes from the response's ``usage``. One HTTP response per request: no per-chunk
  serialisation, no per-chunk usage. Closed loop: at most ``concurrency`` requests in flight, the next one sent when
  one returns. At concurrency 1 (``per_request_metrics``) ``/metrics`` is read between two requests, while the
  server is idle, so each request gets its own spec-decode counters (acceptance per prompt).
- :func:`stream_cell` (latency cells): streamed requests with usage only in the last chunk: time to first token
  and inter-token latency.
- :func:`worker_rpc`: ``POST /collective_rpc`` to the worker extension (:mod:`.timers`).

Every request's record: prompt index, tokens, seconds from send to response (from send to last chunk when
streamed), text (greedy text must be the same with and without speculation).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Mapping, Sequence

from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters

NAN = float("nan")


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    prompt: int  # index into the prompt file
    tokens: int  # completion tokens (usage)
    latency_s: float  # send -> full response (plain) or last chunk (streamed)
    text: str = ""
    ttft_s: float = NAN  # streamed only: send -> first chunk with text
    counters: tuple | None = None  # concurrency 1 only: (drafts, draft_tokens, accepted, per-position accepted)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RequestRecord":
        c = d.get("counters")
        return cls(**{**d, "counters": (c[0], c[1], c[2], tuple(c[3])) if c else None})

    @property
    def itl_s(self) -> float:
        """Streamed only: (last chunk - first chunk) / (tokens - 1)."""
        if self.ttft_s != self.ttft_s or self.tokens < 2:
            return NAN
        return (self.latency_s - self.ttft_s) / (self.tokens - 1)


def counters(base_url: str) -> SpecDecodeCounters | None:
    try:
        return SpecDecodeCounters.fetch(base_url)
    except LookupError:
        return None


def _as_tuple(c: SpecDecodeCounters | None) -> tuple | None:
    return None if c is None else (c.drafts, c.draft_tokens, c.accepted, tuple(c.accepted_per_pos))


def _client(base_url: str):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="EMPTY", max_retries=0, timeout=1800)


async def _plain_one(client, model: str, idx: int, prompt: Sequence[int], max_tokens: int) -> RequestRecord:
    t0 = time.perf_counter()
    resp = await client.completions.create(model=model, prompt=list(prompt), max_tokens=max_tokens, temperature=0.0,
                                           extra_body={"ignore_eos": True})
    dt = time.perf_counter() - t0
    text = resp.choices[0].text if resp.choices else ""
    return RequestRecord(idx, int(resp.usage.completion_tokens) if resp.usage else 0, dt, text)


async def _stream_one(client, model: str, idx: int, prompt: Sequence[int], max_tokens: int) -> RequestRecord:
    t0 = time.perf_counter()
    first = last = NAN
    parts, tokens = [], 0
    stream = await client.completions.create(model=model, prompt=list(prompt), max_tokens=max_tokens,
                                             temperature=0.0, stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    async for chunk in stream:
        now = time.perf_counter() - t0
        for choice in chunk.choices or ():
            if choice.text:
                parts.append(choice.text)
                first = now if first != first else first
                last = now
        if getattr(chunk, "usage", None) is not None:
            tokens = int(chunk.usage.completion_tokens)
    return RequestRecord(idx, tokens, last, "".join(parts), first)


async def _cell(base_url: str, model: str, prompts: Sequence[tuple[int, Sequence[int]]], concurrency: int,
                max_tokens: int, stream: bool, per_request_metrics: bool) -> tuple[float, list[RequestRecord]]:
    client = _client(base_url)
    one = _stream_one if stream else _plain_one
    t0 = time.perf_counter()
    try:
        if per_request_metrics and concurrency == 1:
            out = []
            for idx, p in prompts:
                before = counters(base_url)
                rec = await one(client, model, idx, p, max_tokens)
                after = counters(base_url)
                delta = after - before if (before is not None and after is not None) else None
                out.append(dataclasses.replace(rec, counters=_as_tuple(delta)))
            wall = time.perf_counter() - t0
        else:
            sem = asyncio.Semaphore(concurrency)

            async def run(idx, p):
                async with sem:
                    return await one(client, model, idx, p, max_tokens)

            out = list(await asyncio.gather(*(run(i, p) for i, p in prompts)))
            wall = time.perf_counter() - t0
    finally:
        await client.close()
    return wall, out


def plain_cell(base_url: str, model: str, prompts: Sequence[tuple[int, Sequence[int]]], concurrency: int,
               max_tokens: int, per_request_metrics: bool = False) -> tuple[float, list[RequestRecord]]:
    """Wall seconds (first send to last response) and one record per request (see module doc)."""
    return asyncio.run(_cell(base_url, model, prompts, concurrency, max_tokens, False, per_request_metrics))


def stream_cell(base_url: str, model: str, prompts: Sequence[tuple[int, Sequence[int]]],
                max_tokens: int) -> tuple[float, list[RequestRecord]]:
    """Sequential streamed requests (time to first token, inter-token latency)."""
    return asyncio.run(_cell(base_url, model, prompts, 1, max_tokens, True, False))


def _post_json(url: str, body: Mapping[str, Any], timeout: float = 120.0) -> Any:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback URL we built
        text = resp.read().decode()
    return json.loads(text) if text else None


def worker_rpc(base_url: str, method: str) -> list[Any]:
    """Call a :class:`~.timers.StepTimers` method in every worker (``POST /collective_rpc``); one result per worker."""
    return (_post_json(base_url.rstrip("/") + "/collective_rpc", {"method": method}) or {}).get("results", [])
