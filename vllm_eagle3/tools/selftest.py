"""``vllm-eagle3 selftest``: on the box that will serve, with the bundled miniature, on whatever runner vLLM picks
there, check the whole chain in a few minutes and say so on one screen (exit 0 when every line is ok, else 1).

Data flow position: end to end, inside real vLLM engines (offline ``LLM``; :mod:`vllm_eagle3.tools.engine`):
target forward -> taps -> cat in spec order -> draft ``combine_hidden_states`` -> proposer -> verify. One speculative
engine and one without speculation, float32 (exact greedy comparisons), the capture spec
``configs/kimi_k25_eagle3.yaml`` with its online check following every request. The lines:

- ``runner``: the model runner vLLM built (V1, or V2 from ``vllm/v1/worker/gpu/``) and its class;
- ``taps``: the aux list of one prefill against transformers' ``hidden_states`` of the same weights (embed exact,
  layer taps within ``TAP_RTOL`` of the largest value and farther from their neighbouring layers);
- ``draft input``: on every target step the draft's input is ``cat`` of the spec's taps in its order, exactly, its
  first slot the embedding the target consumed;
- ``greedy``: speculative output token-identical to non-speculative output;
- ``acceptance``: served acceptance length against the model card's served walk on the same prompts;
- ``check`` and ``watch``: the online wiring check and the acceptance watch are not alarmed (and the check scored).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from vllm_eagle3 import envs
from vllm_eagle3.tools import bundled

TAP_RTOL = 1e-3
"""Layer taps: max |vLLM - transformers| / max |transformers| in float32 (measured ~1e-6 on CPU: kernel reassociation
only); neighbouring layers differ by > 1e-1. Loose enough for GPU float32 kernels (TF32 off), tight enough that an
off-by-one tap cannot pass (each neighbour must be farther than 10x it)."""
ACCEPTANCE_TOL = 0.1
"""Served acceptance length vs the card's served walk (k = 3, the same prompts): the bound and reasons of
tests/e2e/test_serving.py (chains that run past the recorded tokens, rare float32 argmax near-ties)."""
_RECORDS = "_vllm_eagle3_selftest"


@dataclasses.dataclass
class Line:
    name: str
    ok: bool
    text: str


# ----------------------------------------------------------------------------------------------- in the worker


def _runner_info(worker: Any) -> dict[str, Any]:
    """``collective_rpc`` target: the runner vLLM built, and whether it is Model Runner V2's."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2

    runner = worker.model_runner
    cls = type(runner)
    return {"class": f"{cls.__module__}.{cls.__name__}", "v2": isinstance(runner, V2)}


def _install_recorders(worker: Any) -> int:
    """``collective_rpc`` target: record every target forward (the embedding it consumed, its aux list) and every
    draft input (``combine_hidden_states``' argument), in order; clears earlier records."""
    runner = worker.model_runner
    target = runner.get_model()
    draft = (getattr(runner, "speculator", None) or getattr(runner, "drafter")).model
    if not hasattr(target, _RECORDS):
        lm = getattr(target, "language_model", target)
        recs: dict[str, list] = {"target": [], "draft": []}

        def pre(module, args, kwargs):
            ids, embeds = kwargs.get("input_ids", args[0] if args else None), kwargs.get("inputs_embeds")
            recs["pending"] = embeds.detach().clone() if embeds is not None else lm.model.embed_input_ids(ids).detach()

        def post(module, args, output):
            if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], list):
                recs["target"].append((recs.pop("pending"), [t.detach().clone() for t in output[1]]))

        target.register_forward_pre_hook(pre, with_kwargs=True)
        target.register_forward_hook(post)
        combine = draft.combine_hidden_states

        def recording(hidden_states):
            recs["draft"].append(hidden_states.detach().clone())
            return combine(hidden_states)

        draft.combine_hidden_states = recording
        setattr(target, _RECORDS, recs)
    recs = getattr(target, _RECORDS)
    recs["target"].clear()
    recs["draft"].clear()
    return len(recs)


