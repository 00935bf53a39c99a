"""vLLM's side of :mod:`vllm_eagle3.live_k`: the scheduler wrapped so its k lookup is a
:class:`~vllm_eagle3.live_k.LiveK`, each step handed to it, and its report written where ``GET /v1/eagle3/wiring``
reads it.

Data flow position: :func:`install` runs in every vLLM process (``vllm_eagle3.plugin.register``) and wraps vLLM's
``Scheduler`` class once: ``__init__`` (:func:`attach`: a LiveK replaces ``dynamic_sd_lookup`` when the plugin's
``--additional-config`` mapping has ``live_k``), ``schedule`` (the step's decision and start time, keyed by its
output) and ``update_from_output`` (the step's time and the drafts it verified, then the report). A scheduler without
``live_k`` is left as vLLM made it. A setting that cannot work refuses at start-up in one line (data parallelism, CUDA
graphs captured per k: :func:`graph_tokens_of`); once serving nothing here is fatal to the engine: an exception turns
live k off (one ERROR).
"""

from __future__ import annotations

import functools
import json
import logging
import math
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from vllm_eagle3 import LOGGER, envs
from vllm_eagle3.live_k import CONFIG_NAME, LiveK, LiveKError, Settings, bucket_of
from vllm_eagle3.wiring_check import read_report_file, report_file, write_report_file

logger = logging.getLogger(f"{LOGGER}.live_k")

_MARK = "_vllm_eagle3_live_k"  # a scheduler's LiveK (instance attribute)
_INSTALLED = "_vllm_eagle3_live_k_installed"  # on the Scheduler class


def settings_of(vllm_config: Any) -> Settings | None:
    """The ``live_k`` setting of this config's plugin mapping (None: off); errors say what to change."""
    from vllm_eagle3.resolve import plugin_config

    value = plugin_config(getattr(vllm_config, "additional_config", None)).get(CONFIG_NAME)
    settings = Settings.from_config(value)
    if settings is None:
        return None
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or not spec.num_speculative_tokens:  # a serve config's baseline (--speculative-config None): said
        logger.info(
            "vllm-eagle3 live k: set, but this server does not speculate: there is no k to choose, so "
            "live_k does nothing here (drop it, or add --speculative-config to speculate)"
        )
        return None
    if vllm_config.parallel_config.data_parallel_size > 1:
        raise LiveKError(
            "live_k needs data_parallel_size 1: vLLM runs one k across data-parallel ranks (it turns "
            "num_speculative_tokens_per_batch_size off there); drop live_k or data parallelism"
        )
    return settings


def graph_tokens_of(vllm_config: Any) -> int | None:
    """The largest decode step (tokens) that replays a CUDA graph, None when the engine captures none; a cudagraph
    mode whose graphs depend on k is refused (:class:`LiveKError`, one line naming the fix).

    Live k compares a k with its neighbours, so every k it may draft must run the same kind of step. A mode with FULL
    graphs captures decode graphs per query length k + 1: Model Runner V2 (``v1/worker/gpu/cudagraph_utils.py``
    ``CudaGraphManager._init_candidates``) for the k values of ``num_speculative_tokens_per_batch_size`` only, and
    ``dispatch`` finds one only where the next captured size holds that k; V1 for ``num_speculative_tokens`` only
    (with a table vLLM itself turns V1 to PIECEWISE, ``VllmConfig._maybe_override_dynamic_sd_cudagraph_mode``). Any
    other k runs PIECEWISE or eager; so does V2's draft decode (``spec_decode/target_dependent_ar/cudagraph_utils.py``
    ``SpeculatorCudaGraphManager.specialize_spec_tokens``: a FULL graph for the table's k, eager for the others;
    under PIECEWISE eager at every k, ``init_cudagraph_manager``). Pure FULL is refused too: V2's worker turns it into
    FULL_AND_PIECEWISE where the attention backend cannot replay mixed batches
    (``CompilationConfig.resolve_cudagraph_mode_and_sizes``). PIECEWISE
    graphs are keyed by token count alone: a decode step of up to ``max_cudagraph_capture_size`` tokens replays one
    at every k, a larger one runs eager (:class:`LiveK` keeps its probes on one side of that line)."""
    from vllm.config import CUDAGraphMode

    compilation, model = vllm_config.compilation_config, getattr(vllm_config, "model_config", None)
    mode = compilation.cudagraph_mode
    if (
        (model is not None and model.enforce_eager)
        or mode in (None, CUDAGraphMode.NONE)
        or not compilation.cudagraph_capture_sizes
    ):
        return None
    if mode.has_full_cudagraphs():
        runner = "Model Runner V2" if _runs_v2(vllm_config) else "the V1 runner"
        raise LiveKError(
            f"live_k cannot measure k under cudagraph_mode {mode.name}: {runner} captures FULL decode "
            f"graphs only for k in {_graphed_k(vllm_config)} of 0..{vllm_config.num_speculative_tokens}, "
            f"so probing another k would measure graphs, not k; serve with "
            f'--compilation-config \'{{"cudagraph_mode": "PIECEWISE"}}\' (graphs keyed by token count, '
            f"every k) or --enforce-eager, or drop live_k"
        )
    return compilation.max_cudagraph_capture_size


