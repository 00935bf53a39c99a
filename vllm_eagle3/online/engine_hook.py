"""The online wiring check inside vLLM's worker: sees each step's rows, follows a sample of requests, scores them,
logs the verdict and writes it where the API server reads it.

Data flow position: a step of vLLM's runner (target forward, sampling) -> **this hook** (reads the step, returns
nothing, changes nothing) around the runner method that hands the step to the EAGLE proposer: V1's
``propose_draft_token_ids``, Model Runner V2's ``sample_tokens`` (:mod:`vllm_eagle3.online.runners`, one row per
runner, turns a call into :class:`~vllm_eagle3.online.runners.StepRows`). :func:`install` wraps every row's method once
per process (``vllm_eagle3.plugin.register``); :func:`attach` (called when the check is planned, once vLLM's config
says which runner serves) turns the check off, with one WARNING and an ``off`` report, where the serving runner's hook
is missing: a check is never on and idle. The wrapper finds the capture model's
:class:`~vllm_eagle3.online.plan.CheckPlan` (the candidates, set when vLLM asked the target for its aux states) and
runs a :class:`Checker` on tensor-parallel rank 0 only (its taps are complete there, and the check runs no collective).

Never fatal: an exception inside the check turns the check off with one WARNING naming it (the engine serves on);
``report.json`` then says ``"verdict": "off"`` and why. Cost: time spent here is measured; a new request is followed
only while the time spent plus the mean cost of a scored request for each request followed now and the new one stays
within ``check.budget`` of the engine's time (so requests followed together cannot overshoot the budget by their
number). The engine's time is the time between its steps, each gap counted up to :data:`IDLE_GAP_S`: an engine idle
for hours has not earned minutes of check time to spend on the next burst of traffic. A new engine starts with
:data:`CREDIT_S` of engine time on account (0.6 s of check time at the default 2 %), or the first requests due could
never be followed: their scoring cost is not yet earned when they start. Requests passed over for the budget are
counted (``over_budget`` in the report). The report is rewritten after each score and at least every
:data:`REPORT_EVERY_S` while requests run.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch

from vllm_eagle3 import LOGGER
from vllm_eagle3.online.runners import RUNNERS, RunnerHook, StepRows, runner_in_use, tp_rank, unknown_worker
from vllm_eagle3.online.traces import RowSpan, Trace, Tracker
from vllm_eagle3 import verdicts
from vllm_eagle3.wiring_check import Judge, report_path, write_report_file
from vllm_eagle3.wirings import config_lines

logger = logging.getLogger(f"{LOGGER}.check")

_MARK = "_vllm_eagle3_wiring_check"
REPORT_EVERY_S = 2.0
IDLE_GAP_S = 2.0
CREDIT_S = 30.0
"""A gap between two steps longer than this is idle time: counted as this much engine time."""
_INSTALLED: dict[str, str | None] = {}
"""Runner name -> None once its method is wrapped in this process, else why it could not be."""


def install() -> str:
    """Wrap every runner's hooked method (idempotent); returns what was done, for the patch log ("not installed: ..."
    only when no runner could be hooked; a runner missed alone is reported by :func:`attach` where it serves)."""
    for row in RUNNERS.values():
        if _INSTALLED.get(row.name, "") is not None:
            _INSTALLED[row.name] = _install_row(row)
    missed = {name: why for name, why in _INSTALLED.items() if why is not None}
    if len(missed) == len(RUNNERS):
        return "not installed: " + "; ".join(f"{name}: {why}" for name, why in missed.items())
    hooked = ", ".join(f"{r.name} {r.cls}.{r.method}" for r in RUNNERS.values() if _INSTALLED[r.name] is None)
    return f"installed ({hooked})" + "".join(f"; {name} not: {why}" for name, why in missed.items())


def serve_check_taps(taps) -> None:
    """The check's extra taps, in the order the capture model appends them to its aux list after the spec's (set when
    vLLM asks the target for its aux states, before the first step; one target per worker process)."""
    global _CHECK_TAPS
    _CHECK_TAPS = tuple(int(k) for k in taps)


_CHECK_TAPS: tuple[int, ...] = ()
_STEP = "_vllm_eagle3_step"  # V2: (runner, kept state) of the sample_tokens call in progress, on its speculator


def _install_row(row: RunnerHook) -> str | None:
    try:
        cls = row.target()
        outer_cls = row.outer_target()
        problem = row.problem()
    except Exception as exc:  # noqa: BLE001 - an import that fails on this vLLM: that runner is not hooked
        return f"{row.module}.{row.cls} cannot be imported: {type(exc).__name__}: {exc}"
    if problem is not None:
        return problem
    fn = getattr(cls, row.method)
    if getattr(fn, _MARK, False):
        return None
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        """Hands the draft the spec's taps alone and shows the check the step (before the draft runs)."""
        bound, check_aux = None, {}
        if _CHECK_TAPS:
            bound = sig.bind(self, *args, **kwargs)
            aux = bound.arguments.get(row.aux_param)
            if aux:
                n = len(aux) - len(_CHECK_TAPS)
                check_aux = dict(zip(_CHECK_TAPS, aux[n:]))  # each [num_tokens, hidden], from the forward's output
                bound.arguments[row.aux_param] = list(aux[:n])
                args, kwargs = bound.args[1:], bound.kwargs
        runner, kept = (self, None) if row.outer is None else self.__dict__.get(_STEP, (None, None))
        checker = _checker_for(runner) if runner is not None else None
        if checker is not None:
            arguments = (bound or sig.bind(self, *args, **kwargs)).arguments
            checker.observe_call(runner, lambda: row.rows(runner, kept, arguments, check_aux))
        return fn(self, *args, **kwargs)

    setattr(wrapper, _MARK, True)
    setattr(cls, row.method, wrapper)
    if outer_cls is not None:
        _wrap_outer(row, outer_cls)
    return None


