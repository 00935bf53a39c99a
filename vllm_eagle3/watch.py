"""Runtime wiring watch: served EAGLE-3 acceptance against what the draft should reach.

Data flow position: at the very end. target forward -> taps -> concat -> draft ``fc`` -> proposer -> verify ->
vLLM's scheduler counts drafts and accepted tokens per position (``SpecDecodingStats``, already computed every step
for ``/metrics``) -> **this watch** (in the API-server process, fed by the stat-logger plugin in
:mod:`vllm_eagle3.watch_vllm`) -> one WARNING line, ``GET /v1/eagle3/wiring``, ``vllm_eagle3_wiring_*`` gauges.
Its verdicts and thresholds are those of :mod:`vllm_eagle3.verdicts`, shared with the online check and the doctor.

Why: static validation (:mod:`vllm_eagle3.resolve`) catches a spec that disagrees with the draft config, but a
config that is consistently wrong (the incident: the head trained on taps [embed, 3, 31] served with taps
[3, 31, 59]) passes every static check, serves, and accepts ~nothing. Only served acceptance shows it.

What is judged, and why position 0: vLLM's per-position counter ``accepted_per_pos[j]`` counts drafts whose first
j + 1 tokens were all accepted, so ``p0 = accepted_per_pos[0] / drafts`` is the first draft token's acceptance. The
taps feed the draft's first step directly; later positions compound p0 with the draft's own recurrence and depend
on k and on the serving walk, so p0 is the cleanest wiring signal (the field reports are p0: ~0.10 instead of ~0.45
for vLLM #43671, 0.00-0.07 instead of 0.7-0.86 for the incident on the miniature, BENCHMARKS.md). Per-position
rates and the acceptance length are reported next to their expectations, not judged.

Expectation ``E`` for p0:
- the draft folder's ``eval.json`` when it has one (``vllm_eagle3.miniature.evaluate``):
  ``simulated_acceptance.served_walk["1"]`` = accepted / drafts of the head's greedy chains visited the way a server
  visits them; else its every-anchor ``simulated_acceptance.greedy.per_position_acceptance[0]``. The expected
  acceptance length at the served k comes from ``served_walk[str(k)]`` the same way. The numbers are read at
  start-up, never copied: a retrained head brings its own;
- otherwise no expectation, only the documented ``floor`` (default :data:`vllm_eagle3.verdicts.FLOOR`): working
  heads serve p0 0.45-0.86 (a Kimi K2.6 head 0.63-0.65, the miniature 0.64-0.86), wrong wirings 0.00-0.10.

Thresholds: ``wrong_below = COLLAPSE_RATIO * E`` (0.25 E) and ``costs_below = COSTS_RATIO * E`` (0.5 E); without
``E``: ``floor`` and ``2 * floor`` (both ratios and why: :mod:`vllm_eagle3.verdicts`).

Verdicts (the shared words), on a sliding window of the last ``window`` drafts (default 512) with the Wilson score
bounds of p0 at ``Z = 3.29`` (one-sided 99.95%):
- ``pending``: fewer than ``min_drafts`` drafts seen (default 64); nothing is judged;
- ``wrong``: the UPPER bound < ``wrong_below`` (confidently collapsed) -> one WARNING;
- ``costs``: the upper bound < ``costs_below`` -> one WARNING, once the lower bound rules ``wrong`` out (a collapse
  in progress gives its ``wrong`` line alone);
- ``ok``: otherwise.
The bound, not a magic count, decides when there is enough evidence: with zero accepted drafts and a 0.21 cut it
takes 40 drafts, with the incident's ~3% about 50; a p0 of 0.10 against the 0.15 floor needs ~560, more than the
default window, so it stays ``costs``. ``min_drafts`` guards what the bound assumes: drafts of one sequence are
correlated (one hard prompt), so a window must span a few requests' worth. The strict Z covers that
the watch looks after every step. Hysteresis: a bad state is left only when the LOWER bound clears its threshold,
so a window hovering at a threshold does not flap. Leaving a bad state is silent (state and gauges change, no log).
Rate limit: at most one line per bad verdict per episode (bad verdicts between two ``ok``), and at most one
line of each verdict per ``warn_interval_s`` (default 600 s) across episodes.

Cost: one ``observe`` per scheduler step in the API-server process, O(k) integer additions on counts vLLM computed
anyway (measured in tests/unit/test_watch.py: microseconds against a ~100+ ms step). Configured in the capture spec
YAML (``watch:`` mapping, :class:`WatchConfig`). Not covered: a bug that spares position 0 and breaks only the draft's
later steps (its acceptance length is reported against the expectation, but not judged).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from pydantic import Field, ValidationInfo, field_validator

from vllm_eagle3 import LOGGER
from vllm_eagle3 import verdicts
from vllm_eagle3.settings import Settings
from vllm_eagle3.spec import CaptureSpecError

# Under the ``vllm`` logger tree: vLLM configures a handler only for that tree (``DEFAULT_LOGGING_CONFIG`` in
# ``vllm/logger.py``), so this line appears in the server's log; a logger named after this module would print
# nothing there.
logger = logging.getLogger(f"{LOGGER}.watch")

Z = 3.29  # one-sided 99.95% normal quantile for the Wilson score bounds
EVAL_FILE = "eval.json"


class WatchConfig(Settings):
    """The ``watch:`` mapping of a capture spec: each key declared once, validated (:mod:`vllm_eagle3.settings`)."""

    section: ClassVar[str] = "watch"
    error: ClassVar[type[Exception]] = CaptureSpecError

    enabled: bool = Field(True, description="run the watch in the API server")
    window: int = Field(512, ge=16, description="drafts in the sliding window")
    min_drafts: int = Field(64, ge=1, description="drafts before anything is judged; at most `window`")
    floor: float = Field(
        verdicts.FLOOR,
        gt=0,
        lt=0.5,
        description=f"position-0 acceptance below which the verdict is {verdicts.WRONG} (below twice it "
        f"{verdicts.COSTS}) when the draft has no eval.json",
    )
    warn_interval_s: float = Field(600.0, ge=0, description="at least this long between two log lines")

    @field_validator("min_drafts")
    @classmethod
    def _within_window(cls, value: int, info: ValidationInfo) -> int:
        window = info.data.get("window")
        if window is not None and value > window:
            raise ValueError(f"more than window = {window}")
        return value


# ----------------------------------------------------------------------------------------------- expectation


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What served position-0 acceptance should be, where that was read, and the two cut-offs derived from it
    (named after the verdict the upper bound falling below them gives)."""

    position0: float | None  # None: no recorded evaluation, the floor alone decides
    acceptance_length: float | None  # at the served k
    source: str
    wrong_below: float
    costs_below: float
    per_position: tuple[float, ...] = ()  # every-anchor greedy rates (over-count easy anchors): a reference only
    label: str = ""  # short form of ``source`` for the log line

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.source)

    def as_dict(self) -> dict[str, Any]:
        return {
            "position0": _r(self.position0),
            "acceptance_length": _r(self.acceptance_length),
            "per_position_every_anchor": [_r(x) for x in self.per_position],
            "source": self.source,
            "wrong_below": _r(self.wrong_below),
            "costs_below": _r(self.costs_below),
        }


