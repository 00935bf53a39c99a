"""vLLM's side of :mod:`vllm_eagle3.request_speculation`: the scheduler drops the drafts of a request that turned
speculation off or whose drafts keep failing, and ``SamplingParams.verify`` refuses a bad ``speculation`` value.

Data flow position: :func:`install` runs in every vLLM process (``vllm_eagle3.plugin.register``) and wraps, once:
- ``SamplingParams.verify`` (API server, before the engine sees the request): a bad value is a 400 naming the fix.
- ``Scheduler.__init__``: a :class:`Gates` per scheduler that speculates (``draft_backoff`` read from the plugin's
  ``--additional-config`` mapping).
- ``Scheduler.schedule``: before vLLM's, each running request holding drafts asks its gate; a refused request's
  ``spec_token_ids`` are emptied, so vLLM schedules no draft slots for it this step (the V1 runner and Model Runner
  V2 verify what the scheduler sends; vLLM empties them itself in ``schedule`` once read).
- ``Scheduler.update_from_output``: each verified request's drafted and accepted counts, read as vLLM's own
  per-request metrics count them (``len(sampled) - 1`` accepted), go to its gate.
These compose with :mod:`vllm_eagle3.live_k_vllm`'s wrappers of the same methods (each wraps what it finds; the
plugin installs live k first, so this one runs outside it and live k sees only the drafts that are verified).
Nothing here is fatal to the engine: an exception turns the gates off (one ERROR) and vLLM drafts as it would.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm_eagle3 import LOGGER
from vllm_eagle3.request_speculation import (
    CONFIG_NAME,
    KEY,
    Backoff,
    DraftGate,
    SpeculationRequestError,
    speculation_of,
)

logger = logging.getLogger(f"{LOGGER}.request_speculation")

_MARK = "_vllm_eagle3_request_speculation"  # a scheduler's Gates (instance attribute)
_INSTALLED = "_vllm_eagle3_request_speculation_installed"  # on the Scheduler and SamplingParams classes


class Gates:
    """The :class:`DraftGate` of each request of one scheduler."""

    def __init__(self, backoff: Backoff | None) -> None:
        self.backoff = backoff
        self.gates: dict[str, DraftGate] = {}
        self.broken: BaseException | None = None

    def gate(self, request: Any) -> DraftGate:
        gate = self.gates.get(request.request_id)
        if gate is None:
            params = getattr(request, "sampling_params", None)
            enabled = speculation_of(getattr(params, "extra_args", None) if params is not None else None)
            gate = self.gates[request.request_id] = DraftGate(self.backoff, enabled=enabled)
        return gate

    def before_schedule(self, running: list[Any]) -> None:
        """Empty the drafts of each running request whose gate refuses them this step."""
        for request in running:
            if request.spec_token_ids and not self.gate(request).allow():
                request.spec_token_ids = []

    def after_update(self, verified: list[tuple[str, int, int]], live: dict[str, Any]) -> None:
        """Hand each verified request its counts; forget the gates of requests the scheduler no longer holds."""
        for req_id, drafted, accepted in verified:
            gate = self.gates.get(req_id)
            if gate is not None:
                gate.observe(drafted, accepted)
        if len(self.gates) > len(live):
            for req_id in [r for r in self.gates if r not in live]:
                del self.gates[req_id]

    def _break(self, exc: BaseException) -> None:
        self.broken = exc
        self.gates.clear()
        logger.error(
            "vllm-eagle3 speculation per request: off after an error (%r); every request drafts as vLLM schedules it",
            exc,
        )


def backoff_of(vllm_config: Any) -> Backoff | None:
    """The ``draft_backoff`` setting of this config's plugin mapping (true: the defaults; absent or false: off)."""
    from vllm_eagle3.resolve import plugin_config

    return Backoff.from_config(plugin_config(getattr(vllm_config, "additional_config", None)).get(CONFIG_NAME))


