"""A CUDA graph replay, as the plugin sees one, on CPU (test support): ``python -m vllm_eagle3.testing.replay``.

Data flow position: the target's forward inside vLLM's runner. Under Model Runner V2's default cudagraph mode a FULL
decode step replays the captured graph: ``forward``'s Python does not run, and the runner gets the graph's stored
output buffers (``cudagraph_utils.ModelCudaGraphManager.run_fullgraph``: the same tensors every step, sliced to the
batch, their values the replayed step's). :func:`install_replay` makes every target forward of a worker look like that
to everything outside the tensors: the forward computes the step (the values a replay would compute), then every
Python attribute it set on any module of the model is put back as it was before the call (a replay runs no Python),
and the outputs are copied into buffers kept across steps, whose slices are returned.

A runtime feature that reads Python state set during ``forward`` (e.g. a dict of the check's taps) reads the values of
some earlier step here, as on a GPU; one that reads the returned tensors reads this step's. ``main`` runs
``vllm-eagle3 selftest``'s speculative engine this way (under ``vllm-eagle3 emulate v2``: V2's runner) and writes its
numbers as JSON, for tests/e2e/test_model_runner_v2.py to compare with a run without replay.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

_STATIC = "_vllm_eagle3_replay_buffers"


def install_replay(worker: Any) -> dict[str, Any]:
    """``collective_rpc`` target: the worker's target forward replays as described above. Returns how many modules'
    state is rolled back and the attribute the capture model sets in every forward (``_stage_aux``), to check later
    that the rollback happened."""
    model = worker.model_runner.get_model()
    forward = model.forward
    modules = list(model.modules())

    def replayed(*args, **kwargs):
        before = [(m, dict(m.__dict__)) for m in modules]
        out = forward(*args, **kwargs)
        for m, state in before:  # a replay runs no Python: whatever forward set on a module is not there
            m.__dict__.clear()
            m.__dict__.update(state)
        hidden, aux = out if isinstance(out, tuple) else (out, [])
        n = hidden.shape[0]
        bufs = model.__dict__.get(_STATIC)
        if bufs is None or bufs[0].shape[0] < n or len(bufs) != 1 + len(aux):  # the graph's output buffers
            bufs = [torch.empty((max(n, 512), *t.shape[1:]), dtype=t.dtype) for t in (hidden, *aux)]
            model.__dict__[_STATIC] = bufs
        for buf, t in zip(bufs, (hidden, *aux)):
            buf[:n].copy_(t)
        return (bufs[0][:n], [b[:n] for b in bufs[1:]]) if isinstance(out, tuple) else bufs[0][:n]

    model.forward = replayed
    return {"modules": len(modules)}


def stage_state(worker: Any) -> dict[str, Any]:
    """``collective_rpc`` target: whether the capture model still holds the state its forward sets every step (it
    must not, when every forward was replayed), and whether the buffers were reused."""
    model = worker.model_runner.get_model()
    lm = getattr(model, "language_model", model)
    return {"stage_aux_left": hasattr(lm.model, "_stage_aux"), "buffers": len(model.__dict__.get(_STATIC) or [])}


def main(argv: list[str] | None = None) -> int:
    from vllm_eagle3.tools.selftest import selftest

    p = argparse.ArgumentParser(prog="python -m vllm_eagle3.testing.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--capture-spec", type=Path, required=True)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    lines, data = selftest(
        args.target,
        args.draft,
        args.capture_spec,
        3,
        8,
        128,
        prepare=lambda llm: llm.collective_rpc(install_replay)[0],
        after=lambda llm: llm.collective_rpc(stage_state)[0],
        baseline=False,
    )
    data["lines"] = [vars(line) for line in lines]
    args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