def _runs_v2(vllm_config: Any) -> bool:
    """vLLM's own rule (``VllmConfig.use_v2_model_runner``); vLLM 0.34 has no V1 runner and no such property."""
    return getattr(vllm_config, "use_v2_model_runner", True)


def _graphed_k(vllm_config: Any) -> list[int]:
    """The k values FULL decode graphs are captured for: V2 reads them off the dense table vLLM's scheduler runs on,
    V1 (and V2 without a table) captures k = num_speculative_tokens only."""
    spec, max_k = vllm_config.speculative_config, vllm_config.num_speculative_tokens
    if not (_runs_v2(vllm_config) and spec.uses_dynamic_speculative_decoding()):
        return [max_k]
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    dense = build_dynamic_sd_schedule_lookup(
        spec.num_speculative_tokens_per_batch_size, vllm_config.scheduler_config.max_num_seqs, max_k
    )
    return sorted(set(dense[1:]))


def attach(scheduler: Any) -> LiveK | None:
    """Replace ``scheduler.dynamic_sd_lookup`` with a :class:`LiveK` when its config asks (once per scheduler)."""
    settings = settings_of(scheduler.vllm_config)
    if settings is None:
        return None
    graph_tokens = graph_tokens_of(scheduler.vllm_config)
    max_k, table = scheduler.num_spec_tokens, scheduler.dynamic_sd_lookup
    size = len(table) if table else getattr(scheduler, "max_num_running_reqs", 1) + 1  # dense, like vLLM's
    start = start_of(scheduler.vllm_config, settings, max_k, table or None, size)
    live = LiveK(
        max_k,
        start.table,
        settings,
        held=functools.partial(_seeded_sampling, scheduler),
        graph_tokens=graph_tokens,
        measured_start=start.measured,
    )
    scheduler.dynamic_sd_lookup = live
    setattr(scheduler, _MARK, live)
    scheduler._vllm_eagle3_live_k_steps = {}
    graphs = (
        "no CUDA graphs"
        if graph_tokens is None
        else f"PIECEWISE CUDA graphs up to {graph_tokens} tokens: a probe stays on k's side of that line"
    )
    sweep = (
        f"sweeps every k ({settings.min_probes} probes each, one every {settings.settle_every} steps) and settles on "
        f"the fastest by {100 * settings.margin:.0f} %"
    )
    logger.info(
        "vllm-eagle3 live k: on; k in 0..%d per batch size, measured on this machine while serving: each batch-size "
        "bucket %s, then probes a neighbouring k every %d steps for %d; %s; each change is logged",
        max_k,
        f"starts settled at {start.where}; a neighbour faster by {100 * settings.margin:.0f} % takes over, and the "
        f"bucket then {sweep}"
        if start.measured
        else f"starting from {start.where} {sweep}",
        settings.explore_every,
        settings.hold,
        graphs,
    )
    return live