def attach(scheduler: Any) -> Gates | None:
    """A :class:`Gates` on a scheduler that speculates (None for one that does not: there are no drafts)."""
    if not getattr(scheduler, "num_spec_tokens", 0):
        return None
    backoff = backoff_of(scheduler.vllm_config)
    gates = Gates(backoff)
    setattr(scheduler, _MARK, gates)
    logger.info(
        'vllm-eagle3 speculation per request: a request with vllm_xargs {"%s": false} verifies no drafts; back-off %s',
        KEY,
        "off"
        if backoff is None
        else f"on: after {backoff.misses} verify steps accepting nothing a request drafts nothing for "
        f"{backoff.pause} steps, then probes (a failed probe doubles the pause, up to {backoff.max_pause})",
    )
    return gates


def verified_counts(scheduler_output: Any, model_runner_output: Any) -> list[tuple[str, int, int]]:
    """(request, drafted, accepted) of each request whose drafts this step verified; drafts the grammar
    invalidated are not counted as drafted, as in vLLM's per-request metrics. E.g., drafts [a, b, c] and sampled
    [a, x] -> (id, 3, 1)."""
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    invalid = getattr(scheduler_output, "num_invalid_spec_tokens", None) or {}
    sampled = getattr(model_runner_output, "sampled_token_ids", None)
    # req_ids, not req_id_to_index: vLLM 0.34's ModelRunnerOutput has only the first
    index = {r: i for i, r in enumerate(getattr(model_runner_output, "req_ids", None) or ())}
    out = []
    for req_id, drafts in spec.items():
        i = index.get(req_id)
        if drafts and sampled and i is not None and i < len(sampled) and len(sampled[i]):
            out.append((req_id, len(drafts) - invalid.get(req_id, 0), len(sampled[i]) - 1))
    return out


def _verify_speculation_key(params: Any) -> None:
    from vllm.exceptions import VLLMValidationError

    try:
        speculation_of(params.extra_args)
    except SpeculationRequestError as exc:
        raise VLLMValidationError(str(exc), parameter="vllm_xargs", value=params.extra_args.get(KEY)) from None


def install() -> str:
    """Wrap ``SamplingParams.verify`` and vLLM's ``Scheduler`` (``__init__``, ``schedule``, ``update_from_output``)
    once per process."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, _INSTALLED, False):
        return "already installed"
    verify = SamplingParams.verify
    init, schedule, update = Scheduler.__init__, Scheduler.schedule, Scheduler.update_from_output

    def verify_(self, *args, **kwargs):
        verify(self, *args, **kwargs)
        _verify_speculation_key(self)

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        attach(self)

    def schedule_(self, *args, **kwargs):
        gates = getattr(self, _MARK, None)
        if gates is not None and gates.broken is None:
            try:
                gates.before_schedule(self.running)
            except Exception as exc:  # noqa: BLE001 - never fatal to the engine
                gates._break(exc)
        return schedule(self, *args, **kwargs)

    def update_from_output(self, scheduler_output, model_runner_output):
        gates = getattr(self, _MARK, None)
        verified: list[tuple[str, int, int]] = []
        if gates is not None and gates.broken is None:
            try:  # read before vLLM's update consumes the step
                verified = verified_counts(scheduler_output, model_runner_output)
            except Exception as exc:  # noqa: BLE001 - never fatal to the engine
                gates._break(exc)
        out = update(self, scheduler_output, model_runner_output)
        if gates is not None and gates.broken is None:
            try:
                gates.after_update(verified, self.requests)
            except Exception as exc:  # noqa: BLE001 - never fatal to the engine
                gates._break(exc)
        return out

    functools.update_wrapper(verify_, verify)
    SamplingParams.verify = verify_
    for name, fn in (("__init__", __init__), ("schedule", schedule_), ("update_from_output", update_from_output)):
        functools.update_wrapper(fn, getattr(Scheduler, name))
        setattr(Scheduler, name, fn)
    setattr(Scheduler, _INSTALLED, True)
    return "Scheduler: drafts dropped per request (vllm_xargs speculation, draft back-off); SamplingParams.verify"
