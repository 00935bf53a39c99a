"""vLLM's side of :mod:`vllm_eagle3.live_k`: the scheduler wrapped so its k lookup is a
:class:`~vllm_eagle3.live_k.LiveK`, each step handed to it, and its report written where ``GET /v1/eagle3/wiring`` reads it.

Data flow position: :func:`install` runs in every vLLM process (``vllm_eagle3.plugin.register``) and wraps vLLM's
``Scheduler`` class once: ``__init__`` (:func:`attach`: a LiveK replaces ``dynamic_sd_lookup`` when the plugin's
``--additional-config`` mapping has ``live_k``), ``schedule`` (the step's decision and start time, keyed by its output)
and ``update_from_output`` (the step's time and the drafts it verified, then the report). A scheduler without
``live_k`` is left as vLLM made it. Nothing here is fatal to the engine: an exception turns live k off (one ERROR).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Mapping

from vllm_eagle3.live_k import CONFIG_NAME, LiveK, LiveKError, Settings
from vllm_eagle3.wiring_check import read_report_file, report_file, write_report_file

logger = logging.getLogger("vllm.vllm_eagle3.live_k")

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
        logger.info("vllm-eagle3 live k: set, but this server does not speculate: there is no k to choose, so "
                    "live_k does nothing here (drop it, or add --speculative-config to speculate)")
        return None
    if vllm_config.parallel_config.data_parallel_size > 1:
        raise LiveKError("live_k needs data_parallel_size 1: vLLM runs one k across data-parallel ranks (it turns "
                         "num_speculative_tokens_per_batch_size off there); drop live_k or data parallelism")
    return settings


def attach(scheduler: Any) -> LiveK | None:
    """Replace ``scheduler.dynamic_sd_lookup`` with a :class:`LiveK` when its config asks (once per scheduler)."""
    settings = settings_of(scheduler.vllm_config)
    if settings is None:
        return None
    max_k, table = scheduler.num_spec_tokens, scheduler.dynamic_sd_lookup
    where = "the configured num_speculative_tokens_per_batch_size" if table else f"k = {max_k}"
    live = LiveK(max_k, table or [max_k] * 2, settings, held=functools.partial(_seeded_sampling, scheduler))
    scheduler.dynamic_sd_lookup = live
    setattr(scheduler, _MARK, live)
    scheduler._vllm_eagle3_live_k_steps = {}
    logger.info("vllm-eagle3 live k: on; k in 0..%d per batch size, starting from %s, measured on this machine "
                "while serving (probe a neighbouring k every %d steps for %d, move when %.0f %% faster); each change "
                "is logged", max_k, where, settings.explore_every, settings.hold, 100 * settings.margin)
    return live


def _verified(scheduler_output: Any, model_runner_output: Any) -> list[tuple[int, int]]:
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    sampled = getattr(model_runner_output, "sampled_token_ids", None)
    index = {r: i for i, r in enumerate(getattr(model_runner_output, "req_ids", None) or ())}
    out = []
    for req_id, drafts in spec.items():
        i = index.get(req_id)
        if drafts and sampled and i is not None and i < len(sampled) and len(sampled[i]):
            out.append((len(drafts), len(sampled[i]) - 1))
    return out


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
                steps[id(out)] = (live.decision, started)
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
                decision, started = self._vllm_eagle3_live_k_steps.pop(id(scheduler_output), (None, None))
                seconds = live.clock() - started if started is not None else 0.0
                live.observe(decision, seconds, verified)
                _write_report(self, live)
            except Exception as exc:
                live._break(exc)
        return out

    for name, fn in (("__init__", __init__), ("schedule", schedule_), ("update_from_output", update_from_output)):
        functools.update_wrapper(fn, getattr(Scheduler, name))
        setattr(Scheduler, name, fn)
    setattr(Scheduler, _INSTALLED, True)
    return "Scheduler: dynamic_sd_lookup measured live when live_k is set"
