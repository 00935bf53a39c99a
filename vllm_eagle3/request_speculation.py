"""Speculation per request: a client's switch, and a back-off for a request whose drafts keep failing.

Data flow position: between the EAGLE-3 proposer's drafts and the target's verify. vLLM's scheduler holds each
request's drafts (``Request.spec_token_ids``) until the next step verifies them; :mod:`request_speculation_vllm`
asks a :class:`DraftGate` per request, once per step, whether those drafts go to verify or are dropped. This module
is the rules alone (no vLLM): the client's key, the back-off settings and the per-request state.

- **switch**: ``extra_args["speculation"]`` (OpenAI: ``extra_body={"vllm_xargs": {"speculation": false}}``) off:
  the request's drafts are dropped every step; it is served by plain decoding, one token a step.
- **back-off** (:class:`Backoff`, off unless the plugin's ``draft_backoff`` asks; why in its docstring): after
  ``misses`` consecutive verify steps that accept none of the request's drafts, its drafts are dropped for ``pause``
  steps; then one verify step probes. A probe that accepts anything resumes drafting (and resets the pause); a probe
  that accepts nothing pauses again for twice as long, up to ``max_pause`` steps. :func:`drafting_steps` is the
  bound: the verify steps with drafts a request that never accepts can have in ``steps`` steps.

Why no output changes: dropping a request's drafts for a step makes that step emit one token sampled from the
target's own distribution, exactly what the step's first position emits with drafts. Greedy: the target's argmax at
every position either way. Random sampling: rejection sampling emits each token distributed as the target given
the prefix and given everything drawn before (its acceptance test uses fresh randomness), so choosing how many
drafts a step verifies from the past alone (as here, from earlier acceptance) keeps every token's distribution
exact. A seeded request's decisions come from its own history only, so the same seed gives the same text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

KEY = "speculation"
"""The per-request key of ``SamplingParams.extra_args`` (OpenAI ``vllm_xargs``); vLLM 0.32 reads no key of this
name (it reads ``kv_transfer_params``, ``ec_transfer_params``, ``kv_cache_report_mode``, ``diffusion_*``)."""

CONFIG_NAME = "draft_backoff"
"""The key of the plugin's ``--additional-config`` mapping that sets :class:`Backoff` (true, false or a mapping)."""

_WORDS = {"on": True, "true": True, "off": False, "false": False}


class SpeculationRequestError(ValueError):
    """A bad ``speculation`` value in a request, or a bad ``draft_backoff`` setting; the message says the fix."""


def speculation_of(extra_args: Mapping[str, Any] | None) -> bool:
    """Whether a request with these ``extra_args`` may verify drafts (True when the key is absent).

    JSON ``true``/``false`` arrive as 1/0 through the OpenAI server (``vllm_xargs`` holds str, int, float or lists),
    as booleans offline; "on"/"off" are accepted too. E.g., {"speculation": 0} -> False."""
    if not extra_args or KEY not in extra_args:
        return True
    value = extra_args[KEY]
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _WORDS:
        return _WORDS[value.lower()]
    raise SpeculationRequestError(
        f'vllm_xargs {KEY!r} must be true or false (also 1/0, "on"/"off"), got {value!r}; e.g. '
        f'extra_body={{"vllm_xargs": {{"{KEY}": false}}}} serves this request without speculation'
    )