def _draft_input_report(worker: Any, num_taps: int) -> dict[str, Any]:
    """``collective_rpc`` target: each draft input against the target step it came from (paired in order): the first
    ``num_taps`` entries of the step's aux list concatenated, exactly, slot 0 the embedding the target consumed."""
    recs = getattr(worker.model_runner.get_model(), _RECORDS)
    steps, draft = recs["target"], recs["draft"]
    out: dict[str, Any] = {
        "target_steps": len(steps),
        "draft_calls": len(draft),
        "exact": 0,
        "problems": [],
        "rows": [aux[0].shape[0] for _, aux in steps],
    }  # tokens per step: the batch shrinks
    for i, ((embed, aux), fed) in enumerate(zip(steps, draft)):
        n = min(fed.shape[0], aux[0].shape[0], embed.shape[0])
        want = torch.cat([t[:n] for t in aux[:num_taps]], -1)  # [n, num_taps * hidden]
        if fed.shape[1] != want.shape[1]:
            out["problems"].append(f"step {i}: draft input width {fed.shape[1]}, spec taps give {want.shape[1]}")
        elif not torch.equal(fed[:n], want):
            out["problems"].append(f"step {i}: draft input is not cat(spec taps) in spec order")
        elif not torch.equal(fed[:n, : embed.shape[1]], embed[:n]):
            out["problems"].append(f"step {i}: the draft's first slot is not the embedding the target consumed")
        else:
            out["exact"] += 1
    out["problems"] = out["problems"][:3]
    return out


def _prefill_taps(worker: Any, num_rows: int, num_taps: int) -> list[torch.Tensor] | None:
    """``collective_rpc`` target: the spec's taps of the first recorded forward over exactly ``num_rows`` tokens."""
    for _, aux in getattr(worker.model_runner.get_model(), _RECORDS)["target"]:
        if aux[0].shape[0] == num_rows:
            return [t.float().cpu() for t in aux[:num_taps]]
    return None


# ----------------------------------------------------------------------------------------------- the checks


def tap_line(got: list[torch.Tensor] | None, reference: torch.Tensor, taps: tuple[int, ...]) -> Line:
    """``got``: the engine's taps for one prompt (spec order, each [T, H]); ``reference`` [L + 1, T, H]."""
    from vllm_eagle3.spec import EMBED, taps_label

    if got is None:
        return Line("taps", False, "no prefill forward of the prompt was recorded")
    worst = 0.0
    for k, g in zip(taps, got):
        scale = reference[k].abs().max().item()
        rel = (g - reference[k]).abs().max().item() / scale
        near = min((g - reference[j]).abs().max().item() / scale for j in (k - 1, k + 1) if 0 <= j < len(reference))
        if (k == EMBED and not torch.equal(g, reference[k])) or rel > TAP_RTOL or near <= 10 * TAP_RTOL:
            return Line(
                "taps",
                False,
                f"tap {k}: {rel:.2g} from transformers' hidden_states[{k}] (bound "
                f"{TAP_RTOL:g}), {near:.2g} from a neighbouring layer",
            )
        worst = max(worst, rel)
    return Line(
        "taps",
        True,
        f"{taps_label(taps)} = transformers' hidden_states (embed exact, layers within "
        f"{worst:.1g} <= {TAP_RTOL:g} relative)",
    )


def card_walk(draft: Path, k: int, n: int) -> float | None:
    """The draft's model card served walk (``eval.json``) pooled over its first ``n`` prompts, or None."""
    try:
        walk = json.loads((draft / "eval.json").read_text())["simulated_acceptance"]["served_walk"][str(k)]
        per = walk["per_sequence"][:n]
    except (OSError, KeyError, ValueError):
        return None
    return 1.0 + sum(a for _, a in per) / sum(d for d, _ in per) if len(per) == n else None


