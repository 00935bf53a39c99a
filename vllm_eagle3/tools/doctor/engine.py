"""``vllm-eagle3 doctor --engine vllm``: the doctor's target run through the served engine, one engine start.

Data flow position: replaces :func:`vllm_eagle3.tools.doctor.measure.run_target` (transformers) with the engine a server
runs: an offline ``vllm.LLM`` (float32, eager) with this plugin, whose capture spec asks for a SUPERSET of taps: every
tap any candidate wiring needs (the configured wiring, the engines' readings of the draft config, their neighbours,
the embedding swaps; :func:`vllm_eagle3.wirings.candidate_wirings`). The plugin's capture
(:mod:`vllm_eagle3.capture`) hands vLLM's runner the aux hidden states of those taps exactly as it hands them to a
served draft; a forward hook in the worker (:func:`install_state_recorder`) keeps them, with the engine's own logits
of every prompt position (``compute_logits`` of the target, the same method the sampler's logits come from). The
doctor then scores every candidate with the unchanged code
(:func:`vllm_eagle3.tools.doctor.measure.first_draft_acceptance`,
:func:`~vllm_eagle3.tools.doctor.measure.chain_matches`, :mod:`vllm_eagle3.tools.doctor.stats`) on those engine-captured
states instead of transformers' ``hidden_states``.

What runs where: target forward, tap capture and target logits in vLLM (the plugin's capture path, vLLM's kernels);
the draft chains in :class:`vllm_eagle3.reference.Eagle3Draft`, the plain-PyTorch copy of vLLM's
``llama_eagle3`` forward (parity-tested against vLLM's draft to ~1e-5, tests/parity/test_draft_parity.py).

The engine needs a draft whose ``fc`` takes the superset (vLLM sizes ``fc`` from the draft config and the plugin
refuses a spec whose tap count disagrees with it): :func:`capture_draft` writes a copy of the draft with ids for the
superset (vLLM's convention) and an ``fc`` whose columns of the CONFIGURED wiring's taps are the head's own ``fc``
and zero elsewhere, so the engine's draft computes exactly the head fed the configured wiring. Tap L (the final
pre-norm state) is not captured by vLLM's DeepSeek/Kimi layer loop: candidates using it are left out and listed.

Cost: one engine start-up (the miniature: ~1-2 min eager on 2 cores) and one prefill per sequence.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

from vllm_eagle3 import envs
from vllm_eagle3.checkpoint import IDS_KEY, TRAINED_KEY, DraftInfo
from vllm_eagle3.spec import CaptureSpecError, taps_label

_ATTR = "_vllm_eagle3_doctor_records"


# ----------------------------------------------------------------------------------------------- in the worker
# Module-level functions: ``LLM.apply_model`` ships them to the worker by reference.


def install_state_recorder(model: torch.nn.Module) -> str:
    """Keep, for every target forward that returns aux states, the aux list and the engine's logits of EVERY row
    (observation only: the runner itself computes logits for the sampled rows). Idempotent; clears old records."""
    if getattr(model, _ATTR, None) is None:
        records: list[dict[str, Any]] = []

        def hook(module, args, output):
            if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], list):
                hidden, aux = output
                with torch.no_grad():
                    logits = module.compute_logits(hidden)  # [num_tokens, vocab]
                records.append(
                    {
                        "aux": [t.detach().to("cpu", dtype=torch.float32, copy=True) for t in aux],
                        "logits": logits.detach().to("cpu", dtype=torch.float32, copy=True),
                    }
                )

        model.register_forward_hook(hook)
        setattr(model, _ATTR, records)
    getattr(model, _ATTR).clear()
    return type(model).__name__


def take_records(model: torch.nn.Module) -> list[dict[str, Any]]:
    """The records since :func:`install_state_recorder` (or the last call), oldest first; clears them."""
    records = getattr(model, _ATTR, None)
    if records is None:
        raise RuntimeError("install_state_recorder was not run in this worker")
    out = list(records)
    records.clear()
    return out


def input_embedding(model: torch.nn.Module) -> torch.Tensor:
    """The target's input embedding [vocab, hidden] as the engine holds it (TP=1: the whole table)."""
    lm = getattr(model, "language_model", model)  # Kimi K2.5 wraps a DeepSeek language model
    emb = getattr(getattr(lm, "model", None), "embed_tokens", None)
    if emb is None:  # the first vocab embedding (vLLM's lm head is a subclass with another name)
        emb = next(m for m in model.modules() if type(m).__name__ == "VocabParallelEmbedding")
    return emb.weight.detach().to("cpu", dtype=torch.float32, copy=True)


# ----------------------------------------------------------------------------------------------- files


