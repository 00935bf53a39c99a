"""Orchestration of ``vllm-eagle3 bench``: the servers (:func:`run_stretch`), the results file."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from vllm_eagle3 import envs
from vllm_eagle3.tools import REPO, bundled
from vllm_eagle3.tools.bench import client, live_cells
from vllm_eagle3.tools.bench.plan import (
    EMBED_TAP,
    LAYER_TAPS,
    MLA_OFF,
    MLA_ON,
    NATIVE,
    NATIVE_CAPTURES,
    NATIVE_LAYERS,
    NO_SPEC,
    Plan,
    Variant,
)
from vllm_eagle3.tools.bench.timers import step_split
from vllm_eagle3.tools.serve.process import ServerStartError, VllmServer, served_model_name

SCHEMA = 2
TIMERS_EXTENSION = "vllm_eagle3.tools.bench.timers.StepTimers"
STOCK_PLUGIN = "vllm_eagle3_model_patches"  # the 2nd vllm.general_plugins entry: CPU patches, no capture classes
MLA_ENV = envs.CPU_MLA_VERIFY_AS_DECODE  # vllm_eagle3/model_patches/vllm_cpu_mla_verify_decode.py
COMPILE_CACHE = ".cache/vllm"
START_TIMEOUT_S = {"eager": 400.0, "compiled": 1200.0}  # a cold compile takes ~270 s on a quiet 2-core box
SECOND_HEAD = "models/kimi-k25-mini-eagle3-taps-3-31-59"  # the same-taps capture A/B's head ...
SECOND_SPEC = "configs/kimi_k25_eagle3_taps_3_31_59.yaml"  # ... and its capture spec
PLUGIN_LINE = "vllm-eagle3: capturing taps"  # capture.py, in the worker
STOCK_LINE = "Using auxiliary layers from speculative config"  # vLLM's runner, stock model classes
CHECK_LINE = "vllm-eagle3 wiring check:"  # capture.py at load: what the online check scores, or why it is off


@dataclasses.dataclass(frozen=True)
class Wiring:
    """How one capture mode is served: the draft folder and the extra ``vllm-eagle3 serve`` arguments."""

    draft: Path
    args: tuple[str, ...] = ()


def repo_path(p: str | Path) -> Path:
    path = Path(p)
    return path if path.is_absolute() or path.exists() else bundled(path, "bench")


def native_taps(num_layers: int) -> tuple[int, ...]:
    """The taps SGLang < 0.5.13 captured by default (engine default ids, always +1: 3/31/59 of 61 layers); vLLM
    captures them in ``DeepseekV2Model.forward`` itself, no embedding involved."""
    from vllm_eagle3.conventions import engine_default_ids, ids_to_taps

    return ids_to_taps(engine_default_ids(num_layers), "sglang-legacy", num_layers)


def make_native_draft(draft: Path, out_dir: Path, taps: Sequence[int], num_layers: int) -> Path:
    """A copy of ``draft`` (config rewritten, weights symlinked) whose ids name ``taps`` in vLLM's convention: the
    real head's per-step cost, fed taps it was not trained on (the SGLang default wiring)."""
    from vllm_eagle3.conventions import taps_to_ids
    from vllm_eagle3.tools.convert import rewired_copy

    return rewired_copy(draft, out_dir, list(taps_to_ids(taps, "vllm", num_layers)))


def load_prompts(path: Path) -> list[list[int]]:
    return [list(it["prompt_token_ids"]) for it in json.loads(path.read_text())["items"]]


def live_k(base: Mapping[str, Any]) -> Any:
    """The base serve config's ``live_k`` (its additional-config's plugin mapping, read and checked as every vLLM
    process reads it), None without one."""
    from vllm_eagle3.live_k import CONFIG_NAME
    from vllm_eagle3.resolve import plugin_config

    return plugin_config(base.get("additional-config")).get(CONFIG_NAME)


def as_shipped(v: Variant, base: Mapping[str, Any]) -> Variant:
    """A live variant as the base serve config ships it: its k and its table (where live_k starts from)."""
    if not v.live:
        return v
    spec = base.get("speculative-config") or {}
    if not live_k(base) or not spec.get("num_speculative_tokens"):
        raise SystemExit(
            "vllm-eagle3 bench: the shipped default is speculation with live_k on (the serve config's "
            "additional-config: vllm_eagle3: live_k); --config has no speculation or no live_k"
        )
    k = int(spec["num_speculative_tokens"])
    table = spec.get("num_speculative_tokens_per_batch_size") or [[1, 4096, k]]
    return dataclasses.replace(v, k=k, schedule=tuple(tuple(int(x) for x in e) for e in table))