def per_position(llm) -> list[float]:
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            return [float(v) for v in getattr(m, "values", [])]
    return []


def health_lines(
    check_dir: Path, spec: Path, draft: Path, k: int, drafts: float, accepted_per_pos: list[float]
) -> list[Line]:
    """The online check's report, and the acceptance watch's verdict on the served counters (the settings and the
    model card expectation a server's watch would use: :mod:`vllm_eagle3.watch`)."""
    from vllm_eagle3 import verdicts
    from vllm_eagle3.resolve import load_spec_file
    from vllm_eagle3.watch import WatchConfig, WiringWatch, expectation_for
    from vllm_eagle3.wiring_check import read_report_file

    report = read_report_file(check_dir / "engine0.json") or {}
    verdict, scored = report.get("verdict", "missing"), report.get("scored_requests", 0)
    why = report.get("off_because") or (
        f"the served taps lose {report.get('loss', 0):.0%}"
        if verdict in verdicts.ALARMS
        else f"{scored} requests scored, configured wiring position-0 "
        f"{(report.get('configured') or {}).get('position0', 0):.3f}"
    )
    cost = report.get("cost") or {}
    if cost:  # every request followed here (sample_every 1): the check's dearest setting
        why += f"; cost {cost['seconds']:.2f} s, {cost['fraction_of_engine_time']:.1%} of engine time"
    lines = [
        Line("check", verdict not in (*verdicts.ALARMS, verdicts.OFF, "missing") and scored > 0, f"{verdict}: {why}")
    ]
    cfg = load_spec_file(spec).watch or WatchConfig()
    if not cfg.enabled:
        return [*lines, Line("watch", False, "off in the capture spec")]
    watch = WiringWatch(cfg, expectation_for(draft, k, cfg), {}, k, "vllm-eagle3 doctor")
    seen = watch.observe(int(drafts), [int(a) for a in accepted_per_pos])
    return [
        *lines,
        Line(
            "watch",
            seen not in verdicts.ALARMS,
            f"{seen} over {drafts:.0f} drafts (position-0 {accepted_per_pos[0] / max(drafts, 1):.3f})",
        ),
    ]


# ----------------------------------------------------------------------------------------------- main