class Start(NamedTuple):
    """Where live k starts: vLLM's dense lookup, the words that say where it came from, and whether it was measured on
    this host kind (then each bucket starts settled instead of sweeping every k)."""

    table: list[int]
    where: str
    measured: bool


def start_of(vllm_config: Any, settings: Settings, max_k: int, table: list[int] | None, size: int) -> Start:
    """Where each bucket starts (``size`` entries): the table measured on this host kind for this draft
    (:mod:`vllm_eagle3.live_k_start`) when ``configs/live_k_start.yaml`` lists one and ``host_table`` is on, else the
    serve config's table (``table``; None: k = max_k everywhere)."""
    from vllm_eagle3 import live_k_start

    configured = "the configured num_speculative_tokens_per_batch_size" if table else f"k = {max_k}"
    if not settings.host_table:
        return Start(table or [max_k] * size, f"{configured} (written in the config; host_table off)", False)
    kind, slug = live_k_start.this_host()
    draft = Path(str(vllm_config.speculative_config.model)).name
    try:
        found = live_k_start.lookup(live_k_start.read(live_k_start.start_file()), draft, slug, kind, max_k)
    except live_k_start.StartTableError as exc:
        raise LiveKError(f"{exc} (or serve with live_k: {{host_table: false}})") from None
    if found is None:
        why = f"{live_k_start.START_FILE} has no {draft} on {slug}"
        where = f"{configured} (written in the config, not measured on this host kind: {why})"
        return Start(table or [max_k] * size, where, False)
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    rows = [list(row) for row in found.table]
    dense = build_dynamic_sd_schedule_lookup(rows, size - 1, max_k)  # as vLLM expands the config's table
    return Start(dense, f"the table measured on {kind} for {draft}, {rows} ({found.measured})", True)


def _verified(scheduler_output: Any, model_runner_output: Any) -> list[tuple[int, int]]:
    """(drafted, accepted) of each request whose drafts the step verified, as the draft back-off counts them
    (:func:`~vllm_eagle3.request_speculation_vllm.verified_counts`: drafts the grammar invalidated were never
    verified, so they are neither drafted nor rejected)."""
    from vllm_eagle3.request_speculation_vllm import verified_counts

    return [(drafted, accepted) for _, drafted, accepted in verified_counts(scheduler_output, model_runner_output)]


def _has_prefill(scheduler_output: Any) -> bool:
    """Whether the step computes a prompt (or a chunk of one): some request is scheduled more tokens than its one
    new token and its drafts. Such a step's time is mostly the prompt's, the same whatever k, and under sustained
    load a prompt is admitted at most steps: counted as a sample of k, it buried a 10 % difference between two k in
    noise (a real c = 32 run: +9.8 % for k = 5 over k = 1, short of two standard errors after 8 probes)."""
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    return any(n > 1 + len(spec.get(r, ())) for r, n in scheduled.items())


def _seeded_sampling(scheduler: Any) -> bool:
    """Whether the scheduler holds a request sampled with a seed. Its output depends on the k of every step it
    runs in (the rejection sampler draws per draft token), so while one is served live k does not probe: the same
    seed alone on the server gives the same text, as with a fixed table."""
    for request in scheduler.requests.values():
        params = request.sampling_params
        if params is not None and params.seed is not None and params.temperature > 0:
            return True
    return False


REPORT_NAME = "live_k.json"
REPORT_EVERY_S = 2.0


def report_path(environ: Mapping[str, str] | None = None):
    """``$EAGLE3_CHECK_DIR/live_k.json``, next to the online check's reports."""
    return report_file(REPORT_NAME, environ)