def serve_yaml(base: Mapping[str, Any], variant: Variant, draft: Path, out: Path) -> Path:
    """The serve config of one variant: the shipped one with k, the draft, eager/compiled and the timers set."""
    import yaml

    cfg = dict(base)
    cfg["model"] = str(repo_path(str(base["model"])).resolve())
    for key in ("port", "host", "additional-config"):  # additional-config: each wiring passes its own --capture-spec
        cfg.pop(key, None)
    if variant.live:  # the shipped default: live_k as the base says (serve merges the wiring's --capture-spec in)
        cfg["additional-config"] = {"vllm_eagle3": {"live_k": live_k(base)}}
    cfg["enable-prefix-caching"] = False  # the same prompts run in several cells: every request pays its prefill
    cfg["enforce-eager"] = not variant.compiled
    cfg["worker-extension-cls"] = TIMERS_EXTENSION  # inactive until bench_timers_start
    if variant.k == 0:
        cfg.pop("speculative-config", None)
    else:
        cfg["speculative-config"] = {
            **(base.get("speculative-config") or {}),
            "method": "eagle3",
            "model": str(draft.resolve()),
            "num_speculative_tokens": variant.k,
        }
        cfg["per-request-spec-decode-metrics"] = "summary"  # each response carries its request's counters
        cfg["speculative-config"].pop("num_speculative_tokens_per_batch_size", None)  # static k unless adaptive
        if variant.schedule:
            cfg["speculative-config"]["num_speculative_tokens_per_batch_size"] = [list(e) for e in variant.schedule]
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def serve_args(variant: Variant, wiring: Wiring, yml: Path, work: Path) -> list[str]:
    """``vllm-eagle3 serve``'s arguments: the serve YAML and the wiring's (a check-off variant's spec rewritten with
    ``check: {enabled: false}``, its other keys and check settings kept)."""
    import yaml

    args = list(wiring.args if variant.k else ())
    if not variant.check:
        i = args.index("--capture-spec") + 1
        spec, out = yaml.safe_load(Path(args[i]).read_text()) or {}, work / f"spec-{variant.key.replace('#', '-')}.yaml"
        spec["check"] = {**(spec.get("check") or {}), "enabled": False}
        out.write_text(yaml.safe_dump(spec, sort_keys=False))
        args[i] = str(out)
    return ["--config", str(yml), *args]


def server_env(variant: Variant) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # POST /collective_rpc, to start/stop/read the StepTimers
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["VLLM_CACHE_ROOT"] = str(REPO / COMPILE_CACHE)
    for name in (MLA_ENV, envs.VARIABLES[MLA_ENV].deprecated):  # "default": the plugin's, whatever the shell says
        env.pop(name, None)
    if variant.mla_verify in (MLA_OFF, MLA_ON):
        env[MLA_ENV] = "0" if variant.mla_verify == MLA_OFF else "1"
    if variant.capture in NATIVE_CAPTURES and any(  # installed: the native variants run stock vLLM model classes
        ep.name == STOCK_PLUGIN for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
    ):
        env["VLLM_PLUGINS"] = STOCK_PLUGIN  # vLLM's own model classes + only the CPU patches
    return env


def wirings(draft: Path, capture_spec: Path, plan: Plan, work: Path, num_layers: int) -> dict[str, Wiring]:
    """capture mode -> how it is served, for the modes ``plan`` uses (native drafts are written under ``work``)."""
    from vllm_eagle3.resolve import load_spec_yaml

    used = {v.capture for v in plan.variants}
    out = {NO_SPEC: Wiring(draft), EMBED_TAP: Wiring(draft, ("--capture-spec", str(capture_spec)))}
    if NATIVE in used:
        out[NATIVE] = Wiring(
            make_native_draft(draft, work / "native-draft", native_taps(num_layers), num_layers),
            ("--convention", "vllm"),
        )
    if used & {LAYER_TAPS, NATIVE_LAYERS}:
        second, spec = repo_path(SECOND_HEAD), repo_path(SECOND_SPEC)
        out[LAYER_TAPS] = Wiring(second, ("--capture-spec", str(spec)))
        out[NATIVE_LAYERS] = Wiring(
            make_native_draft(second, work / "native-second", load_spec_yaml(spec).taps, num_layers),
            ("--convention", "vllm"),
        )
    return out