def capturable(taps: Sequence[int], num_layers: int) -> bool:
    """vLLM's DeepSeek/Kimi forward captures taps 0..L-1 (tap L, the final pre-norm state, is never reached)."""
    return all(0 <= t < num_layers for t in taps)


def capture_draft(draft_dir: Path, out_dir: Path, superset: Sequence[int], configured: Sequence[int]) -> Path:
    """A copy of ``draft_dir`` the engine can serve with the capture spec ``superset``: config ids = ``superset``
    (vLLM's convention, ``num_aux_hidden_states`` = its size, no trainer record), ``fc.weight`` [H, len(superset) * H]
    holding the head's own ``fc`` columns at the ``configured`` taps' places and zeros elsewhere."""
    from safetensors.torch import load_file, save_file

    superset, configured = list(superset), list(configured)
    missing = [t for t in configured if t not in superset]
    if missing:
        raise CaptureSpecError(f"configured taps {missing} are not in the captured set {superset}")
    cfg = json.loads((draft_dir / "config.json").read_text())
    cfg[IDS_KEY] = superset
    cfg["num_aux_hidden_states"] = len(superset)
    if isinstance(cfg.get("eagle_config"), dict):
        cfg["eagle_config"][IDS_KEY] = superset
    cfg.pop(TRAINED_KEY, None)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state: dict[str, torch.Tensor] = {}
    for f in sorted(draft_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    key = next((k for k in state if k.removeprefix("model.") == "fc.weight"), None)
    if key is None:
        raise CaptureSpecError(f"draft {draft_dir} has no fc.weight")
    fc = state[key]  # [H, n * H]
    h = fc.shape[1] // len(configured)
    wide = torch.zeros(fc.shape[0], len(superset) * h, dtype=fc.dtype)
    for i, t in enumerate(configured):
        j = superset.index(t)
        wide[:, j * h : (j + 1) * h] = fc[:, i * h : (i + 1) * h]
    state[key] = wide
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )
    for f in draft_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json" and not (out_dir / f.name).exists():
            (out_dir / f.name).symlink_to(f.resolve())
    return out_dir


# ----------------------------------------------------------------------------------------------- the engine run


def engine_memory_env(target: Path, draft: Path, progress=print) -> dict[str, str]:
    """On vLLM-CPU with no memory setting chosen, the KV cache size ``vllm-eagle3 serve`` would choose
    (:func:`vllm_eagle3.tools.serve.vllm_cpu.memory_setting`): without it vLLM-CPU demands 0.92 x the node's memory free
    and refuses to start on a box whose page cache or other processes hold a few GB (measured: "Available memory on
    node 0 (13.02/20.59 GiB) ... less than desired" with two other engines running). Elsewhere: nothing."""
    from vllm_eagle3.tools.serve.vllm_cpu import is_vllm_cpu, memory_setting

    if not is_vllm_cpu():
        return {}
    try:
        env, line = memory_setting(False, os.environ, [target, draft])
    except ValueError as exc:
        raise CaptureSpecError(str(exc)) from None
    if line:
        progress(line)
    return env


@dataclasses.dataclass
class EngineCapture:
    """What one engine start gave: the target run on the sample, which taps it holds, and how long it took."""

    run: Any  # vllm_eagle3.tools.doctor.measure.TargetRun; taps not captured are NaN
    seqs: torch.Tensor  # [N, T] the sequences the engine ran (greedy mode: prompts + the ENGINE's greedy tokens)
    taps: tuple[int, ...]  # captured
    startup_s: float
    run_s: float
    log_path: Path


