"""What the online wiring check scores in one engine, planned when vLLM asks the target for its aux states.

Data flow position: vLLM's runner calls ``set_aux_hidden_state_layers`` on the capture model
(:mod:`vllm_eagle3.capture`) -> **this plan** (the candidate wirings next to the resolved taps, the extra taps they
need, or why the check is off) -> the capture model appends the extra taps to its aux list, and
:mod:`vllm_eagle3.online.engine_hook` scores the candidates on tensor-parallel rank 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from vllm_eagle3.checkpoint import DraftInfo
from vllm_eagle3.online.engine_hook import attach
from vllm_eagle3.resolve import Resolution, spec_source
from vllm_eagle3.spec import taps_label
from vllm_eagle3.wiring_check import CheckConfig
from vllm_eagle3.wirings import Candidate, online_candidates


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """What the online wiring check scores in this engine (:mod:`vllm_eagle3.wiring_check`), or why it is off."""

    config: CheckConfig
    candidates: tuple[Candidate, ...] = ()
    extra_taps: tuple[int, ...] = ()  # taps of the candidates that the spec does not capture
    off_because: str | None = None

    @property
    def enabled(self) -> bool:
        return self.off_because is None

    def log_line(self) -> str:
        if not self.enabled:
            return f"vllm-eagle3 wiring check: off ({self.off_because})"
        return (
            f"vllm-eagle3 wiring check: scoring {len(self.candidates)} wirings on 1 in {self.config.sample_every} "
            f"requests at temperature <= {self.config.max_temperature} (configured "
            f"{self.candidates[0].label}; also {', '.join(c.label for c in self.candidates[1:])}); extra taps "
            f"captured: {taps_label(self.extra_taps)}; budget {self.config.budget:.0%} of engine time"
        )


def check_config_from_env(environ: Mapping[str, str] | None = None, config: Any = None) -> CheckConfig:
    """The ``check:`` mapping of the capture spec of :func:`vllm_eagle3.resolve.spec_source` (``config``: the
    ``VllmConfig``), or the defaults."""
    sf = spec_source(config, environ).spec_file
    return getattr(sf, "check", None) or CheckConfig()


def plan_check(resolution: Resolution, vllm_config: Any) -> CheckPlan:
    """The candidates the check scores next to the resolved taps (``vllm_config``: the engine's ``VllmConfig``), and
    the extra taps that needs; off, saying why, where the serving runner has no hook (:func:`engine_hook.attach`)."""
    cfg = check_config_from_env(config=vllm_config)
    if not cfg.enabled:
        return CheckPlan(cfg, off_because="check.enabled is false in the capture spec")
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        return CheckPlan(
            cfg,
            off_because="pipeline parallelism: the check scores on one rank holding every tap; not "
            "supported across stages",
        )
    draft = vllm_config.speculative_config.model
    cands = online_candidates(resolution.spec.taps, DraftInfo.load(draft, weights=False), resolution.target.num_layers)
    if len(cands) < 2:
        return CheckPlan(cfg, tuple(cands), off_because="no other wiring to compare with")
    extra = sorted({k for c in cands for k in c.taps} - set(resolution.spec.taps))
    return attach(CheckPlan(cfg, tuple(cands), tuple(extra)), vllm_config)