def selftest(
    target: Path,
    draft: Path,
    spec: Path,
    k: int,
    num_prompts: int,
    max_tokens: int,
    say=print,
    prepare=None,
    after=None,
    baseline: bool = True,
) -> tuple[list[Line], dict[str, Any]]:
    """The lines and every number behind them. ``prepare(llm)`` / ``after(llm)``: run on the speculative engine once
    it is up / after its requests (tests change how its runner steps, and look at it afterwards). Without
    ``baseline`` no engine without speculation is started: greedy output is compared with the model card's recorded
    continuation (transformers, float32)."""
    from vllm_eagle3.resolve import load_spec_file
    from vllm_eagle3.tools.doctor.engine import engine_memory_env
    from vllm_eagle3.tools.engine import environment

    taps = load_spec_file(spec).spec.taps
    data: dict[str, Any] = {"taps": list(taps), "k": k, "prompts": num_prompts, "max_tokens": max_tokens}
    items = json.loads((draft / "eval_prompts.json").read_text())["items"][:num_prompts]
    prompts = [it["prompt_token_ids"] for it in items]
    data["card_tokens"] = None if baseline else [it["continuation_token_ids"][:max_tokens] for it in items]
    work = Path(tempfile.mkdtemp(prefix="vllm_eagle3_selftest_"))
    own_spec = work / "capture_spec.yaml"  # the shipped spec, its check following every request
    check = "check: {sample_every: 1, min_requests: 8, max_followed: 8, budget: 0.5}"
    own_spec.write_text(f"{spec.read_text()}\n{check}\n")
    (work / "check").mkdir()
    env = {
        envs.CHECK_DIR: str(work / "check"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        **engine_memory_env(target, draft, say),
    }

    say(f"starting vLLM with {draft.name} (k = {k}, float32) ...")
    with environment(env):  # the engine's processes and this one (the tensors the recorders send back)
        return _run(target, draft, taps, k, prompts, max_tokens, work, own_spec, env, data, say, prepare, after)


def _run(target, draft, taps, k, prompts, max_tokens, work, own_spec, env, data, say, prepare, after):
    from vllm import SamplingParams

    from vllm_eagle3.tools.doctor.measure import load_target, run_target
    from vllm_eagle3.tools.engine import counter_totals, start_engine, stop_engine
    from vllm_eagle3.wiring_check import read_report_file

    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    length = max(len(p) for p in prompts) + max_tokens + k + 8
    lines: list[Line] = []
    # The spec in vLLM's additional config, as the shipped serve configs carry it. The per-request draft back-off is
    # off: the acceptance line compares the head with its model card, which drafts at every step.
    import yaml

    plugin = {"vllm_eagle3": {"capture_spec": yaml.safe_load(own_spec.read_text()), "draft_backoff": False}}
    engine = start_engine(
        target,
        draft,
        env=env,
        num_speculative_tokens=k,
        max_model_len=max(256, length),
        additional_config=plugin,
        disable_log_stats=False,
    )
    try:
        info = engine.llm.collective_rpc(_runner_info)[0]
        data["runner"] = info
        lines.append(
            Line(
                "runner",
                True,
                f"{'V2' if info['v2'] else 'V1'} ({info['class']}), engine ready in {engine.startup_s:.0f} s",
            )
        )
        if prepare is not None:
            data["prepared"] = prepare(engine.llm)
        engine.llm.collective_rpc(_install_recorders)
        t0 = time.monotonic()
        outs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
        data["speculative_s"] = round(time.monotonic() - t0, 2)
        spec_tokens = [list(o.outputs[0].token_ids) for o in outs]
        if after is not None:
            data["after"] = after(engine.llm)
        report = engine.llm.collective_rpc(_draft_input_report, args=(len(taps),))[0]
        data["draft_input"] = report
        ok = report["exact"] == report["target_steps"] == report["draft_calls"] > 0
        lines.append(
            Line(
                "draft input",
                ok,
                f"cat(spec taps) exactly on {report['exact']} of "
                f"{report['target_steps']} target steps ({report['draft_calls']} draft "
                f"calls) {'; '.join(report['problems'])}".strip(),
            )
        )
        totals = counter_totals(engine.llm)
        drafts = totals.get("vllm:spec_decode_num_drafts", 0)
        accepted = totals.get("vllm:spec_decode_num_accepted_tokens", 0)
        per_pos = per_position(engine.llm)
        data.update(drafts=drafts, accepted=accepted, accepted_per_pos=per_pos)
        length_served = 1 + accepted / max(drafts, 1)
        walk = card_walk(draft, k, len(prompts))
        lines.append(
            Line(
                "acceptance",
                walk is not None and abs(length_served - walk) <= ACCEPTANCE_TOL,
                f"length {length_served:.3f} over {drafts:.0f} drafts, per position "
                f"{[round(a / max(drafts, 1), 3) for a in per_pos]}; model card served walk "
                f"{'unknown' if walk is None else f'{walk:.3f}'} (bound {ACCEPTANCE_TOL})",
            )
        )
        lines += health_lines(work / "check", own_spec, draft, k, drafts, per_pos)
        data["check"] = read_report_file(work / "check" / "engine0.json")
        engine.llm.collective_rpc(_install_recorders)
        engine.llm.generate(
            [{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False
        )
        got = engine.llm.collective_rpc(_prefill_taps, args=(len(prompts[0]), len(taps)))[0]
    finally:
        stop_engine(engine)
    reference = run_target(load_target(target), torch.tensor([prompts[0]])).taps[:, 0]  # [L + 1, T, H]
    lines.insert(1, tap_line(got, reference, taps))

    if data["card_tokens"] is not None:
        plain_tokens, than = data["card_tokens"], "as the model card's recorded float32 continuation"
    else:
        say("starting vLLM without speculation ...")
        plain = start_engine(target, None, env=env, max_model_len=max(256, length))
        try:
            t0 = time.monotonic()
            outs = plain.llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
            data["plain_s"] = round(time.monotonic() - t0, 2)
        finally:
            stop_engine(plain)
        plain_tokens, than = [list(o.outputs[0].token_ids) for o in outs], "with and without speculation"
    same = sum(a == b for a, b in zip(spec_tokens, plain_tokens))
    lines.insert(
        3,
        Line(
            "greedy", same == len(prompts), f"{same} of {len(prompts)} prompts x {max_tokens} tokens identical {than}"
        ),
    )
    data.update(speculative_tokens=spec_tokens, plain_tokens=plain_tokens)
    return lines, data


def main(argv: list[str] | None = None) -> int:
    target0, draft0 = bundled("models/kimi-k25-mini", "selftest"), bundled("models/kimi-k25-mini-eagle3", "selftest")
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 selftest",
        description=__doc__.split("\n\n")[0].replace("``", "`"),
        epilog="on vLLM-CPU, `vllm-eagle3 emulate v2 -- vllm-eagle3 selftest` runs it on "
        "Model Runner V2 (GPU vLLM's runner)",
    )
    p.add_argument("--target", type=Path, default=target0, help=f"target folder (default {target0})")
    p.add_argument(
        "--draft",
        type=Path,
        default=draft0,
        help=f"EAGLE-3 head with eval.json and eval_prompts.json "
        f"(default {draft0}; the MLA head: "
        "models/kimi-k25-mini-eagle3-mla)",
    )
    p.add_argument(
        "--capture-spec",
        type=Path,
        default=bundled("configs/kimi_k25_eagle3.yaml", "selftest"),
        help="the capture spec the draft was trained on (default: the bundled one)",
    )
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8, help="the model card's first N held-out prompts (default 8)")
    p.add_argument("--max-tokens", type=int, default=128, help="greedy tokens per prompt (default 128, as the card)")
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="start no engine without speculation: compare greedy output with the model card's recorded "
        "float32 continuation instead (faster; float32 only)",
    )
    p.add_argument("--json", type=Path, help="also write every number (and the tokens) here")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    say = lambda line: print(f"[selftest] {line}", flush=True)  # noqa: E731
    try:
        lines, data = selftest(
            args.target,
            args.draft,
            args.capture_spec,
            args.num_speculative_tokens,
            args.prompts,
            args.max_tokens,
            say,
            baseline=not args.no_baseline,
        )
    except Exception as exc:  # noqa: BLE001 - the operator gets one line and a non-zero exit, the log has the rest
        cause = getattr(exc, "engine_log", "")
        from vllm_eagle3.tools.serve.process import root_cause

        print(
            f"vllm-eagle3 selftest: FAILED before it finished: {root_cause(cause) or f'{type(exc).__name__}: {exc}'}",
            file=sys.stderr,
        )
        return 1
    width = max(len(line.name) for line in lines)
    print(f"\nvllm-eagle3 selftest ({args.target.name} + {args.draft.name}, {time.monotonic() - t0:.0f} s)")
    for line in lines:
        print(f"  {'ok  ' if line.ok else 'FAIL'}  {line.name:<{width}}  {line.text}")
    failed = [line.name for line in lines if not line.ok]
    print(f"{len(lines) - len(failed)} of {len(lines)} ok" + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.json:
        data.update(lines=[dataclasses.asdict(line) for line in lines], seconds=round(time.monotonic() - t0, 1))
        args.json.write_text(json.dumps(data, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