def _record(v: Variant) -> dict[str, Any]:
    """A server's raw record, before anything is measured."""
    return {
        "key": v.key,
        "variant": v.as_dict(),
        "label": v.label,
        "ready_s": None,
        "error": None,
        "capture_line": "",
        "check_line": "",
        "mla_calls": {},
        "cells": [],
    }


KV_TOKENS_PER_GIB = 7584  # vLLM's "CPU KV cache size" at 1 GiB, miniature target + draft in float32
BLOCK_TOKENS = 16  # a request's last KV block is allocated whole
KV_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}  # vLLM-CPU's cache: the model's dtype


def kv_cache_gib(variant: Variant, plan: Plan, prompt_tokens: int, dtype: str = "float32") -> int:
    """GiB of KV cache that hold every request of the variant's busiest cell at once (prompt + output + a step's
    drafts + a block): a cell at concurrency C runs C requests per step instead of queueing the rest."""
    per_gib = KV_TOKENS_PER_GIB * 4 // KV_BYTES.get(str(dtype), 4)
    need = max(
        (
            c.concurrency * (prompt_tokens + plan.cell_size(c.kind, c.concurrency)[1] + variant.k + 1 + BLOCK_TOKENS)
            for c in variant.cells
        ),
        default=0,
    )
    return max(1, -(-need // per_gib))


def memory_short(kv_gib: int, meminfo: str | None = None) -> str:
    """Why one more server with ``kv_gib`` of KV cache (+ vllm_cpu.RUNTIME_GIB, + 1 GiB for the client and the page
    cache) does not fit next to the ones running; '' if it does."""
    from vllm_eagle3.tools.serve.vllm_cpu import RUNTIME_GIB, mem_available_gib

    avail, need = mem_available_gib(meminfo), kv_gib + RUNTIME_GIB + 1.0
    return (
        ""
        if avail >= need
        else (
            f"{avail:.1f} GiB of memory available, a server with {kv_gib} GiB of KV cache "
            f"needs ~{need:.0f} GiB next to the servers already running"
        )
    )


def _start(
    variant: Variant,
    base_cfg: Mapping[str, Any],
    wiring: Wiring,
    work: Path,
    log_dir: Path,
    say: Callable[[str], None],
    kv_gib: int = 1,
) -> tuple[VllmServer, dict[str, str], Path]:
    """Write the variant's serve YAML and start its server (not waited for) with ``kv_gib`` of KV cache."""
    yml = serve_yaml(base_cfg, variant, wiring.draft, work / f"serve-{variant.key.replace('#', '-')}.yaml")
    env, log = server_env(variant), log_dir / f"server-{variant.key.replace('#', '-')}.log"
    server = VllmServer(serve_args(variant, wiring, yml, work), env=env, log_path=log, cwd=REPO, kv_cache_gib=kv_gib)
    say(f"{variant.key}: starting the server (log {log})")
    server.start()
    return server, env, log


def _ready(
    variant: Variant,
    server: VllmServer,
    res: dict[str, Any],
    say: Callable[[str], None],
    start_timeout: float | None,
    prompts: Sequence[Sequence[int]],
    log: Path,
) -> bool:
    """Wait for the server, then warm it up (not recorded); False (and ``res["error"]``) if it did not start or the
    warm-up failed."""
    try:
        res["ready_s"] = server.wait_ready(
            timeout=start_timeout or START_TIMEOUT_S[variant.mode],
            progress=lambda s: say(f"{variant.key}:{s}"),
            progress_every=30,
        )
        say(f"{variant.key}: ready after {res['ready_s']:.0f} s")
        top = max(c.concurrency for c in variant.cells)
        client.cell(server.base_url, served_model_name(server.base_url), list(enumerate(prompts[:top])), top, 16)
    except ServerStartError as exc:
        res["error"] = str(exc).splitlines()[0]
        say(f"{variant.key}: server did not start: {exc}")
        return False
    except Exception as exc:  # noqa: BLE001 - a warm-up that fails: recorded, the others go on
        _failed(variant, res, exc, log, say)
        return False
    return True


def _failed(v: Variant, res: dict[str, Any], exc: Exception, log: Path, say: Callable[[str], None]) -> None:
    res["error"] = f"{type(exc).__name__}: {exc}"
    say(f"{v.key}: failed: {res['error']} (server log {log})")


def _run_cells(
    v: Variant,
    cells: Sequence,
    server: VllmServer,
    model: str,
    env: Mapping[str, str],
    log: Path,
    plan: Plan,
    prompts: Sequence[Sequence[int]],
    res: dict[str, Any],
    say: Callable[[str], None],
    progress: Callable[[Variant, str, int], str],
) -> None:
    """``cells`` of ``v`` one after the other on its server, into ``res``; then what the server says of its MLA
    verify path, its capture and its online check (read before stopping)."""
    for cell in cells:
        t = time.monotonic()
        rec = _run_cell(server.base_url, model, v, cell.kind, cell.concurrency, plan, prompts)
        res["cells"].append(rec)
        toks = sum(r["tokens"] for r in rec["requests"])
        say(
            f"{v.key}: {cell.kind} c={cell.concurrency}: {len(rec['requests'])} requests, {toks} tokens in "
            f"{time.monotonic() - t:.1f} s; {progress(v, cell.kind, cell.concurrency)}"
        )
    calls = client.worker_rpc(server.base_url, "bench_mla_calls")
    res["mla_calls"] = calls[0] if calls else {}
    if v.capture != NO_SPEC:
        needle = STOCK_LINE if envs.get("VLLM_PLUGINS", env) == STOCK_PLUGIN else PLUGIN_LINE
        lines = server.log_text().splitlines()
        taps = [ln for ln in lines if needle in ln]
        res["capture_line"] = taps[-1][taps[-1].index(needle) :] if taps else ""
        if not taps:
            say(f"{v.key}: warning: no `{needle}` line in {log}")
        checks = [ln for ln in lines if CHECK_LINE in ln]
        res["check_line"] = checks[0][checks[0].index(CHECK_LINE) :] if checks else ""


def chunks(n: int, concurrency: int) -> list[range]:
    """A side-by-side throughput cell's ``n`` prompts in turns: 8 chunks at concurrency 1 (requests are seconds
    long there: two at a time, so that a slow minute of the VM falls on every server), else 2 (each at least one
    wave of ``concurrency`` requests)."""
    parts = 8 if concurrency == 1 else 2
    parts = max(1, min(parts, n // max(1, concurrency)))
    size = -(-n // parts)
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


def turn_order(count: int, chunk: int) -> list[int]:
    """The servers' order for chunk ``chunk``: as listed, then reversed, alternately (A B C, C B A, A B C, ...): a
    linear drift of the machine over two chunks falls on every server alike."""
    order = list(range(count))
    return order if chunk % 2 == 0 else order[::-1]


def run_stretch(
    variants: Sequence[Variant],
    plan: Plan,
    base_cfg: Mapping[str, Any],
    wirings: Mapping[str, Wiring],
    prompts: Sequence[Sequence[int]],
    work: Path,
    log_dir: Path,
    say: Callable[[str], None],
    start_timeout: float | None = None,
    progress: Callable[[Variant, str, int], str] = lambda *_: "",
) -> list[dict[str, Any]]:
    """The servers of one stretch, each started and warmed up, all kept alive; the raw record of everything each
    measured. Stretch 0 (one server alone): its cells in order. Side by side: per concurrency, each of :func:`chunks`
    on every server with the cell, in :func:`turn_order`, merged into one cell per server; then each server's other
    cells, one server at a time. A server that fails to start or dies is recorded with its error; the others go on.
    ``progress`` (:class:`~.plan.Progress`) says after each cell how far the run is."""
    recs, turns = [_record(v) for v in variants], any(v.stretch for v in variants)
    live: list[tuple[Variant, dict, VllmServer, dict, Path]] = []
    try:
        for v, res in zip(variants, recs):
            kv = kv_cache_gib(v, plan, max(map(len, prompts)), base_cfg.get("dtype", "float32"))
            if turns and (short := memory_short(kv)):  # all stay alive: one more than the machine holds is OOM-killed
                res["skipped"] = short
                say(f"{v.key}: not started: {short}")
                continue
            server, env, log = _start(v, base_cfg, wirings[v.capture], work, log_dir, say, kv)
            live.append((v, res, server, env, log))
            if not _ready(v, server, res, say, start_timeout, prompts, log):
                say(f"{v.key}: stopping")
                server.stop()
                live.pop()
        models = {v.key: served_model_name(server.base_url) for v, _, server, _, _ in live}
        for c in sorted({c for v, *_ in live for c in v.cell_list("throughput")} if turns else ()):
            at = [x for x in live if c in x[0].cell_list("throughput") and not x[1]["error"]]
            n, parts, t = plan.throughput_requests(c), chunks(plan.throughput_requests(c), c), time.monotonic()
            got: dict[str, list] = {x[0].key: [] for x in at}  # per server: (wall s, requests) of each chunk
            before = {x[0].key: live_cells.snapshot(x[2].base_url) for x in at if x[0].live}
            for i, part in enumerate(parts):
                for v, res, server, _, log in (at[j] for j in turn_order(len(at), i)):
                    try:
                        if not res["error"]:
                            got[v.key].append(
                                client.cell(server.base_url, models[v.key], cycled(prompts, part), c, plan.max_tokens)
                            )
                    except Exception as exc:  # noqa: BLE001 - one broken server must not lose the others' cells
                        _failed(v, res, exc, log, say)
            for v, res, server, *_ in (x for x in at if not x[1]["error"]):
                reqs = [r for _, rs in got[v.key] for r in rs]
                res["cells"].append(
                    {
                        "kind": "throughput",
                        "concurrency": c,
                        "split": None,
                        "wall_s": sum(w for w, _ in got[v.key]),
                        "requests": [r.as_dict() for r in reqs],
                        "counters": client.summed(reqs),
                        "chunks": len(got[v.key]),
                        "live_k": live_cells.after_cell(server.base_url, before[v.key], c) if v.live else None,
                    }
                )
            said = [progress(x[0], "throughput", c) for x in at][-1:]
            say(
                f"side by side c={c}: {len(at)} servers x {n} requests in {len(parts)} turns, "
                f"{time.monotonic() - t:.1f} s; " + "".join(said)
            )
        for v, res, server, env, log in live:
            try:
                if not res["error"]:
                    _run_cells(
                        v,
                        [c for c in v.cells if not turns or c.kind != "throughput"],
                        server,
                        models[v.key],
                        env,
                        log,
                        plan,
                        prompts,
                        res,
                        say,
                        progress,
                    )
            except Exception as exc:  # noqa: BLE001
                _failed(v, res, exc, log, say)
    finally:
        for v, _, server, _, _ in live:
            say(f"{v.key}: stopping")
            server.stop()
    return recs


def _run_cell(
    url: str, model: str, variant: Variant, kind: str, c: int, plan: Plan, prompts: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """One cell on the server at ``url``: split and untimed send the same requests, with / without the worker timers."""
    rec: dict[str, Any] = {"kind": kind, "concurrency": c, "counters": None, "split": None}
    n, tokens = plan.cell_size(kind, c)
    before = live_cells.snapshot(url) if variant.live else None
    if kind == "split":
        started = client.worker_rpc(url, "bench_timers_start")
        rec["draft_timed"] = bool(started and started[0].get("draft_timed"))
    wall, reqs = client.cell(url, model, cycled(prompts, range(n)), c, tokens, kind == "stream")
    if kind == "split":
        records = client.worker_rpc(url, "bench_timers_stop")
        rec["split"] = (
            step_split(records[0], c * (variant.k + 1)).as_dict() if records and isinstance(records[0], list) else None
        )
    rec["counters"] = client.summed(reqs)
    rec["wall_s"] = wall
    rec["requests"] = [r.as_dict() for r in reqs]
    rec["live_k"] = live_cells.after_cell(url, before, c) if variant.live else None
    return rec


def cycled(prompts: Sequence[Sequence[int]], part: Sequence[int]) -> list[tuple[int, Sequence[int]]]:
    """(prompt index, prompt) of requests ``part``: a sustained cell's requests past the prompt file's end send its
    prompts again, under their own index (e.g. 256 prompts: request 300 is prompt 44)."""
    return [(p % len(prompts), prompts[p % len(prompts)]) for p in part]


def write_results(path: Path, meta: Mapping[str, Any], plan: Plan, variants: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"schema": SCHEMA, "meta": dict(meta), "plan": plan.as_dict(), "variants": list(variants)},
            indent=1,
            default=str,
        )
        + "\n"
    )
