"""Pipeline stages of a vLLM target run by hand on CPU, relaying the EAGLE-3 taps the way Model Runner V2 does.

Data flow position: **target forward -> taps** across pipeline stages. Each stage is its own process with real
``torch.distributed`` gloo groups set up by vLLM's ``init_distributed_environment`` / ``initialize_model_parallel``;
it builds the target with vLLM's model loader (the plugin's capture classes registered), then drives V2's own
functions (``vllm/v1/worker/gpu/``): ``set_eagle3_aux_hidden_state_layers`` (which reserves the relay slots),
``verify_supports_aux_hidden_states_over_pp``, the receive buffers from ``make_empty_intermediate_tensors`` filled
as ``model_runner.py`` fills them, ``PPHandler.relay_aux_hidden_states`` on middle stages, and vLLM's
``send_tensor_dict`` / ``recv_tensor_dict`` between stages. The runner itself is not built: it needs CUDA streams.

Two forwards, the prefill of ``prompt`` and one decode step, with no attention metadata: vLLM's attention layers then
return zeros (their profile-run path) in every stage layout alike, so the stages compute the same function of the
tokens as one stage does.

Usage: ``run_stages(target, draft, spec, prompt, pp_size, out_dir)`` -> each stage's ``{"steps", "relay_slots",
"v1_refusal"}``: the last stage's ``steps`` hold each forward's ``hidden`` and ``aux`` (the list the draft would get),
``relay_slots`` its receive buffers' keys, ``v1_refusal`` what the stage said when asked to capture under the V1
runner instead (None: accepted).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import torch

from vllm_eagle3.testing.taps import spec_taps_of

SPECULATIVE_TOKENS = 1
MAX_TOKENS = 64  # the receive buffers' rows (the runner's max_num_tokens)
DECODE_TOKEN = ord("x")


def _steps(prompt: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """(token ids, positions) of each forward: the prefill of ``prompt``, then one decode step."""
    n = len(prompt)
    return [(list(prompt), list(range(n))), ([DECODE_TOKEN], [n])]


def _stage(
    rank: int, pp_size: int, init_file: str, target: str, draft: str, spec: str, prompt: list[int], out: str
) -> None:
    """One pipeline stage (a spawned process): build, capture, forward one prefill, pass it on or save it."""
    try:
        _run_stage(rank, pp_size, init_file, target, draft, spec, prompt, out)
    except BaseException:
        Path(out).with_suffix(".err").write_text(traceback.format_exc())
        raise


def _run_stage(
    rank: int, pp_size: int, init_file: str, target: str, draft: str, spec: str, prompt: list[int], out: str
) -> None:
    from vllm_eagle3.resolve import ENV_SPEC

    os.environ[ENV_SPEC] = spec
    torch.set_num_threads(1)  # every layout computes with the same kernels' blocking: bit-comparable results

    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import get_pp_group, init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader import get_model
    from vllm.plugins import load_general_plugins
    from vllm.sequence import IntermediateTensors
    from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop
    from vllm.v1.worker.gpu.pp_utils import PPHandler
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        aux_hidden_state_relay_keys,
        set_eagle3_aux_hidden_state_layers,
        verify_supports_aux_hidden_states_over_pp,
    )

    load_general_plugins()
    _set_torch_accelerator_to_noop()  # as vLLM-CPU's runner does: torch.accelerator has no device here
    vllm_config = EngineArgs(
        model=target,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        pipeline_parallel_size=pp_size,
        speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": SPECULATIVE_TOKENS},
    ).create_engine_config()
    # The runner whose relay is under test. Set after the config is built: VllmConfig refuses V2 without Triton
    # (vLLM-CPU has none); the workers' choice, use_v2_model_runner, reads the variable on every access.
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    os.environ["VLLM_DIST_IDENT"] = Path(init_file).name  # as vLLM-CPU's worker names its shared-memory group
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=pp_size,
            rank=rank,
            distributed_init_method=f"file://{init_file}",
            local_rank=rank,
            backend="gloo",
        )
        initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=pp_size)
        pp = get_pp_group()
        model = get_model(vllm_config=vllm_config)
        # As model_runner.py load_model does on every rank.
        set_eagle3_aux_hidden_state_layers(model, vllm_config.speculative_config)
        if pp_size > 1:
            verify_supports_aux_hidden_states_over_pp(model, vllm_config.speculative_config.method)
        relay = PPHandler.relay_aux_hidden_states  # V2's relay, on a handler holding only its keys (no CUDA streams)
        handler = type("Relay", (), {"aux_hidden_state_relay_keys": aux_hidden_state_relay_keys(model)})()

        # model_runner.py: a non-first stage's receive buffers are made once, at the largest batch, and each step
        # copies what arrived into their first rows.
        buffers = (
            None
            if pp.is_first_rank
            else model.make_empty_intermediate_tensors(batch_size=MAX_TOKENS, dtype=torch.float32, device="cpu")
        )
        result: dict[str, Any] = {"steps": []}
        for step_ids, step_positions in _steps(prompt):
            n = len(step_ids)
            intermediate = None
            if buffers is not None:
                received = pp.recv_tensor_dict()
                missing = sorted(set(buffers.tensors) - set(received))
                if missing:
                    raise RuntimeError(f"stage {rank} expected {missing} from the stage before, got {sorted(received)}")
                intermediate = IntermediateTensors(
                    {k: v[:n].copy_(received[k][:n]) for k, v in buffers.tensors.items()}
                )
            with torch.no_grad(), set_forward_context(None, vllm_config, num_tokens=n):
                output = model(
                    input_ids=torch.tensor(step_ids) if pp.is_first_rank else None,
                    positions=torch.tensor(step_positions),
                    intermediate_tensors=intermediate,
                )
            if not pp.is_last_rank:
                pp.send_tensor_dict(relay(handler, intermediate, output).tensors)
            else:
                hidden, aux = output
                result["steps"].append(
                    {
                        "hidden": hidden.clone(),  # the draft's part: the check's taps follow
                        "aux": [t.clone() for t in spec_taps_of(model, aux)],
                    }
                )
        result["relay_slots"] = sorted(buffers.tensors) if buffers is not None else []
        result["v1_refusal"] = _v1_refusal(model)
        torch.save(result, out)


def _v1_refusal(model: torch.nn.Module) -> str | None:
    """Ask this stage's model to capture again as under the V1 runner: its refusal, or None when it accepts."""
    from vllm_eagle3.spec import CaptureSpecError

    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    language_model = getattr(model, "language_model", model)
    try:
        language_model.set_aux_hidden_state_layers(language_model.capture_resolution.runner_ids)
    except CaptureSpecError as exc:
        return str(exc)
    finally:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    return None


