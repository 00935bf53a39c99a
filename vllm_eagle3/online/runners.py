"""Where the online wiring check attaches in each vLLM model runner, and how a runner's step becomes rows.

Data flow position: inside vLLM's worker, after a step's target forward and sampling, **before the draft runs**: the
hook in :mod:`vllm_eagle3.online.engine_hook` wraps the method that hands the target's aux list to the EAGLE-3 draft,
takes the check's extra taps off the end of that list (the draft gets the spec's taps alone) and reads the step's rows
(:mod:`vllm_eagle3.online.traces` gets them). vLLM has two runners, one row each in :data:`RUNNERS`:

- V1, ``vllm/v1/worker/gpu_model_runner.py`` (vLLM-CPU's ``CPUModelRunner`` subclasses it): the hook wraps
  ``propose_draft_token_ids``, whose arguments carry the step (sampled tokens, aux states, draft counts);
- Model Runner V2, ``vllm/v1/worker/gpu/model_runner.py`` (GPU vLLM's default wherever Triton works): the hook wraps
  ``EagleSpeculator.propose``, whose arguments carry the batch, the aux list and the tokens sampled per request.
  ``propose`` is also called by V2's warm-up (``_dummy_run``, no step to read: its extra taps are taken off all the
  same); a step's finished requests come from ``sample_tokens``, whose ``execute_model_state`` is kept for ``propose``.

Everything is read from the arguments the runner passes, i.e. from what the target's forward *returned*: under a CUDA
graph replay, which skips ``forward``, the returned buffers hold the replayed step's values, so no Python state set
during ``forward`` can be stale here.

Which runner serves is vLLM's own rule, ``VllmConfig.use_v2_model_runner`` (env ``VLLM_USE_V2_MODEL_RUNNER``, else
V2 where Triton works). In-tree workers (:data:`KNOWN_WORKERS`) build subclasses of these two runners; another
worker class builds a runner the check does not know, and the check is off there, saying so.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable, Mapping, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class StepRows:
    """One target step, whatever the runner: the batch's requests, their rows and the aux list the draft received.

    Request i's rows are ``query_start[i]:query_start[i + 1]`` of the step's flattened tokens. ``device_rows()``
    returns, per request, how many of them are confirmed (a prefill chunk: all; a verify step: the accepted drafts + 1,
    the tokens sampled; 0: never follow it) and the position of its first row: on a GPU reading them waits for the
    step's kernels, so the check calls it only in steps where a request is followed or seen for the first time."""

    finished: tuple[str, ...]
    req_ids: tuple[str, ...]
    query_start: tuple[int, ...]  # [num_reqs + 1]
    device_rows: Callable[[], tuple[Sequence[int], Sequence[int]]]  # (valid, first_position)
    prompt_len: tuple[int, ...]
    temperature: tuple[float, ...]
    max_len: tuple[int | None, ...]  # prompt + max_tokens: the request ends there (None: no limit)
    input_ids: torch.Tensor  # [num_tokens]
    aux: Sequence[torch.Tensor]  # the spec's taps in its order, each [num_tokens, hidden]
    check_aux: Mapping[int, torch.Tensor] = dataclasses.field(default_factory=dict)  # the check's extra taps, by tap


@dataclasses.dataclass(frozen=True)
class RunnerHook:
    """One runner: the method that hands the aux list to the draft, the leading parameters relied on, and how a call
    becomes rows.

    ``rows(runner, kept, args, check_aux)`` reads the step from the call's bound arguments before the call, the aux
    list already cut to the spec's taps. With ``outer`` (a method of the runner that calls the hooked one, V2's
    ``sample_tokens``), ``keep(runner)`` saves before that call what it consumes (``kept``); without, ``kept`` is None
    and the hooked method's ``self`` is the runner."""

    name: str
    module: str
    cls: str
    method: str
    params: tuple[str, ...]
    rows: Callable[[Any, Any, dict[str, Any], Mapping[int, torch.Tensor]], StepRows | None]
    aux_param: str = "aux_hidden_states"
    outer: tuple[str, str, str] | None = None  # (module, class, method) of the runner method around ``method``
    keep: Callable[[Any], Any] | None = None
    requires: Callable[[], str | None] = lambda: None  # other names the rows rely on: None, or what is missing

    def target(self) -> type:
        return getattr(importlib.import_module(self.module), self.cls)

    def outer_target(self) -> type | None:
        return None if self.outer is None else getattr(importlib.import_module(self.outer[0]), self.outer[1])

    def problem(self) -> str | None:
        """None when the wrapped methods have the parameters relied on, else what differs (and the fix)."""
        fn = getattr(self.target(), self.method, None)
        outer = self.outer_target()
        missing = [
            ".".join(w)
            for w, there in (
                ((self.module, self.cls, self.method), fn is not None),
                (self.outer, outer is None or hasattr(outer, self.outer[2])),
            )
            if not there
        ]
        if missing:
            return f"no {missing[0]} on this vLLM; the check needs a hook row for it in vllm_eagle3/online/runners.py"
        sig = inspect.signature(fn)
        if tuple(sig.parameters)[: len(self.params)] != self.params:
            return (
                f"{self.cls}.{self.method}{sig} no longer starts with {self.params}; update its row in "
                "vllm_eagle3/online/runners.py"
            )
        return self.requires()