def _wrap_outer(row: RunnerHook, outer_cls: type) -> None:
    """V2: ``sample_tokens`` keeps the step state it consumes where its ``propose`` call finds it."""
    fn = getattr(outer_cls, row.outer[2])
    if getattr(fn, _MARK, False):
        return

    @functools.wraps(fn)
    def outer(self, *args, **kwargs):
        speculator = getattr(self, "speculator", None)
        if speculator is None or _checker_for(self) is None:
            return fn(self, *args, **kwargs)
        speculator.__dict__[_STEP] = (self, row.keep(self))
        try:
            return fn(self, *args, **kwargs)
        finally:
            speculator.__dict__.pop(_STEP, None)

    setattr(outer, _MARK, True)
    setattr(outer_cls, row.outer[2], outer)


def attach(plan, vllm_config):
    """``plan`` (a :class:`~vllm_eagle3.online.plan.CheckPlan`) if this engine's runner is hooked, else the plan turned
    off with the reason, one WARNING and an ``off`` report for ``GET /v1/eagle3/wiring`` (tensor-parallel rank 0)."""
    if not plan.enabled:
        return plan
    install()  # no-op where the plugin already did it
    name = runner_in_use(vllm_config)
    why = unknown_worker(vllm_config)
    if why is None and _INSTALLED.get(name) is not None:
        row = RUNNERS[name]
        why = (
            f"vLLM serves with Model Runner {name} here and its hook ({row.cls}.{row.method}) is missing: "
            f"{_INSTALLED[name]}"
        )
    if why is None:
        return plan
    plan = dataclasses.replace(plan, extra_taps=(), off_because=why)
    if tp_rank() == 0:
        logger.warning("vllm-eagle3 wiring check: off, it cannot attach to vLLM's model runner: %s", why)
        write_off_report(plan, vllm_config, why)
    return plan


def write_off_report(plan, vllm_config, why: str) -> None:
    """An ``off`` report saying ``why``, where ``GET /v1/eagle3/wiring`` reads this engine's check."""
    index = vllm_config.parallel_config.data_parallel_rank or 0
    checker = Checker(plan, None, index, vllm_config.speculative_config.num_speculative_tokens, 0, report_path(index))
    checker.off_because = why
    checker.write_report()


def _checker_for(runner) -> "Checker | None":
    checker = runner.__dict__.get(_MARK, False)
    if checker is False:
        checker = None
        try:
            checker = Checker.for_runner(runner)
        except Exception as exc:  # noqa: BLE001 - a check that cannot start must not stop the engine
            logger.warning("vllm-eagle3 wiring check: off, it could not start: %s: %s", type(exc).__name__, exc)
            _report_off(runner, f"it could not start: {type(exc).__name__}: {exc}")
        runner.__dict__[_MARK] = checker
    return checker


