"""Per-step draft / verify timers inside the vLLM worker (timed cells only), and the per-step split from their
records. ``POST /collective_rpc`` ``bench_timers_start`` wraps the model runner instance's ``_model_forward`` (the
target: verify k+1 tokens per request, capture included) and ``propose_draft_token_ids`` (the draft) with
``time.perf_counter`` (CPU kernels are synchronous); ``..._stop`` removes them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

_ATTR = "_vllm_eagle3_bench_timers"


class StepTimers:
    """vLLM worker extension: per-step wall-clock timers of the target forward and the draft (see module doc)."""

    def bench_timers_start(self) -> dict:
        runner = self.model_runner  # type: ignore[attr-defined]
        state = getattr(runner, _ATTR, None)
        if state is None:
            records: list = []
            forward = runner._model_forward
            propose = getattr(runner, "propose_draft_token_ids", None)

            def timed_forward(*args, **kwargs):
                positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
                t0 = time.perf_counter()
                out = forward(*args, **kwargs)
                n = int(positions.shape[-1]) if positions is not None else -1
                records.append(("F", t0, time.perf_counter() - t0, n))
                return out

            def timed_propose(*args, **kwargs):
                t0 = time.perf_counter()
                out = propose(*args, **kwargs)
                records.append(("D", t0, time.perf_counter() - t0, 0))
                return out

            own = {n: runner.__dict__[n] for n in ("_model_forward", "propose_draft_token_ids") if n in runner.__dict__}
            runner._model_forward = timed_forward
            if propose is not None:
                runner.propose_draft_token_ids = timed_propose
            state = {"records": records, "has_draft": propose is not None, "own": own}
            setattr(runner, _ATTR, state)
        state["records"].clear()
        return {"pid": os.getpid(), "draft_timed": state["has_draft"]}

    def bench_timers_stop(self) -> list:
        """Remove the wrappers (restore what the instance had before: its class methods, or its own attributes if
        it had any); return the records."""
        runner = self.model_runner  # type: ignore[attr-defined]
        state = getattr(runner, _ATTR, None)
        if state is None:
            return []
        for name in ("_model_forward", "propose_draft_token_ids"):
            runner.__dict__.pop(name, None)
        runner.__dict__.update(state["own"])
        delattr(runner, _ATTR)
        return [list(r) for r in state["records"]]

    def bench_mla_calls(self) -> dict:
        """How this worker's CPU MLA attention ran: the verify-as-decode patch's ``CALLS`` counters (all zero: vLLM's
        own path ran), read by ``analysis.summarize``."""
        try:
            from vllm_eagle3.model_patches.vllm_cpu_mla_verify_decode import CALLS
        except ImportError:
            return {}
        return dict(CALLS)


@dataclasses.dataclass(frozen=True)
class StepSplit:
    """The pure decode steps of one timed cell, one entry per step (ms)."""

    forward_ms: tuple[float, ...]  # target forward: verification of k+1 tokens per request (1 token without spec)
    draft_ms: tuple[float, ...]  # proposer: k draft forwards + their input preparation (0 without spec)
    step_ms: tuple[float, ...]  # start of this forward to the start of the next one (only when both are pure decode)

    @property
    def steps(self) -> int:
        return len(self.forward_ms)

    def as_dict(self) -> dict:
        return {k: list(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict | None) -> "StepSplit":
        return cls(*(tuple(d[k]) if d else () for k in ("forward_ms", "draft_ms", "step_ms")))


def step_split(records: Sequence[Sequence[Any]], decode_tokens: int) -> StepSplit:
    """Per-step split from :class:`StepTimers` records ``(kind, start_s, seconds, tokens)`` of one cell: ``"F"`` the
    target forward, ``"D"`` the draft (after the target's sampling: belongs to the forward before it). Only *pure
    decode steps* (a forward over exactly ``decode_tokens`` = running requests x (k + 1)) count; step time = start of
    one to the start of the next forward, when that one is pure decode too."""
    steps: list[list[float]] = []  # [start, forward s, draft s, tokens]
    for kind, t0, dt, n in records:
        if kind == "F":
            steps.append([float(t0), float(dt), 0.0, int(n)])
        elif kind == "D" and steps:
            steps[-1][2] += float(dt)
    decode = [i for i, st in enumerate(steps) if st[3] == decode_tokens]
    gaps = tuple(
        (steps[i + 1][0] - steps[i][0]) * 1e3 for i in decode if i + 1 < len(steps) and steps[i + 1][3] == decode_tokens
    )
    return StepSplit(tuple(steps[i][1] * 1e3 for i in decode), tuple(steps[i][2] * 1e3 for i in decode), gaps)