def _tolist(x) -> list:
    return x.tolist() if hasattr(x, "tolist") else list(x)


# ----------------------------------------------------------------------------------------------- V1


def _v1_rows(runner, _kept, args: dict[str, Any], check_aux: Mapping[int, torch.Tensor]) -> StepRows | None:
    sched = args["scheduler_output"]
    req_ids = list(runner.input_batch.req_ids)
    aux = args["aux_hidden_states"]
    if not req_ids or aux is None:
        return _empty(tuple(sched.finished_req_ids))
    n = sched.total_num_scheduled_tokens
    qsl = runner.query_start_loc.cpu[: len(req_ids) + 1].tolist()
    prompt, temp, max_len, usable = [], [], [], []
    for rid in req_ids:
        state = runner.requests.get(rid)
        sp = getattr(state, "sampling_params", None)
        usable.append(sp is not None)  # no sampling parameters (a pooling request): never followed
        prompt.append(state.num_prompt_tokens if state is not None else 0)
        temp.append(float(sp.temperature or 0.0) if sp is not None else 0.0)
        max_len.append(prompt[-1] + sp.max_tokens if sp is not None and sp.max_tokens is not None else None)

    def device_rows() -> tuple[list[int], list[int]]:
        sampled = args["sampled_token_ids"]
        counts = (sampled != -1).sum(-1).tolist() if isinstance(sampled, torch.Tensor) else [len(x) for x in sampled]
        meta = args["spec_decode_metadata"]
        drafts = list(meta.num_draft_tokens) if meta is not None else [0] * len(req_ids)
        pos_buf = runner.positions if runner.positions.dim() == 1 else runner.positions[0]
        first = pos_buf[torch.tensor(qsl[:-1], dtype=torch.long).clamp(max=max(n - 1, 0))].tolist()
        valid = [(counts[i] if drafts[i] > 0 else qsl[i + 1] - qsl[i]) if usable[i] else 0 for i in range(len(req_ids))]
        return valid, first

    return StepRows(
        tuple(sched.finished_req_ids),
        tuple(req_ids),
        tuple(qsl),
        device_rows,
        tuple(prompt),
        tuple(temp),
        tuple(max_len),
        runner.input_ids.gpu[:n],
        tuple(aux),
        check_aux,
    )


def _empty(finished: tuple[str, ...]) -> StepRows:
    """A step that only reports finished requests."""
    return StepRows(finished, (), (0,), lambda: ((), ()), (), (), (), torch.empty(0), ())


# ----------------------------------------------------------------------------------------------- V2


def _v2_keep(runner) -> Any:
    return runner.execute_model_state  # sample_tokens sets it to None before it calls propose


def _v2_rows(runner, state, args: dict[str, Any], check_aux: Mapping[int, torch.Tensor]) -> StepRows | None:
    aux = args["aux_hidden_states"]
    if state is None or args.get("dummy_run") or not aux:
        return None  # warm-up, a non-last pipeline stage or no aux states: nothing of this step to record
    batch = args["input_batch"]
    r = batch.num_reqs
    finished = tuple(state.finished_req_ids or ())
    sampled = args["num_sampled"]  # [num_reqs] on the device: tokens sampled per request this step
    qsl = _tolist(batch.query_start_loc_np[: r + 1])
    drafts = _tolist(batch.num_draft_tokens_per_req[:r]) if batch.num_draft_tokens_per_req is not None else [0] * r
    idx = batch.idx_mapping_np[:r]
    states = runner.req_states
    prompt = _tolist(states.prompt_len.np[idx])
    max_len = _tolist(states.max_seq_len[idx])  # prompt_len + max_tokens
    temp = _tolist(runner.sampler.sampling_states.temperature.np[idx])
    n = int(qsl[-1])

    def device_rows() -> tuple[list[int], list[int]]:
        counts = _tolist(sampled[:r])
        first = _tolist(batch.positions[torch.tensor(qsl[:-1], dtype=torch.long).clamp(max=max(n - 1, 0))])
        return [counts[i] if drafts[i] > 0 else qsl[i + 1] - qsl[i] for i in range(r)], first

    return StepRows(
        finished,
        tuple(batch.req_ids[:r]),
        tuple(qsl),
        device_rows,
        tuple(prompt),
        tuple(float(t) for t in temp),
        tuple(max_len),
        batch.input_ids[:n],
        tuple(aux),
        check_aux,
    )


