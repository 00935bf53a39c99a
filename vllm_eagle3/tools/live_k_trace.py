"""``vllm-eagle3 live-k-trace``: live k started deliberately wrong, under sustained load, traced step by step.

Data flow position: outside the engine, as a client. Serves the shipped pair as ``configs/serve_kimi_k25_mini.yaml``
does, live k on with its default settings, but with the config's k table replaced by ``--start-k`` at every batch
size (k = 5 where the right k is 1-2, or k = 1 where it is 5). ``--concurrency`` clients keep that many greedy
requests of held-out prompts (``bench/heldout_prompts.json``, which no head trained on) in flight until
``--requests`` are done. Every ``--every`` seconds it reads live k's report (``GET /v1/eagle3/wiring``) and the tokens
completed since the sample before, so the trace shows, over time and over decode steps, which k the busiest
batch-size bucket drafts, when it changes, and the tokens per second it gets.

Writes ``live_k_trace.json`` (machine, date, commit, settings, every sample, the final live-k report) and
``live_k_trace.png`` (k and tokens/s over time; with the ``bench`` extra) into ``--out-dir`` (default outside the
repository); ``--publish`` also copies them to ``bench/live-k-trace/<host kind>-start<k>-c<concurrency>/``. The
numbers say how live k behaves on the machine that ran it; side-by-side speedups are ``vllm-eagle3 bench``'s.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import queue
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from vllm_eagle3 import envs
from vllm_eagle3.live_k import bucket_of
from vllm_eagle3.tools import OUTPUT_HOME, REPO, bundled
from vllm_eagle3.tools.serve.process import VllmServer, http_get, served_model_name

SERVE_CONFIG = "configs/serve_kimi_k25_mini.yaml"
PROMPTS = "bench/heldout_prompts.json"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 live-k-trace",
        description="Live k from a wrong start under sustained load: k and tokens/s over time (module docstring).",
    )
    p.add_argument("--start-k", type=int, default=5, help="k at every batch size when serving starts (default 5)")
    p.add_argument("--max-k", type=int, default=5, help="num_speculative_tokens: the largest k (default 5)")
    p.add_argument("--concurrency", type=int, default=32, help="requests kept in flight (default 32)")
    p.add_argument("--requests", type=int, default=384, help="requests in all (default 384)")
    p.add_argument("--max-tokens", type=int, default=96, help="tokens per request, EOS ignored (default 96)")
    p.add_argument("--every", type=float, default=5.0, help="seconds between two samples (default 5)")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=OUTPUT_HOME / "live-k-trace",
        help=f"where the trace goes (default {OUTPUT_HOME / 'live-k-trace'})",
    )
    p.add_argument(
        "--live-k",
        type=json.loads,
        default=True,
        metavar="JSON",
        help="live k's settings as the serve config's live_k takes them, e.g. '{\"hold\": 8}' (default true: the "
        "shipped settings)",
    )
    p.add_argument(
        "--fixed",
        action="store_true",
        help="live k off: k = --start-k at every step (one cell of a static sweep, to compare live k's choice with)",
    )
    p.add_argument("--publish", action="store_true", help="also copy the trace into the repository's bench/")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    return p


def serve_args(start_k: int, max_k: int, live_k: Any = True) -> list[str]:
    """The shipped serve config (paths relative to the repository, where the server runs) with its speculative
    config's table replaced: ``start_k`` at every batch size, k up to ``max_k``; and its ``live_k`` replaced by
    ``live_k`` (false: the table as written), with ``host_table`` off unless given (the trace starts where it is
    told, not from a table measured on this host kind)."""
    import yaml

    cfg = yaml.safe_load(bundled(SERVE_CONFIG, "live-k-trace").read_text())
    spec = dict(cfg["speculative-config"])
    spec.update(num_speculative_tokens=max_k, num_speculative_tokens_per_batch_size=[[1, 4096, start_k]])
    extra = json.loads(json.dumps(cfg["additional-config"]))
    if live_k is not False:  # the start is the table above, not this host kind's (configs/live_k_start.yaml)
        live_k = {"host_table": False, **(live_k if isinstance(live_k, dict) else {})}
    extra["vllm_eagle3"]["live_k"] = live_k
    return [
        "--config",
        SERVE_CONFIG,
        "--speculative-config",
        json.dumps(spec),
        "--additional-config",
        json.dumps(extra),
    ]


def live_k_report(base_url: str) -> dict[str, Any]:
    status, raw = http_get(base_url + "/v1/eagle3/wiring", timeout=30)
    if status != 200:
        raise RuntimeError(f"GET /v1/eagle3/wiring answered {status}: {raw[:300]}")
    live = json.loads(raw).get("live_k")
    if not live:
        raise RuntimeError("the server reports no live k: is live_k on in its additional-config?")
    return live


def generated_tokens(base_url: str) -> float:
    """vLLM's ``vllm:generation_tokens_total`` (summed over engines): tokens generated so far, counted per step, not
    per finished request, so the tokens/s of a few seconds is not quantized by request lengths."""
    from vllm_eagle3.tools.serve.metrics import parse_prometheus

    status, body = http_get(base_url + "/metrics", timeout=30)
    if status != 200:
        raise RuntimeError(f"GET /metrics answered {status}: {body[:300]}")
    return sum(v for _, v in parse_prometheus(body).get("vllm:generation_tokens_total", []))


def busiest(live: dict[str, Any], concurrency: int) -> list[int] | None:
    """The table row (first, last, k) holding ``concurrency`` requests, else the last row seen."""
    rows = live.get("table") or []
    return next((r for r in rows if r[0] <= concurrency <= r[1]), rows[-1] if rows else None)


def drive(
    server: VllmServer, args: argparse.Namespace, prompts: list[list[int]], done: list[int], errors: list[str]
) -> None:
    """``args.concurrency`` threads, each sending the next request until ``args.requests`` are sent; ``done[0]``
    counts the finished requests, ``errors`` the failed ones (tokens come from vLLM's counter,
    :func:`generated_tokens`)."""
    from openai import OpenAI

    work: queue.Queue[int] = queue.Queue()
    for i in range(args.requests):
        work.put(i)
    model = served_model_name(server.base_url)
    lock = threading.Lock()

    def client() -> None:
        api = OpenAI(base_url=server.openai_url, api_key="EMPTY", max_retries=0, timeout=600)
        while True:
            try:
                i = work.get_nowait()
            except queue.Empty:
                return
            try:
                api.completions.create(
                    model=model,
                    prompt=prompts[i % len(prompts)],
                    max_tokens=args.max_tokens,
                    temperature=0,
                    extra_body={"ignore_eos": True},
                )
                with lock:
                    done[0] += 1
            except Exception as exc:  # noqa: BLE001 - counted and told at the end, the others go on
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def trace(server: VllmServer, args: argparse.Namespace, prompts: list[list[int]]) -> list[dict[str, Any]]:
    """Samples every ``args.every`` seconds while :func:`drive` runs; raises when any request failed."""
    done, errors = [0], []  # finished requests; failed requests
    runner = threading.Thread(target=drive, args=(server, args, prompts, done, errors), daemon=True)
    t0, last = time.monotonic(), (0.0, generated_tokens(server.base_url))
    samples_start = last[1]
    samples = []
    runner.start()
    while True:
        runner.join(timeout=args.every)
        now, tokens = time.monotonic() - t0, generated_tokens(server.base_url)
        live = live_k_report(server.base_url) if not args.fixed else {"table": [[1, 4096, args.start_k]]}
        row = busiest(live, args.concurrency)
        steps = sum(int(n) for n in live.get("steps_at_k", {}).values())
        samples.append(
            {
                "t_s": round(now, 2),
                "requests_done": done[0],
                "tokens": int(tokens - samples_start),
                "tokens_per_s": round((tokens - last[1]) / max(now - last[0], 1e-9), 2),
                "bucket": row[:2] if row else None,
                "k": row[2] if row else None,
                "changes": live.get("changes"),
                "steps": steps,
                "settled": live.get("settled", []),
            }
        )
        last = (now, tokens)
        if not args.no_progress:
            s = samples[-1]
            print(
                f"\r[live-k-trace] {s['t_s']:7.0f} s  {s['requests_done']}/{args.requests} requests  "
                f"k {s['k']} (batch {s['bucket']})  changes {s['changes']}  {s['tokens_per_s']:.1f} tok/s   ",
                end="",
                file=sys.stderr,
                flush=True,
            )
        if not runner.is_alive():
            break
    if not args.no_progress:
        print(file=sys.stderr)
    if errors:
        raise RuntimeError(f"{len(errors)} of {args.requests} request(s) failed, the first: {errors[0]}")
    return samples


def tokens_per_s(samples: Sequence[dict[str, Any]]) -> float:
    """Tokens per second over the whole run (the last sample's tokens over its time)."""
    return samples[-1]["tokens"] / samples[-1]["t_s"] if samples and samples[-1]["t_s"] > 0 else math.nan


def steady(samples: Sequence[dict[str, Any]], requests: int, concurrency: int) -> dict[str, Any] | None:
    """Tokens/s while ``concurrency`` requests were in flight: the samples after the first and before the last
    ``concurrency`` requests finished (the ramp and the tail, where fewer run, left out), their mean and a 95 %
    bootstrap interval over them (the bench's :func:`~vllm_eagle3.tools.bench.stats.mean_ci`; samples ``--every``
    seconds apart hold dozens of steps each): the level to compare with another run's, e.g. live k's against a fixed
    k's."""
    from vllm_eagle3.tools.bench.stats import mean_ci

    full = [s["tokens_per_s"] for s in samples if 0 < s["requests_done"] <= requests - concurrency]
    rates = full[1:]  # the first sample past the ramp still holds part of it
    if len(rates) < 3:
        return None
    est = mean_ci(rates, "live-k-trace steady", method="bootstrap over samples")
    return {"samples": est.n, "tokens_per_s": round(est.value, 2), "ci95": [round(est.lo, 2), round(est.hi, 2)]}


def step_summary(path: Path, concurrency: int) -> dict[str, Any] | None:
    """From the engine's step log (``$EAGLE3_LIVE_K_STEP_LOG``, live k on): per k, the cost samples of the bucket
    holding ``concurrency`` (steps that computed no prompt and verified the same k's drafts): how many, their median
    seconds per request, and the spread of log cost (the machine's step-to-step noise, what a probe must beat)."""
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    key = bucket_of(concurrency)
    per_k: dict[int, list[float]] = {}
    for r in rows:
        if r["sample"] and bucket_of(r["batch"]) == key and r["s"] > 0:
            per_k.setdefault(r["k"], []).append(math.log(r["s"] / r["batch"]))
    out = {}
    for k, logs in sorted(per_k.items()):
        mean = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)) if len(logs) > 1 else None
        out[str(k)] = {
            "samples": len(logs),
            "median_s_per_request": round(math.exp(sorted(logs)[len(logs) // 2]), 6),
            "sd_log_cost": round(sd, 4) if sd is not None else None,
        }
    return {"steps": len(rows), "prompt_steps": sum(r["prefill"] for r in rows), "bucket_cost_samples": out}


def plot(samples: Sequence[dict[str, Any]], title: str, path: Path, max_k: int = 5) -> bool:
    from vllm_eagle3.tools.bench.cells_text import pyplot

    plt = pyplot(str(path))
    if plt is None:
        return False
    fig, (ax_k, ax_t) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    t = [s["t_s"] for s in samples]
    ax_k.step(t, [s["k"] for s in samples], where="post")
    ax_k.set_ylabel("k of the busiest bucket")
    ax_k.set_ylim(-0.3, max_k + 0.3)
    ax_t.plot(t, [s["tokens_per_s"] for s in samples], marker=".")
    ax_t.set_ylabel("tokens/s")
    ax_t.set_xlabel("seconds")
    ax_k.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 0 <= args.start_k <= args.max_k:
        parser().error(f"--start-k must be in 0..--max-k ({args.max_k}), got {args.start_k}")
    from vllm_eagle3.tools.bench.report_adaptive import host_kind
    from vllm_eagle3.tools.machine import machine_info

    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    prompts = [list(it["prompt_token_ids"]) for it in json.loads(bundled(PROMPTS, "live-k-trace").read_text())["items"]]
    machine = machine_info()
    kind, slug = host_kind(machine)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())  # other work on the box moves step times
    steps_path = out / "steps.jsonl"
    steps_path.unlink(missing_ok=True)
    live_k = False if args.fixed else args.live_k
    server = VllmServer(
        serve_args(args.start_k, args.max_k, live_k),
        env={**os.environ, envs.LIVE_K_STEP_LOG: str(steps_path)},
        log_path=out / "server.log",
        cwd=REPO,
    )
    how = "live k off" if args.fixed else "live k on"
    print(f"[live-k-trace] serving with k = {args.start_k} at every batch size, {how} (log {out / 'server.log'})")
    with server:
        server.wait_ready(timeout=900)
        samples = trace(server, args, prompts)
        final = live_k_report(server.base_url) if not args.fixed else None
    result = {
        "date": date,
        "machine": machine,
        "host_kind": kind,
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "command": "vllm-eagle3 live-k-trace " + " ".join(sys.argv[1:] if argv is None else argv),
        "start_k": args.start_k,
        "max_k": args.max_k,
        "concurrency": args.concurrency,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "fixed": args.fixed,
        "samples": samples,
        "live_k": final,
        "steady": steady(samples, args.requests, args.concurrency),
        "steps": step_summary(steps_path, args.concurrency),
    }
    (out / "live_k_trace.json").write_text(json.dumps(result, indent=1) + "\n")
    what = f"k = {args.start_k} fixed" if args.fixed else f"live k from k = {args.start_k}"
    title = f"{what}, c = {args.concurrency}: {kind}, {date}, {machine.get('commit')}"
    drew = plot(samples, title, out / "live_k_trace.png", args.max_k)
    end = f"final table {final['table']}, changes {final['changes']}" if final else f"k = {args.start_k} fixed"
    print(f"[live-k-trace] {end}, {tokens_per_s(samples):.1f} tok/s over the run; wrote {out / 'live_k_trace.json'}")
    if args.publish:
        name = f"{slug}-{'fixed' if args.fixed else 'start'}{args.start_k}-c{args.concurrency}"
        dest = REPO / "bench" / "live-k-trace" / name
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("live_k_trace.json", "live_k_trace.png") if drew else ("live_k_trace.json",):
            shutil.copy2(out / name, dest / name)
        print(f"[live-k-trace] published into {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