def _walk_rate(entry: Any) -> tuple[float, int] | None:
    if not isinstance(entry, Mapping):
        return None
    d, a = entry.get("drafts"), entry.get("accepted")
    if isinstance(d, (int, float)) and isinstance(a, (int, float)) and d > 0 and 0 <= a:
        return a / d, int(d)
    return None


def expectation_for(draft: str | Path | None, num_spec_tokens: int, cfg: WatchConfig) -> Expectation:
    """The expectation for a draft folder served with ``num_spec_tokens`` drafts (module docstring).

    A missing or unreadable ``eval.json`` is not an error: the floor applies and ``source`` says why.
    """

    def floor_exp(why: str) -> Expectation:
        return Expectation(None, None, f"{why}; documented floor {cfg.floor}", cfg.floor, min(2 * cfg.floor, 0.99))

    if draft is None:
        return floor_exp("no draft folder")
    path = Path(draft) / EVAL_FILE
    if not path.is_file():
        return floor_exp(f"no {EVAL_FILE} in the draft folder {draft}")
    try:
        sim = _get(json.loads(path.read_text()), "simulated_acceptance") or {}
    except (OSError, ValueError) as exc:
        return floor_exp(f"{path} unreadable ({type(exc).__name__})")
    # A rewired copy of a draft folder links the head's own evaluation: name the file really read.
    where = f"{path} (= {path.resolve()})" if path.resolve() != path.absolute() else str(path)
    walk = _get(sim, "served_walk") or {}
    pp = _get(sim, "greedy", "per_position_acceptance")
    pp = [float(x) for x in pp if isinstance(x, (int, float))] if isinstance(pp, list) else []
    first, at_k = _walk_rate(_get(walk, "1")), _walk_rate(_get(walk, str(num_spec_tokens)))
    if first is not None:
        p0, source = first[0], f"{where}: simulated_acceptance.served_walk k=1 ({first[1]} drafts)"
        label = "the draft's eval.json, served walk k=1"
    elif pp:
        p0, source = pp[0], f"{where}: simulated_acceptance.greedy.per_position_acceptance[0] (every-anchor)"
        label = "the draft's eval.json, every-anchor greedy"
    else:
        return floor_exp(f"{where} has no simulated_acceptance.served_walk or greedy.per_position_acceptance")
    if at_k is not None:
        length = 1.0 + at_k[0]
        source += f"; acceptance length from served_walk k={num_spec_tokens}"
    elif len(pp) >= num_spec_tokens:
        length = 1.0 + sum(pp[:num_spec_tokens])
    else:
        length = None
    if not 0 < p0 <= 1:
        return floor_exp(f"{where}: recorded position-0 acceptance {p0!r} is not in (0, 1]")
    return Expectation(
        p0, length, source, verdicts.COLLAPSE_RATIO * p0, verdicts.COSTS_RATIO * p0, tuple(pp[:num_spec_tokens]), label
    )