def _report_off(runner, why: str) -> None:
    """:func:`write_off_report` for a check that could not start on ``runner``; never raises."""
    try:
        write_off_report(_capture_model(runner).check_plan, runner.vllm_config, why)
    except Exception:  # noqa: BLE001 - the WARNING above already says it; the engine serves on
        logger.debug("vllm-eagle3 wiring check: no off report written", exc_info=True)


def _capture_model(runner):
    model = runner.get_model()
    return getattr(model, "language_model", model)


class Checker:
    def __init__(
        self, plan, scorer, engine_index: int, num_spec_tokens: int, num_layers: int, report: Path | None
    ) -> None:
        cfg = plan.config
        self.plan, self.cfg, self.scorer = plan, cfg, scorer
        self.engine_index, self.k, self.num_layers, self.report = engine_index, num_spec_tokens, num_layers, report
        self.tracker = Tracker(cfg.sample_every, cfg.max_temperature, cfg.max_positions, cfg.max_followed)
        self.judge = Judge([c.taps for c in plan.candidates], cfg)
        self.whys = [c.why for c in plan.candidates]
        self.last_step = time.monotonic()
        self.engine_time = 0.0  # time between steps, each gap up to IDLE_GAP_S
        self.spent = 0.0
        self.scoring = 0.0  # the part of spent that went to scoring (the rest: recording rows at each step)
        self.scored = 0
        self.written = -math.inf
        self.last_warning = -math.inf
        self.warned_kind: str | None = None
        self.off_because: str | None = None

    @classmethod
    def for_runner(cls, runner) -> "Checker | None":
        from vllm_eagle3.online.scorer import Scorer

        lm = _capture_model(runner)
        plan = getattr(lm, "check_plan", None)
        if plan is None or not plan.enabled or tp_rank() != 0:
            return None
        cfg = runner.vllm_config
        scorer = Scorer(
            cfg.speculative_config.model,
            cfg.model_config.model,
            [c.taps for c in plan.candidates],
            draft_revision=getattr(cfg.speculative_config, "revision", None),
            target_revision=getattr(cfg.model_config, "revision", None),
        )
        index = cfg.parallel_config.data_parallel_rank or 0
        checker = cls(
            plan,
            scorer,
            index,
            cfg.speculative_config.num_speculative_tokens,
            lm.capture_resolution.target.num_layers,
            report_path(index),
        )
        checker.write_report()
        return checker

    # ------------------------------------------------------------------------------------------- per step
    def guarded(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None with the check stopped (one WARNING) if it raises: the engine serves on."""
        if self.off_because is not None:
            return None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - the engine serves on; the check says why it stopped
            self.stop(exc)
            return None

    def stop(self, exc: Exception) -> None:
        self.off_because = f"stopped after an error: {type(exc).__name__}: {exc}"
        logger.warning(
            "vllm-eagle3 wiring check [engine %d]: %s (serving is not affected)",
            self.engine_index,
            self.off_because,
            exc_info=True,
        )
        self.write_report()

    def observe_safely(self, runner, step: StepRows | None) -> None:
        """Record ``step`` (nothing for None), timed as check cost."""
        self.observe_call(runner, lambda: step)

    def observe_call(self, runner, rows: Callable[[], StepRows | None]) -> None:
        """Record the step that ``rows()`` reads off the runner (:mod:`vllm_eagle3.online.runners`); reading it
        counts as check cost."""
        if self.off_because is not None:
            return
        t0 = time.monotonic()
        self.engine_time += min(t0 - self.last_step, IDLE_GAP_S)
        try:
            step = rows()
            if step is not None:
                self.observe(runner, step)
        except Exception as exc:  # noqa: BLE001 - the engine serves on; the check says why it stopped
            self.stop(exc)
        finally:
            now = self.last_step = time.monotonic()
            self.spent += now - t0
            self.engine_time += now - t0
            if now - self.written >= REPORT_EVERY_S:
                self.write_report()  # fresh cost and counters between scores (a 3 kB file; not counted as cost)

    def within_budget(self) -> bool:
        """Room for one more followed request: what was spent, plus the mean cost of a scored request for each
        request followed now and the new one, within the budget's share of the engine's time and the credit."""
        per_request = self.spent / self.scored if self.scored else 0.0
        ahead = per_request * (len(self.tracker.traces) + 1)
        return self.spent + ahead <= self.cfg.budget * (self.engine_time + CREDIT_S)

    def observe(self, runner, step: StepRows) -> None:
        for trace in self.tracker.finish(step.finished):
            self.score(trace)
        t = self.tracker
        if all(rid in t.decided and rid not in t.traces for rid in step.req_ids):
            return  # nothing followed, nothing new: no need to wait for the step's counts on the device
        valids, firsts = step.device_rows()
        chosen = []
        for i, rid in enumerate(step.req_ids):
            s, e = step.query_start[i], step.query_start[i + 1]
            if e <= s:
                continue
            valid = max(0, min(valids[i], e - s))
            pos, limit = int(firsts[i]), step.max_len[i]
            done = limit is not None and pos + valid + 1 >= limit
            span = RowSpan(rid, s, valid, pos, int(step.prompt_len[i]), float(step.temperature[i]), done)
            if valid and self.tracker.wants(span, self.within_budget()):
                chosen.append(span)
        if not chosen:
            return
        tokens = step.input_ids.to("cpu", torch.long)
        by_tap = dict(zip(self.plan.candidates[0].taps, step.aux))
        by_tap.update(step.check_aux)
        for span in chosen:
            rows = slice(span.first_row, span.first_row + span.valid)
            done = self.tracker.record(
                span, tokens[rows].clone(), {k: h[rows].to("cpu", copy=True) for k, h in by_tap.items()}
            )  # served dtype
            if done is not None:
                self.score(done)

    # ------------------------------------------------------------------------------------------- verdicts
    def score(self, trace: Trace) -> None:
        t0 = time.monotonic()
        anchors, matches = self.scorer.score(trace)
        self.scoring += time.monotonic() - t0
        if not anchors:
            return
        self.scored += 1
        v = self.judge.add(anchors, matches)
        self.write_report()
        if v.kind in verdicts.ALARMS and v.flagged is not None:
            now = time.monotonic()
            if self.warned_kind != v.kind or now - self.last_warning >= self.cfg.warn_interval_s:
                self.warned_kind, self.last_warning = v.kind, now
                logger.log(verdicts.entry(v.kind).log_level, "%s", self.warning_line())

    def warning_line(self) -> str:
        v, c = self.judge.verdict, self.plan.candidates
        conf, better = c[0], c[v.flagged]
        what = f"keep under {verdicts.COLLAPSE_RATIO:.0%} of" if v.kind == verdicts.WRONG else f"lose {v.loss:.0%} of"
        fix = "; ".join(config_lines(better.taps, self.num_layers)[:2])
        return (
            f"vllm-eagle3 wiring check [engine {self.engine_index}]: {verdicts.heading(v.kind, v.loss)}: the served "
            f"taps {conf.label} {what} the "
            f"draft's first-token acceptance that {better.label} gets ({better.why}): {v.p0[0]:.3f} vs "
            f"{v.p0[v.flagged]:.3f} over {v.requests} requests ({v.anchors} positions; false-alarm bound "
            f"{self.cfg.false_alarm:g}). To serve {better.label}: {fix}. Confirm offline with "
            "`vllm-eagle3 doctor`; GET /v1/eagle3/wiring lists every candidate"
        )

    def status(self) -> dict[str, Any]:
        t = self.tracker
        out = self.judge.report(self.whys, self.k)
        if self.off_because is not None:
            out["verdict"] = verdicts.OFF
            out["off_because"] = self.off_because
        out.update(
            engine=self.engine_index,
            scored_requests=self.scored,
            followed=t.followed,
            followed_now=len(t.traces),
            eligible_seen=t.eligible_seen,
            too_hot=t.too_hot,
            dropped=t.dropped,
            over_budget=t.over_budget,
            at_max_followed=t.at_max_followed,
            cost={
                "seconds": round(self.spent, 3),
                "scoring_seconds": round(self.scoring, 3),
                "fraction_of_engine_time": round(self.spent / max(self.engine_time, 1e-9), 5),
                "engine_seconds": round(self.engine_time, 3),
                "budget": self.cfg.budget,
            },
            settings={
                "sample_every": self.cfg.sample_every,
                "max_temperature": self.cfg.max_temperature,
                "max_followed": self.cfg.max_followed,
                "min_requests": self.cfg.min_requests,
            },
            extra_taps=[int(k) for k in self.plan.extra_taps],
            updated=time.time(),
        )
        return out

    def write_report(self) -> None:
        self.written = time.monotonic()
        if self.report is None:
            return
        write_report_file(self.report, self.status())
