"""The load generator of ``vllm-eagle3 bench``, light on the 2-core server: greedy ``/v1/completions``
(``ignore_eos``), closed loop at ``concurrency``, plain or streamed; tokens from ``usage``, each request's spec-decode
counters from vLLM's per-request metrics (servers run with ``per-request-spec-decode-metrics: summary``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Mapping, Sequence

NAN = float("nan")


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    prompt: int  # index into the prompt file
    tokens: int  # completion tokens (usage)
    latency_s: float  # send -> full response (plain) or last chunk (streamed)
    text: str = ""
    ttft_s: float = NAN  # streamed only: send -> first chunk with text
    counters: tuple | None = None  # speculating servers: (drafts, draft_tokens, accepted, per-position accepted)

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


def spec_counters(response: Any) -> tuple | None:
    """(drafts, draft tokens, accepted, accepted per position) of one request, from vLLM's per-request
    ``metrics.speculative_decoding`` (its ``acceptance_histogram[j]``: verify steps that accepted exactly j drafts, so
    position i was accepted in the steps with j > i); None from a server that does not speculate."""
    if not (sd := ((getattr(response, "model_extra", None) or {}).get("metrics") or {}).get("speculative_decoding")):
        return None
    hist = sd["acceptance_histogram"]
    return (
        sd["num_spec_steps"],
        sd["num_draft_tokens"],
        sd["num_accepted_draft_tokens"],
        tuple(float(sum(hist[i + 1 :])) for i in range(len(hist) - 1)),
    )


def summed(records: Sequence[RequestRecord]) -> list | None:
    """A cell's counters: its requests' summed (None when no request carries any)."""
    cs = [r.counters for r in records if r.counters]
    return [*(sum(c[i] for c in cs) for i in range(3)), [sum(x) for x in zip(*(c[3] for c in cs))]] if cs else None


async def _one(client, model: str, idx: int, prompt: Sequence[int], max_tokens: int, stream: bool) -> RequestRecord:
    t0 = time.perf_counter()
    streamed = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    resp = await client.completions.create(
        model=model,
        prompt=list(prompt),
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body={"ignore_eos": True},
        **streamed,
    )
    if not stream:
        dt = time.perf_counter() - t0
        return RequestRecord(
            idx,
            int(resp.usage.completion_tokens) if resp.usage else 0,
            dt,
            resp.choices[0].text if resp.choices else "",
            counters=spec_counters(resp),
        )
    first = last = NAN
    parts, tokens, counters = [], 0, None
    async for chunk in resp:
        now = time.perf_counter() - t0
        for choice in chunk.choices or ():
            if choice.text:
                parts.append(choice.text)
                first = now if first != first else first
                last = now
        if getattr(chunk, "usage", None) is not None:
            tokens, counters = int(chunk.usage.completion_tokens), spec_counters(chunk)
    return RequestRecord(idx, tokens, last, "".join(parts), first, counters)


async def _cell(
    base_url: str,
    model: str,
    prompts: Sequence[tuple[int, Sequence[int]]],
    concurrency: int,
    max_tokens: int,
    stream: bool,
) -> tuple[float, list[RequestRecord]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="EMPTY", max_retries=0, timeout=1800)
    sem = asyncio.Semaphore(concurrency)

    async def run(idx, p):
        async with sem:
            return await _one(client, model, idx, p, max_tokens, stream)

    t0 = time.perf_counter()
    try:
        out = list(await asyncio.gather(*(run(i, p) for i, p in prompts)))
    finally:
        await client.close()
    return time.perf_counter() - t0, out


def cell(
    base_url: str,
    model: str,
    prompts: Sequence[tuple[int, Sequence[int]]],
    concurrency: int,
    max_tokens: int,
    stream: bool = False,
) -> tuple[float, list[RequestRecord]]:
    """Wall seconds (first send to last response) and one record per request (see module doc); ``stream``: each
    request's time to first token and inter-token latency too (run at concurrency 1)."""
    return asyncio.run(_cell(base_url, model, prompts, concurrency, max_tokens, stream))


def worker_rpc(base_url: str, method: str) -> list[Any]:
    """Call a :class:`~.timers.StepTimers` method in every worker (``POST /collective_rpc``); one result per worker."""
    import urllib.request

    req = urllib.request.Request(
        base_url.rstrip("/") + "/collective_rpc",
        data=json.dumps({"method": method}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120.0) as resp:  # noqa: S310 - loopback URL we built
        text = resp.read().decode()
    return (json.loads(text) if text else {}).get("results", [])