def _get(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...`` or None when any level is missing or not a mapping."""
    for k in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(k)
    return data


# ----------------------------------------------------------------------------------------------- window


def wilson_bounds(successes: float, n: float, z: float = Z) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (``(0, 1)`` for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


class AcceptanceWindow:
    """Sums of vLLM's per-step spec-decode counts over the most recent ``size`` drafts (whole steps)."""

    def __init__(self, size: int, num_positions: int) -> None:
        self.size = size
        self.steps: collections.deque[tuple[int, tuple[int, ...], tuple[int, ...]]] = collections.deque()
        self.drafts = 0
        self.accepted = [0] * num_positions
        self.drafted = [0] * num_positions  # drafts that reached position i (all of them under a fixed k)
        self.total_drafts = 0  # since start, for the report

    def add(self, drafts: int, accepted_per_pos: Sequence[int], drafted_per_pos: Sequence[int] | None = None) -> None:
        """One step's counts. ``drafted_per_pos[i]``: drafts of >= i + 1 tokens (vLLM's ``num_draft_tokens_per_pos``;
        None: all of them, a fixed k). Under k per batch size drafts differ in length, so the rate at position i is
        accepted over drafted there. Every counted draft has position 0 (vLLM counts no 0-token draft)."""
        if drafts <= 0:
            return
        per = tuple(int(x) for x in accepted_per_pos)
        made = tuple(int(x) for x in drafted_per_pos) if drafted_per_pos is not None else (drafts,) * len(per)
        n = max(len(per), len(made))
        if n > len(self.accepted):  # the engine reports more positions than configured: widen
            self.accepted.extend([0] * (n - len(self.accepted)))
            self.drafted.extend([0] * (n - len(self.drafted)))
        self.steps.append((drafts, per, made))
        self.drafts += drafts
        self.total_drafts += drafts
        for i, x in enumerate(per):
            self.accepted[i] += x
        for i, x in enumerate(made):
            self.drafted[i] += x
        while self.steps and self.drafts - self.steps[0][0] >= self.size:
            old_d, old_per, old_made = self.steps.popleft()
            self.drafts -= old_d
            for i, x in enumerate(old_per):
                self.accepted[i] -= x
            for i, x in enumerate(old_made):
                self.drafted[i] -= x

    def rates(self) -> list[float]:
        """Per position: accepted / drafted there (0.0 where no draft reached it in the window)."""
        if not self.drafts:
            return []
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted)]

    def acceptance_length(self) -> float | None:
        return 1.0 + sum(self.accepted) / self.drafts if self.drafts else None