def engine_capture(
    target: Path,
    draft: Path,
    seqs: torch.Tensor | None,
    taps: Sequence[int],
    configured: Sequence[int],
    num_layers: int,
    prompts: torch.Tensor | None = None,
    new_tokens: int = 0,
    progress=print,
) -> EngineCapture:
    """Start ONE offline vLLM engine with the plugin capturing ``taps`` and prefill each sequence of ``seqs`` [N, T]
    once (or, with ``prompts`` [N, P] and ``new_tokens``, first continue the prompts greedily through the engine,
    then prefill the full sequences). Returns the engine's taps [L + 1, N, T, H] (NaN where not captured) and its
    logits [N, T, V]."""
    import time

    from vllm import SamplingParams

    from vllm_eagle3.tools.engine import start_engine, stop_engine
    from vllm_eagle3.tools.doctor.measure import TargetRun

    taps = tuple(sorted(set(int(t) for t in taps)))
    if not capturable(taps, num_layers):
        raise CaptureSpecError(
            f"the engine cannot capture {taps_label([t for t in taps if t >= num_layers])} "
            f"(tap {num_layers} is the final pre-norm state, never captured by vLLM's layer loop)"
        )
    work = Path(tempfile.mkdtemp(prefix="vllm_eagle3_doctor_"))
    vehicle = capture_draft(Path(draft), work / "capture-draft", taps, configured)
    spec = work / "capture_spec.yaml"
    spec.write_text(
        "description: vllm-eagle3 doctor --engine vllm, every tap the candidate wirings need\n"
        f"taps: {taps_label(taps)}\nnum_layers: {num_layers}\ndraft_ids_convention: vllm\n"
        "check: {enabled: false}  # the doctor scores every wiring itself, offline\n"
    )
    length = seqs.shape[1] if seqs is not None else prompts.shape[1] + new_tokens
    env = {envs.SPEC: str(spec), **engine_memory_env(Path(target), vehicle, progress)}
    old = envs.raw("VLLM_ALLOW_INSECURE_SERIALIZATION")  # restored exactly afterwards
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the recorded tensors come back from the worker
    t0 = time.monotonic()
    progress(
        f"starting vLLM (offline LLM, float32, eager) with the plugin capturing {taps_label(taps)} "
        f"({len(taps)} taps; draft fc widened to match: {vehicle})"
    )
    engine = None
    try:
        try:
            engine = start_engine(Path(target), vehicle, env=env, max_model_len=max(256, length + 8))
        except Exception as exc:  # noqa: BLE001 - vLLM raises a generic RuntimeError; the cause is in its log
            from vllm_eagle3.tools.serve.process import root_cause

            cause = root_cause(getattr(exc, "engine_log", "")) or f"{type(exc).__name__}: {exc}"
            raise CaptureSpecError(
                f"vLLM did not start (--engine vllm; --engine hf needs no engine): {' | '.join(cause.splitlines())}"
            ) from None
        startup = time.monotonic() - t0
        progress(f"engine ready in {startup:.0f} s (log {engine.log_path})")
        log = engine.log()
        if f"vllm-eagle3: capturing taps {taps_label(taps)}" not in log:
            raise CaptureSpecError(
                f"the engine did not log the plugin's capture line for {taps_label(taps)}; see {engine.log_path}"
            )
        t1 = time.monotonic()
        greedy = SamplingParams(max_tokens=1, temperature=0.0)
        if seqs is None:
            outs = engine.llm.generate(
                [{"prompt_token_ids": p.tolist()} for p in prompts],
                SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True),
                use_tqdm=False,
            )
            seqs = torch.tensor([p.tolist() + list(o.outputs[0].token_ids) for p, o in zip(prompts, outs)])
            if seqs.shape[1] != length:
                raise RuntimeError(f"the engine returned {seqs.shape[1] - prompts.shape[1]} tokens, not {new_tokens}")
        engine.llm.apply_model(install_state_recorder)
        n, t = seqs.shape
        per_seq_taps, per_seq_logits = [], []
        for i in range(n):  # one prefill per sequence: its forward's rows are exactly its tokens
            engine.llm.generate([{"prompt_token_ids": seqs[i].tolist()}], greedy, use_tqdm=False)
            recs = [r for r in engine.llm.apply_model(take_records)[0] if r["logits"].shape[0] == t]
            if not recs:
                raise RuntimeError(
                    f"no {t}-row target forward recorded for sequence {i} (chunked prefill?); see {engine.log_path}"
                )
            per_seq_taps.append(torch.stack(recs[0]["aux"]))  # [len(taps), T, H] in the spec's (ascending) order
            per_seq_logits.append(recs[0]["logits"])
        embed = engine.llm.apply_model(input_embedding)[0]
        run_s = time.monotonic() - t1
    finally:
        if engine is not None:
            stop_engine(engine)
        if old is None:
            os.environ.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)
        else:
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = old
    got = torch.stack(per_seq_taps, 1)  # [len(taps), N, T, H]
    full = torch.full((num_layers + 1, *got.shape[1:]), float("nan"))
    for j, k in enumerate(taps):
        full[k] = got[j]
    progress(f"captured {len(taps)} taps x {n} sequences x {t} tokens through vLLM in {run_s:.0f} s")
    return EngineCapture(
        TargetRun(seqs, full, torch.stack(per_seq_logits), embed), seqs, taps, startup, run_s, engine.log_path
    )


def candidate_taps(
    draft: DraftInfo,
    num_layers: int,
    num_taps: int,
    configured: dict[str, Sequence[int]],
    exhaustive: bool | None = None,
) -> tuple[set[int], list]:
    """(every tap the candidate wirings and the configured ones need that the engine can capture, the candidates it
    cannot capture)."""
    from vllm_eagle3.wirings import candidate_wirings

    cands = candidate_wirings(draft, num_layers, num_taps, configured, exhaustive)
    ok = [c for c in cands if capturable(c.taps, num_layers)]
    need = {t for c in ok for t in c.taps} | {t for ts in configured.values() for t in ts}
    return need, [c for c in cands if not capturable(c.taps, num_layers)]