def run_stages(
    target: str | Path,
    draft: str | Path,
    spec: str | Path,
    prompt: Sequence[int],
    pp_size: int,
    out_dir: str | Path,
    timeout: float = 600.0,
) -> list[dict[str, Any]]:
    """Run ``pp_size`` stage processes (spawned) for the prefill of ``prompt`` and one decode step; each stage's
    saved result, by rank (module docstring)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    init_file = tempfile.mktemp(prefix="pp-init-", dir=out_dir)
    ctx = multiprocessing.get_context("spawn")
    outs = [out_dir / f"pp{pp_size}-stage{rank}.pt" for rank in range(pp_size)]
    for out in outs:  # a result or traceback left by an earlier run must not pass for this one's
        out.unlink(missing_ok=True)
        out.with_suffix(".err").unlink(missing_ok=True)
    procs = [
        ctx.Process(
            target=_stage,
            args=(rank, pp_size, init_file, str(target), str(draft), str(spec), list(prompt), str(outs[rank])),
        )
        for rank in range(pp_size)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    # A stage that died leaves the others waiting on a receive forever: stop them all at the first failure.
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if any(p.exitcode not in (None, 0) for p in procs):
            break
        time.sleep(0.5)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    errors = []
    for rank, (p, out) in enumerate(zip(procs, outs)):
        if p.exitcode == -9 and not out.with_suffix(".err").exists():
            errors.append(
                f"stage {rank} of {pp_size} stopped: it had not finished in {timeout:.0f} s or another stage failed"
            )
        elif p.exitcode != 0:
            err = out.with_suffix(".err")
            errors.append(
                f"stage {rank} of {pp_size} exited {p.exitcode}:\n"
                + (err.read_text() if err.exists() else "(no traceback)")
            )
    if errors:
        raise RuntimeError("\n".join(errors))
    return [torch.load(out, weights_only=False) for out in outs]