# ----------------------------------------------------------------------------------------------- the watch


class WiringWatch:
    """Judges one engine's window after every step; logs on entering a bad state; reports a JSON-able snapshot.

    ``wiring``: what the API-server process resolved (:func:`vllm_eagle3.watch_vllm.wiring_info`); ``clock`` and
    ``log`` are injectable for tests.
    """

    def __init__(
        self,
        cfg: WatchConfig,
        expectation: Expectation,
        wiring: Mapping[str, Any],
        num_spec_tokens: int,
        doctor_command: str,
        engine_index: int = 0,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger = logger,
    ) -> None:
        self.cfg, self.expectation, self.wiring = cfg, expectation, dict(wiring)
        self.num_spec_tokens, self.doctor_command, self.engine_index = num_spec_tokens, doctor_command, engine_index
        self.window = AcceptanceWindow(cfg.window, num_spec_tokens)
        self.verdict = verdicts.PENDING
        self.bounds = (0.0, 1.0)
        self.clock, self.log = clock, log
        self._last_line_at: dict[verdicts.Verdict, float] = {}  # per verdict: a costs line never holds back a wrong one
        self.lines_logged = 0
        self.lines_suppressed = 0
        self.last_warning: str | None = None
        self._announced: set[verdicts.Verdict] = set()  # lines of the current bad episode (ok -> ... -> ok)

    def observe(
        self, num_drafts: int, accepted_per_pos: Sequence[int], draft_tokens_per_pos: Sequence[int] | None = None
    ) -> str:
        """One scheduler step's spec-decode counts (``SpecDecodingStats``; ``draft_tokens_per_pos`` where vLLM has
        it, see :meth:`AcceptanceWindow.add`); returns the verdict.

        At most one ``wrong`` and one ``costs`` line per bad episode, an episode ending when the verdict is ok
        again; the costs line waits until the lower bound rules ``wrong`` out, so a collapse in progress gives its
        wrong line alone; nothing is logged once ``wrong`` was announced, nor on recovery.
        """
        self.window.add(num_drafts, accepted_per_pos, draft_tokens_per_pos)
        self.verdict = self._judge()
        if self.verdict == verdicts.OK:
            self._announced.clear()
        elif self.verdict == verdicts.WRONG and verdicts.WRONG not in self._announced:
            self._announce(verdicts.WRONG)
        elif self.verdict == verdicts.COSTS and not self._announced and self.bounds[0] >= self.expectation.wrong_below:
            self._announce(verdicts.COSTS)
        return self.verdict

    def _judge(self) -> str:
        w = self.window
        if w.drafts < self.cfg.min_drafts:
            return self.verdict
        lo, hi = self.bounds = wilson_bounds(w.accepted[0] if w.accepted else 0, w.drafts)
        e = self.expectation
        new = verdicts.WRONG if hi < e.wrong_below else verdicts.COSTS if hi < e.costs_below else verdicts.OK
        # Hysteresis: leave a bad state only once the lower bound clears its threshold.
        if self.verdict == verdicts.WRONG and new != verdicts.WRONG and lo < e.wrong_below:
            new = verdicts.WRONG
        if self.verdict in (verdicts.COSTS, verdicts.WRONG) and new == verdicts.OK and lo < e.costs_below:
            new = verdicts.COSTS
        return new

    def _announce(self, verdict: verdicts.Verdict) -> None:
        self._announced.add(verdict)
        now = self.clock()
        last = self._last_line_at.get(verdict)
        if last is not None and now - last < self.cfg.warn_interval_s:
            self.lines_suppressed += 1
            return
        self._last_line_at[verdict] = now
        self.lines_logged += 1
        line = self.message(verdict)
        self.last_warning = line
        self.log.log(verdicts.entry(verdict).log_level, "%s", line)

    def message(self, verdict: verdicts.Verdict) -> str:
        w, e = self.window, self.expectation
        p0 = w.rates()[0] if w.drafts else float("nan")
        length = w.acceptance_length()
        expected = (
            f"{e.position0:.3f} expected ({e.label})"
            if e.position0 is not None
            else f"no recorded expectation ({e.label})"
        )
        exp_len = f" vs {e.acceptance_length:.2f} expected" if e.acceptance_length is not None else ""
        cut = e.wrong_below if verdict == verdicts.WRONG else e.costs_below
        how = "probably" if verdict == verdicts.WRONG else "perhaps"
        return (
            f"vllm-eagle3 wiring watch [engine {self.engine_index}]: {verdicts.heading(verdict)}: served EAGLE-3 "
            f"position-0 acceptance {p0:.3f} over the last {w.drafts} drafts (99.95% upper bound "
            f"{self.bounds[1]:.3f} < {verdict} threshold {cut:.3f}) vs {expected}; acceptance length "
            f"{length:.2f}{exp_len} at k={self.num_spec_tokens}. Serving taps {self.wiring.get('taps')} from "
            f"{self.wiring.get('source')}. The draft is {how} fed other hidden states than it was trained "
            f"on: run `{self.doctor_command}`"
        )

    def snapshot(self) -> dict[str, Any]:
        w = self.window
        return {
            "engine": self.engine_index,
            "verdict": self.verdict,
            "wiring": self.wiring,
            "window": {
                "drafts": w.drafts,
                "size": w.size,
                "drafts_since_start": w.total_drafts,
                "position0": _r(w.rates()[0]) if w.drafts else None,
                "position0_bounds": [_r(b) for b in self.bounds] if w.drafts >= self.cfg.min_drafts else None,
                "per_position": [_r(x) for x in w.rates()],
                "acceptance_length": _r(w.acceptance_length()),
            },
            "expected": {**self.expectation.as_dict(), "num_spec_tokens": self.num_spec_tokens},
            "config": self.cfg.model_dump(),
            "doctor": self.doctor_command,
            "lines_logged": self.lines_logged,
            "lines_suppressed": self.lines_suppressed,
            "last_warning": self.last_warning,
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


# ----------------------------------------------------------------------------------------------- process registry

_WATCHES: dict[int, WiringWatch] = {}


def register_watch(watch: WiringWatch) -> None:
    _WATCHES[watch.engine_index] = watch


def unregister_watch(watch: WiringWatch) -> None:
    if _WATCHES.get(watch.engine_index) is watch:
        del _WATCHES[watch.engine_index]


def active_watches() -> list[WiringWatch]:
    return [_WATCHES[i] for i in sorted(_WATCHES)]


def report(check: Mapping[str, Any] | None = None, live_k: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of ``GET /v1/eagle3/wiring``: ONE verdict (:func:`vllm_eagle3.verdicts.overall` of every judge
    on every engine), what each judge says, then each judge's evidence: ``engines`` (the watch: acceptance vs
    expectation, per engine) and ``check`` (the online check's reports by engine: the candidates' scores); and
    ``live_k`` (:mod:`vllm_eagle3.live_k`'s table and measurements; null when it is off)."""
    engines = [w.snapshot() for w in active_watches()]
    check = dict(check or {})
    judges = {
        "watch": verdicts.overall(e["verdict"] for e in engines),
        "check": verdicts.overall(r.get("verdict", verdicts.OFF) for r in check.values()),
    }
    verdict = verdicts.overall(judges.values())
    return {
        "verdict": verdict,
        "meaning": verdicts.entry(verdict).meaning,
        "judges": judges,
        "active": bool(engines),
        "engines": engines,
        "check": check,
        "live_k": dict(live_k) if live_k else None,
        "verdicts": verdicts.as_json(),
    }


# ------------------------------------------------------------------------------------------ the endpoint plugin's name

ENDPOINT_PLUGIN = "vllm_eagle3_wiring"
"""The entry point of ``GET /v1/eagle3/wiring`` (pyproject ``vllm.endpoint_plugins``)."""