def _v2_requires() -> str | None:
    """The names :func:`_v2_rows` reads besides ``propose``'s parameters: fields of V2's step state and batch."""
    from vllm.v1.worker.gpu import input_batch, model_runner

    need = {
        "ExecuteModelState": (
            model_runner.ExecuteModelState._fields,
            ("input_batch", "hidden_states", "aux_hidden_states", "finished_req_ids"),
        ),
        "InputBatch": (
            tuple(f.name for f in dataclasses.fields(input_batch.InputBatch)),
            (
                "req_ids",
                "num_reqs",
                "idx_mapping_np",
                "query_start_loc_np",
                "num_draft_tokens_per_req",
                "input_ids",
                "positions",
            ),
        ),
    }
    for where, (have, want) in need.items():
        missing = [w for w in want if w not in have]
        if missing:
            return f"V2's {where} has no {missing} on this vLLM; update the V2 row in vllm_eagle3/online/runners.py"
    return None


RUNNERS: dict[str, RunnerHook] = {
    "V1": RunnerHook(
        "V1",
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        "propose_draft_token_ids",
        (
            "self",
            "scheduler_output",
            "sampled_token_ids",
            "sampling_metadata",
            "hidden_states",
            "sample_hidden_states",
            "aux_hidden_states",
            "spec_decode_metadata",
        ),
        rows=_v1_rows,
    ),
    "V2": RunnerHook(
        "V2",
        "vllm.v1.worker.gpu.spec_decode.eagle.speculator",
        "EagleSpeculator",
        "propose",
        (
            "self",
            "input_batch",
            "attn_metadata",
            "slot_mappings",
            "last_hidden_states",
            "aux_hidden_states",
            "num_sampled",
        ),
        rows=_v2_rows,
        outer=("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "sample_tokens"),
        keep=_v2_keep,
        requires=_v2_requires,
    ),
}

KNOWN_WORKERS = (
    "vllm.v1.worker.gpu_worker.Worker",
    "vllm.v1.worker.cpu_worker.CPUWorker",
    "vllm.v1.worker.xpu_worker.XPUWorker",
)
"""vLLM's in-tree workers: each builds a subclass of the V1 or the V2 runner (``auto``: vLLM picks one of them)."""


def runner_in_use(vllm_config) -> str:
    """The :data:`RUNNERS` key of the runner this engine builds: vLLM's own rule (``use_v2_model_runner``; vLLM 0.34
    removed it with the V1 runner: V2 only)."""
    return "V2" if getattr(vllm_config, "use_v2_model_runner", True) else "V1"


def unknown_worker(vllm_config) -> str | None:
    """None for an in-tree worker, else the reason the check cannot attach to the runner it builds."""
    worker = getattr(vllm_config.parallel_config, "worker_cls", "auto")
    if worker in ("auto", *KNOWN_WORKERS):
        return None
    return (
        f"the worker {worker} builds a model runner the check does not know (it wraps the V1 and V2 GPU runners "
        "and their subclasses); add a row for it in vllm_eagle3/online/runners.py"
    )


def tp_rank() -> int:
    """This worker's tensor-parallel rank (0 outside an engine). The check runs on rank 0 only: its taps are complete
    there and it runs no collective."""
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return get_tp_group().rank_in_group
    except (AssertionError, RuntimeError):  # no distributed state: not inside an engine
        return 0


def rank_label() -> str:
    """This process's place in the parallel layout, e.g. ``"tp 1/2, pp 0/1"`` (``"tp 0/1, pp 0/1"`` alone): the capture
    model's log line names it, so a rank missing from the log is a rank without the plugin."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        tp, pp = get_tp_group(), get_pp_group()
        return f"tp {tp.rank_in_group}/{tp.world_size}, pp {pp.rank_in_group}/{pp.world_size}"
    except (AssertionError, RuntimeError):  # no distributed state (e.g. built outside an engine)
        return "tp 0/1, pp 0/1"