@dataclasses.dataclass(frozen=True)
class Backoff:
    """When a request whose drafts keep failing stops drafting, and how it re-probes.

    Off unless asked (``draft_backoff: true`` or a mapping). On by default it made the shipped default slower where
    it was meant to save: served one request at a time (the shipped pair, k = 5, 16 held-out prompts x 128 tokens, two
    servers in turns on the 2-core AMD EPYC with AVX-512, 2026-12-06), a server with it on gave 0.861x
    [0.796-0.931] the tokens/s of the same server with it off, greedy text identical. This head's acceptance is
    bimodal, all k drafts or none (one prompt: 18 of 40 verify steps accepted nothing, 14 accepted all 5, 3.05 tokens
    per step), so four misses in a row and failed probes come often to requests that gain ~3x from drafting; their
    pauses doubled until they ran as without speculation (23 verify steps instead of 43, 22 against 34 tok/s), while a
    CPU at one request verifies five drafts for little more than one token. A rule that judged a request by the tokens
    its drafts bring per step over a window, not by consecutive misses, might not; it is not built.
    """

    misses: int = 4  # consecutive verify steps accepting no draft before the first pause
    pause: int = 8  # steps without drafts of the first pause (doubled by each failed probe)
    max_pause: int = 128  # the longest pause: a request that never accepts still probes once per max_pause + 1 steps

    def __post_init__(self) -> None:
        if not (self.misses >= 1 and self.pause >= 1 and self.max_pause >= self.pause):
            raise SpeculationRequestError(
                f"{CONFIG_NAME}: misses and pause must be >= 1 and max_pause >= pause; got misses={self.misses}, "
                f"pause={self.pause}, max_pause={self.max_pause}"
            )

    @classmethod
    def from_config(cls, value: Any) -> Backoff | None:
        """``draft_backoff``'s value -> settings (None: off). True: the defaults; absent or false: off; or a mapping
        of this class's fields, e.g. {"misses": 2, "pause": 4, "max_pause": 64}."""
        if value is True:
            return cls()
        if value is None or value is False:
            return None
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(value, Mapping):
            raise SpeculationRequestError(f"{CONFIG_NAME} must be true, false or a mapping of {names}, got {value!r}")
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise SpeculationRequestError(f"{CONFIG_NAME}: unknown key(s) {unknown}; known keys: {names}")
        bad = {k: v for k, v in value.items() if isinstance(v, bool) or not isinstance(v, int)}
        if bad:
            raise SpeculationRequestError(f"{CONFIG_NAME}: {bad} must be whole numbers of steps")
        return cls(**value)


@dataclasses.dataclass
class DraftGate:
    """One request's drafting state. :meth:`allow` is asked once per step in which the request holds drafts;
    :meth:`observe` is told each verify step's drafted and accepted counts. ``backoff`` None: never pauses;
    ``enabled`` False (the client's switch): never drafts."""

    backoff: Backoff | None
    enabled: bool = True
    misses: int = 0  # consecutive verify steps that accepted nothing
    paused: int = 0  # steps left whose drafts are dropped
    next_pause: int = 0  # the next pause's length
    probing: bool = False  # the next verify step is a probe: accepting nothing pauses again at once
    dropped: int = 0  # steps whose drafts were dropped (for the log and tests)

    def __post_init__(self) -> None:
        if self.backoff is not None and not self.next_pause:
            self.next_pause = self.backoff.pause

    def allow(self) -> bool:
        """Whether this step verifies the request's drafts (False: drop them)."""
        if not self.enabled or self.paused:
            if self.paused:
                self.paused -= 1
                self.probing = not self.paused
            self.dropped += 1
            return False
        return True

    def observe(self, drafted: int, accepted: int) -> None:
        """A verify step of this request: ``drafted`` drafts, ``accepted`` of them accepted."""
        if self.backoff is None or drafted <= 0 or self.paused:
            return
        if accepted > 0:
            self.misses, self.probing, self.next_pause = 0, False, self.backoff.pause
            return
        self.misses += 1
        if self.probing or self.misses >= self.backoff.misses:
            self.paused, self.misses, self.probing = self.next_pause, 0, False
            self.next_pause = min(2 * self.next_pause, self.backoff.max_pause)


def drafting_steps(backoff: Backoff, steps: int) -> int:
    """The verify steps with drafts, out of ``steps`` steps holding drafts, of a request that never accepts one:
    ``misses`` steps, then one probe after each pause (pause, 2 pause, ... max_pause, max_pause, ...). E.g. the
    defaults (4, 8, 128) over 127 steps: steps 1-4 draft, then probes at 13, 30, 63 -> 7 (not 127)."""
    gate, verified = DraftGate(backoff), 0
    for _ in range(steps):
        if gate.allow():
            verified += 1
            gate.observe(1, 0)
    return verified
