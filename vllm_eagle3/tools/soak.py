"""``vllm-eagle3 soak``: one speculative server under mixed traffic for minutes, judged as operators judge it.

Data flow position: outside the engine, as a client. Starts the shipped pair as ``make demo`` serves it (EAGLE-3
k=3) on loopback, records a greedy reference, then runs ``--concurrency`` clients for ``--duration`` seconds, each
request drawn from a mix (:func:`draw_request`: completions and chats, every OpenAI sampling option, n > 1, streams
of which a third disconnect early, long and short prompts). Verdict (``verdict`` of the result):
- no 5xx, no transport error (a request that met a kept-alive connection the server had just closed is sent again
  once, :func:`stale_keepalive`); every 4xx one of :data:`EXPECTED_4XX` (vLLM's documented refusals), by reason;
- the server's memory (resident set of its process tree) grows after warm-up by at most ``--max-growth-mb`` and
  over the second half by at most ``--max-late-growth-mb`` (it levels off); every 5 s sample is kept per process
  and plotted (``soak_rss.png``), so a growth names its process;
- the greedy reference unchanged, ``/health`` 200, the spec-decode counters advanced, no wiring alarm
  (:func:`wiring_alarms`); the online check's report at the end is kept (``wiring_check``).
Writes ``soak.json`` and its plot into ``--out-dir`` (default outside the repository); ``--publish`` also writes them
as ``bench/soak.json`` and ``bench/soak_rss.png``, which the repository's BENCHMARKS.md shows
(``bench/report_soak.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as _dt
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from vllm_eagle3.tools import OUTPUT_HOME, REPO, bundled
from vllm_eagle3.tools.bench.cells_text import pyplot
from vllm_eagle3.tools.bench.report_soak import SOAK_RSS_PNG
from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters
from vllm_eagle3.tools.serve.process import VllmServer, served_model_name

SERVE_ARGS = ["--config", "configs/serve_kimi_k25_mini.yaml", "--capture-spec", "configs/kimi_k25_eagle3.yaml"]
REFERENCE_PROMPTS = ("def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n")
SHORT = ("def ", "import os\n", "x = ", "class A:\n", "for i in range(")
DEFAULT_OUT_DIR = OUTPUT_HOME / "soak"  # where a soak writes unless told (--out-dir)
PUBLISHED = "bench/soak.json"  # the soak the repository's BENCHMARKS.md shows (--publish)
EXPECTED_4XX: tuple[str, ...] = ()  # none: min_p and logit_bias are served under speculation
"""4xx answers that are vLLM's documented refusals (``vllm/v1/engine/input_processor.py``), not defects. min_p and
logit_bias are not among them: ``model_patches.vllm_cpu_spec_min_p_logit_bias`` serves them under speculation."""
ROLES = {"VLLM::EngineCore": "engine core", "VLLM::Worker": "worker"}
"""vLLM's process titles (``set_process_title``) -> role. psutil's ``Process.name()`` gives the whole title (it
completes the 15-character ``/proc/PID/comm`` from the command line), so a tensor-parallel worker keeps its own,
e.g. ``VLLM::Worker_TP1``."""


def tree_rss_by_process(root: int) -> dict[str, float]:
    """Resident memory (MiB) of ``root`` and each descendant, keyed ``"<pid> <role>"``: ``supervisor`` (``root``),
    ``API server`` (its python child that is no multiprocessing helper), ``engine core``, ``worker``, else the
    process name (psutil's ``Process.name()``). Zombies and processes gone meanwhile are left out."""
    import psutil

    from vllm_eagle3.tools.serve.supervisor import descendants

    out = {}
    for pid in [root, *descendants(root)]:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                name, ppid, cmdline, rss = proc.name(), proc.ppid(), proc.cmdline(), proc.memory_info().rss
        except psutil.Error:
            continue
        helper = any("multiprocessing" in arg for arg in cmdline)  # e.g. the resource tracker: no server
        role = (
            "supervisor"
            if pid == root
            else "API server"
            if ppid == root and name.startswith("python") and not helper
            else ROLES.get(name, name)
        )
        out[f"{pid} {role}"] = round(rss / 2**20, 1)
    return out


def plot_rss(result: dict, path: Path) -> bool:
    """Resident memory per process over the soak (``rss_mb_series``), as the change from each process's first sample
    after warm-up (warm-up shaded): which process grows, and whether it levels off. False without matplotlib."""
    plt = pyplot(str(path))
    if plt is None:
        return False

    series, warmup = result["rss_mb_series"], result["warmup_s"]
    t = series["t"]
    i0 = next((i for i, x in enumerate(t) if x >= warmup), 0)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    low = -50.0
    for name, mb in series["processes"].items():
        ref = next((x for x in mb[i0:] if x is not None), None)
        if ref is None or ref < 50:
            continue
        delta = [None if x is None else x - ref for x in mb]
        low = min([low, *(d for d in delta[i0:] if d is not None)])
        ax.plot([x / 60 for x in t], delta, label=f"{name.split(' ', 1)[-1]} ({ref:.0f} MiB after warm-up)")
    ax.set_ylim(bottom=low * 1.2)
    ax.axvspan(0, warmup / 60, color="0.9", label="warm-up")
    ax.axhline(result["max_growth_mb"], color="r", ls=":", lw=1, label="limit (whole tree)")
    ax.set_xlabel("minutes of traffic")
    ax.set_ylabel("resident memory change (MiB)")
    ax.set_title(
        f"vllm-eagle3 soak {result['date_utc']} UTC: tree growth after warm-up "
        f"{result['rss_growth_mb']:.0f} MiB (limit {result['max_growth_mb']:.0f})",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def long_prompt(rng: random.Random) -> str:
    """~600 tokens of Python (the server's max-model-len is 1024)."""
    src = Path(json.__file__).read_text()
    start = rng.randrange(0, len(src) - 2500)
    return src[start : start + 2000]


def draw_request(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    """(endpoint, body without model, label) of one mixed request."""
    prompt = long_prompt(rng) if rng.random() < 0.15 else rng.choice(SHORT + REFERENCE_PROMPTS)
    body: dict[str, Any] = {"max_tokens": rng.choice([1, 8, 32, 64, 128])}
    kind = rng.choice(["greedy", "sampled", "sampled", "logprobs", "n2", "penalties", "stop", "bias", "stream"])
    if kind != "greedy":
        body.update(
            temperature=rng.choice([0.3, 0.7, 1.0, 1.5]),
            top_p=rng.choice([1.0, 0.9, 0.5]),
            top_k=rng.choice([-1, 1, 5, 50]),
            seed=rng.randrange(10**6),
        )
        if rng.random() < 0.1:
            body["min_p"] = 0.05  # served under speculation (model_patches/vllm_cpu_spec_min_p_logit_bias.py)
    else:
        body["temperature"] = 0.0
    if kind == "logprobs":
        body["logprobs"] = rng.choice([1, 5])
    if kind == "n2":
        body["n"] = 2
    if kind == "penalties":
        body.update(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2)
    if kind == "stop":
        body["stop"] = ["\n\n", ":"]
    if kind == "bias":
        body["logit_bias"] = {str(rng.randrange(13, 4096)): rng.choice([-100, 5])}
    if rng.random() < 0.3:
        msgs = [{"role": "user", "content": prompt}]
        if kind == "logprobs":
            body.pop("logprobs")
            body.update(logprobs=True, top_logprobs=3)
        return "/v1/chat/completions", {**body, "messages": msgs}, f"chat-{kind}"
    return "/v1/completions", {**body, "prompt": prompt}, f"completion-{kind}"


@dataclasses.dataclass
class Tally:
    requests: int = 0
    by_status: dict = dataclasses.field(default_factory=dict)
    transport_errors: int = 0
    stale_retries: list = dataclasses.field(default_factory=list)  # requests sent again, see stale_keepalive()
    disconnects: int = 0
    tokens: int = 0
    first_errors: list = dataclasses.field(default_factory=list)
    refusals: dict = dataclasses.field(default_factory=dict)  # 4xx reason -> count

    def add(self, status: int, label: str, detail: str = "") -> None:
        self.requests += 1
        self.by_status[str(status)] = self.by_status.get(str(status), 0) + 1
        if 400 <= status < 500:
            try:
                reason = str(json.loads(detail)["error"]["message"])[:160]
            except (ValueError, KeyError, TypeError):
                reason = detail[:160]
            self.refusals[reason] = self.refusals.get(reason, 0) + 1
            if any(reason.startswith(e) for e in EXPECTED_4XX):
                return  # a documented refusal, tallied by reason above, not an error
        if status >= 400 and len(self.first_errors) < 10:
            self.first_errors.append(f"{status} {label}: {detail[:300]}")

    @property
    def unexpected_4xx(self) -> dict:
        return {r: n for r, n in self.refusals.items() if not any(r.startswith(e) for e in EXPECTED_4XX)}


def connection_trace():
    """aiohttp trace hooks that note, in a request's ``trace_request_ctx`` dict, whether it went out on a new
    connection or one reused from the session's keep-alive pool (``ctx["reused"]``): a transport error is then
    reported with the connection it happened on."""
    import aiohttp

    async def reused(_session, ctx, _params):
        if isinstance(ctx.trace_request_ctx, dict):
            ctx.trace_request_ctx["reused"] = True

    async def created(_session, ctx, _params):
        if isinstance(ctx.trace_request_ctx, dict):
            ctx.trace_request_ctx["reused"] = False

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(reused)
    trace.on_connection_create_end.append(created)
    return trace


def describe_transport_error(label: str, exc: BaseException, ctx: dict, idle_s: float | None, took_s: float) -> str:
    """One line for ``first_errors``: the exception, its cause, and the connection it happened on."""
    cause = exc.__cause__ or exc.__context__
    conn = {True: "reused keep-alive connection", False: "new connection"}.get(ctx.get("reused"), "no connection")
    idle = (
        f", idle {idle_s:.1f} s since this client's previous answer" if ctx.get("reused") and idle_s is not None else ""
    )
    return (
        f"transport {label}: {type(exc).__name__}: {exc}"
        + (f" (cause {type(cause).__name__}: {cause})" if cause else "")
        + f"; {conn}{idle}; failed {took_s:.1f} s after sending"
    )


def stale_keepalive(exc: BaseException, ctx: dict, answered: bool) -> bool:
    """The request failed on a kept-alive connection the server had already closed: reused from the pool, no answer
    started, the failure the connection's. The server never had the request; HTTP clients send it again once on a
    new connection (aiohttp for idempotent methods, the OpenAI SDK for POST too). Why the soak needs it: uvicorn
    closes a connection idle for ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` (5 s) from when it wrote the answer, and a client
    on a loaded box that reads it late and reuses the connection then gets ``ClientOSError: Can not write request
    body`` (``bench/soak_keepalive_repro.json``; ``tests/unit/test_soak_memory.py`` reproduces it)."""
    import aiohttp

    return (
        ctx.get("reused") is True
        and not answered
        and isinstance(exc, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))
    )


async def client_loop(base: str, model: str, deadline: float, seed: int, tally: Tally) -> None:
    import aiohttp

    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=300)
    last_answer = None  # when this client's previous response was fully read (its connection went back to the pool)
    async with aiohttp.ClientSession(timeout=timeout, trace_configs=[connection_trace()]) as session:
        while time.monotonic() < deadline:
            path, body, label = draw_request(rng)
            body["model"] = model
            stream = label.endswith("stream")
            if stream:
                body.update(stream=True, stream_options={"include_usage": True})
            for attempt in (1, 2):
                ctx: dict = {}
                answered = False
                sent = time.monotonic()
                try:
                    async with session.post(base + path, json=body, trace_request_ctx=ctx) as resp:
                        answered = True
                        if stream and resp.status == 200:
                            cut = rng.random() < 1 / 3
                            chunks = 0
                            async for _line in resp.content:
                                chunks += 1
                                if cut and chunks >= 3:
                                    tally.disconnects += 1
                                    break  # leaving the block closes the connection mid-stream
                            tally.add(resp.status, label)
                        else:
                            text = await resp.text()
                            tally.add(resp.status, label, text)
                            if resp.status == 200:
                                tally.tokens += json.loads(text).get("usage", {}).get("completion_tokens", 0)
                    last_answer = time.monotonic()
                    break
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    idle = None if last_answer is None else sent - last_answer
                    line = describe_transport_error(label, exc, ctx, idle, time.monotonic() - sent)
                    last_answer = None
                    if attempt == 1 and stale_keepalive(exc, ctx, answered):
                        tally.stale_retries.append(line)
                        continue  # once, on a new connection (the pool's one is closed)
                    tally.transport_errors += 1
                    if len(tally.first_errors) < 10:
                        tally.first_errors.append(line)
                    break


def greedy_reference(base: str, model: str) -> list[str]:
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="EMPTY")
    return [
        client.completions.create(model=model, prompt=p, max_tokens=48, temperature=0.0).choices[0].text
        for p in REFERENCE_PROMPTS
    ]