def read_report(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The engine's latest live-k report (the API server's view), or None when live k is off or has not run."""
    path = report_path(environ)
    return read_report_file(path) if path is not None else None


def _write_report(scheduler: Any, live: LiveK) -> None:
    """Every REPORT_EVERY_S while serving and whenever the engine runs out of requests (so a finished burst is
    always reported whole)."""
    now = live.clock()
    idle = not scheduler.get_num_unfinished_requests()
    if not idle and now - getattr(scheduler, "_vllm_eagle3_live_k_written", -math.inf) < REPORT_EVERY_S:
        return
    scheduler._vllm_eagle3_live_k_written = now
    path = report_path()
    if path is None:
        return
    try:
        write_report_file(path, live.report())
    except OSError as exc:  # the endpoint loses the live-k view; serving goes on
        logger.warning("vllm-eagle3 live k: could not write %s: %s", path, exc)


def _log_step(scheduler: Any, live: LiveK, decision, prefill: bool, seconds: float, verified) -> None:
    """One JSON line per step into ``$EAGLE3_LIVE_K_STEP_LOG`` (when set): what the controller saw, for
    ``vllm-eagle3 live-k-trace`` and for studying the machine's step-time noise. The file opens once per scheduler,
    line-buffered."""
    log = getattr(scheduler, "_vllm_eagle3_live_k_log", False)
    if log is False:
        path = envs.get(envs.LIVE_K_STEP_LOG)
        log = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (lives as long as the scheduler)
        scheduler._vllm_eagle3_live_k_log = log
    if log is None:
        return
    batch, k, sample = decision
    row = dict(t=round(live.clock(), 4), batch=batch, k=k, sample=sample, prefill=prefill, s=round(seconds, 6))
    drafted, accepted = sum(n for n, _ in verified), sum(a for _, a in verified)
    row.update(bucket_k=live.buckets[bucket_of(batch)].k, drafted=drafted, accepted=accepted)
    log.write(json.dumps(row) + "\n")


def install() -> str:
    """Wrap vLLM's ``Scheduler`` (``__init__``, ``schedule``, ``update_from_output``) once per process."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, _INSTALLED, False):
        return "already installed"
    init, schedule, update = Scheduler.__init__, Scheduler.schedule, Scheduler.update_from_output

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        attach(self)

    def schedule_(self, *args, **kwargs):
        live = getattr(self, _MARK, None)
        started = None
        if live is not None and live.broken is None:
            live.decision = None
            started = live.clock()  # the step's cost: scheduling, execution and the scheduler's update
        out = schedule(self, *args, **kwargs)
        if started is not None:
            try:  # keyed by the output: under async scheduling the next schedule comes before this update
                steps = self._vllm_eagle3_live_k_steps
                if len(steps) > 16:  # outputs never handed back (an aborted step): forget them
                    steps.clear()
                decision, prefill = live.decision, _has_prefill(out)
                if decision is not None and decision[2] and prefill:
                    decision = (*decision[:2], False)  # a prompt's prefill in the step: its time is not k's
                steps[id(out)] = (decision, started, prefill)
            except Exception as exc:  # never fatal to the engine
                live._break(exc)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        live = getattr(self, _MARK, None)
        verified: list[tuple[int, int]] = []
        if live is not None and live.broken is None:
            try:  # read before vLLM's update consumes the step
                verified = _verified(scheduler_output, model_runner_output)
            except Exception as exc:
                live._break(exc)
        out = update(self, scheduler_output, model_runner_output)
        if live is not None and live.broken is None:
            try:
                steps = self._vllm_eagle3_live_k_steps
                decision, started, prefill = steps.pop(id(scheduler_output), (None, None, False))
                seconds = live.clock() - started if started is not None else 0.0
                live.observe(decision, seconds, verified)
                _write_report(self, live)
                if decision is not None:
                    _log_step(self, live, decision, prefill, seconds, verified)
            except Exception as exc:
                live._break(exc)
        return out

    for name, fn in (("__init__", __init__), ("schedule", schedule_), ("update_from_output", update_from_output)):
        functools.update_wrapper(fn, getattr(Scheduler, name))
        setattr(Scheduler, name, fn)
    setattr(Scheduler, _INSTALLED, True)
    return "Scheduler: dynamic_sd_lookup measured live when live_k is set"