def late_growth(memory: list[tuple[float, float]]) -> float:
    """Growth (MiB) over the second half of the post-warm-up samples ``(t, MiB)``: the last sample minus the first
    at or after the midpoint in time (a cache still filling or a leak shows here, a plateau as noise); nan < 2."""
    if len(memory) < 2:
        return float("nan")
    mid = (memory[0][0] + memory[-1][0]) / 2
    return memory[-1][1] - next(mb for t, mb in memory if t >= mid)


def wiring_alarms(log: str) -> list[str]:
    """The watch's and the online check's alarm lines (``vllm_eagle3.verdicts.ALARM_LINE``): a right wiring raises
    none, sampled or not."""
    from vllm_eagle3.verdicts import ALARM_LINE

    return [ln for ln in log.splitlines() if "WARNING" in ln and ALARM_LINE.search(ln)]


def serve_args(draft: str | None) -> list[str]:
    """The shipped serve config and spec (one line naming where they were looked for if missing); with ``draft``, that
    EAGLE-3 head (k=3) instead of the config's."""
    args = [str(bundled(a, "soak")) if a.endswith(".yaml") else a for a in SERVE_ARGS]
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
    return [*args, "--speculative-config", spec] if draft else args


def soak(
    duration_s: float,
    concurrency: int,
    warmup_s: float,
    max_growth_mb: float,
    say=print,
    max_late_growth_mb: float = 20.0,
    draft: str | None = None,
) -> dict:
    from vllm_eagle3.tools.machine import loadavg, machine_info
    from vllm_eagle3.tools.serve.process import http_get

    load_before, machine = loadavg(), machine_info()  # the code that runs: HEAD (and dirty?) when the soak starts
    server = VllmServer(serve_args(draft), cwd=REPO, kv_cache_gib=None).start()
    say(
        f"[soak] starting the shipped pair (EAGLE-3 {draft or 'head of the serve config'}, eager) on "
        f"{server.base_url}; log {server.log_path}"
    )
    try:
        server.wait_ready(timeout=900, progress=say)
        base, model = server.base_url, served_model_name(server.base_url)
        reference = greedy_reference(base, model)
        before = SpecDecodeCounters.fetch(base)
        tally = Tally()
        memory: list[tuple[float, float]] = []
        by_process: list[dict[str, float]] = []  # the same samples per process: which one grows
        series: list[tuple[float, dict[str, float]]] = []  # every sample, warm-up included: the curve
        t0 = time.monotonic()

        async def run() -> None:
            deadline = t0 + warmup_s + duration_s
            clients = [asyncio.create_task(client_loop(base, model, deadline, i, tally)) for i in range(concurrency)]
            while any(not c.done() for c in clients):
                await asyncio.sleep(5)
                elapsed = time.monotonic() - t0
                per_process = tree_rss_by_process(server.proc.pid)
                series.append((round(elapsed, 1), per_process))
                if elapsed >= warmup_s:
                    memory.append((round(elapsed, 1), round(sum(per_process.values()), 1)))
                    by_process.append(per_process)
                if int(elapsed) % 60 < 5:
                    say(
                        f"[soak] {elapsed:5.0f} s: {tally.requests} requests {tally.by_status}, "
                        f"{tally.transport_errors} transport errors, rss {sum(per_process.values()):.0f} MiB"
                    )
            await asyncio.gather(*clients)

        asyncio.run(run())
        after_ref = greedy_reference(base, model)
        counters = SpecDecodeCounters.fetch(base) - before
        healthy = server.healthy()
        status, body = http_get(base + "/v1/eagle3/wiring")
        check = json.loads(body).get("check", {}) if status == 200 else {"error": f"GET /v1/eagle3/wiring -> {status}"}
        time.sleep(1.0)  # the log file is written by the server process
        alarms = wiring_alarms(server.log_text())
    finally:
        server.stop()
    five_xx = sum(n for s, n in tally.by_status.items() if s.startswith("5"))
    growth = memory[-1][1] - memory[0][1] if len(memory) >= 2 else float("nan")
    late = late_growth(memory)
    names = sorted({k for _, sample in series for k in sample}, key=lambda k: int(k.split()[0]))
    verdict = {
        "no_5xx": five_xx == 0,
        "no_transport_errors": tally.transport_errors == 0,
        "only_expected_4xx": not tally.unexpected_4xx,
        "memory_bounded": bool(growth <= max_growth_mb),
        "memory_levels_off": bool(late <= max_late_growth_mb),
        "greedy_unchanged": reference == after_ref,
        "healthy_at_end": healthy,
        "speculation_ran": counters.drafts > 0,
        "no_wiring_alarm": not alarms,
    }
    return {
        "what": "vllm-eagle3 soak: mixed traffic against one speculative server (shipped pair, eager, k=3)",
        "draft": str(draft) if draft else "the serve config's (models/kimi-k25-mini-eagle3)",
        "wiring_alarms": alarms,
        "wiring_check": check,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "commit": machine["commit"],
        "dirty": machine["dirty"],
        "load_before": load_before,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "concurrency": concurrency,
        "requests": tally.requests,
        "by_status": tally.by_status,
        "transport_errors": tally.transport_errors,
        "early_disconnects": tally.disconnects,
        "stale_keepalive_retries": len(tally.stale_retries),
        "stale_keepalive_first": tally.stale_retries[:10],
        "refusals_4xx": tally.refusals,
        "completion_tokens": tally.tokens,
        "first_errors": tally.first_errors,
        "rss_mb_first_last": [memory[0][1], memory[-1][1]] if memory else None,
        "rss_growth_mb": growth,
        "rss_mb_by_process_first_last": [by_process[0], by_process[-1]] if by_process else None,
        "rss_mb_series": {
            "t": [t for t, _ in series],
            "processes": {k: [sample.get(k) for _, sample in series] for k in names},
        },
        "max_growth_mb": max_growth_mb,
        "rss_late_growth_mb": late,
        "max_late_growth_mb": max_late_growth_mb,
        "acceptance_length": counters.acceptance_length,
        "drafts": counters.drafts,
        "verdict": verdict,
        "passed": all(verdict.values()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vllm-eagle3 soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600, help="seconds of traffic after warm-up (default 600)")
    p.add_argument("--warmup", type=float, default=60, help="seconds of traffic before memory is sampled (60)")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument(
        "--max-growth-mb",
        type=float,
        default=200,
        help="allowed growth of the server's resident memory after warm-up, MiB (default 200)",
    )
    p.add_argument(
        "--max-late-growth-mb",
        type=float,
        default=20,
        help="allowed growth over the second half of the sampled period, MiB (default 20): the memory "
        "must level off, not just stay under --max-growth-mb for this long",
    )
    p.add_argument(
        "--draft",
        default=None,
        metavar="DIR",
        help="serve this EAGLE-3 head (k=3) instead of the serve config's, e.g. "
        "models/kimi-k25-mini-eagle3-mla (same capture spec, configs/kimi_k25_eagle3.yaml)",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        metavar="DIR",
        help=f"write soak.json and its plot soak_rss.png here (default {DEFAULT_OUT_DIR})",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="the result file instead (its plot beside: <name>_rss.png)")
    p.add_argument(
        "--publish",
        action="store_true",
        help=f"also write the result as the repository's {PUBLISHED} and "
        f"{SOAK_RSS_PNG}, and its BENCHMARKS.md again (the soak the repository shows)",
    )
    args = p.parse_args(argv)
    result = soak(
        args.duration,
        args.concurrency,
        args.warmup,
        args.max_growth_mb,
        max_late_growth_mb=args.max_late_growth_mb,
        draft=args.draft,
    )
    out = args.out or args.out_dir / "soak.json"
    places = [(out, out.with_name(out.stem + "_rss.png"))] + [(REPO / PUBLISHED, REPO / SOAK_RSS_PNG)] * args.publish
    for path, png in places:  # this run's folder, then the repository's copy when asked
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        drawn = plot_rss(result, png)
        print(f"[soak] result written to {path}" + (f"; memory per process plotted in {png}" if drawn else ""))
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "requests",
                    "by_status",
                    "transport_errors",
                    "stale_keepalive_retries",
                    "rss_growth_mb",
                    "rss_late_growth_mb",
                    "wiring_alarms",
                    "verdict",
                    "passed",
                )
            },
            indent=1,
        )
    )
    if args.publish:
        from vllm_eagle3.tools.bench.cli import repo_page

        repo_page()
    return 0 if result["passed"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
