"""Online wiring check: is the wiring being served the best one, judged on live traffic? Config and statistics.

Data flow position: beside the proposer, inside the serving engine. target forward -> taps (the configured ones
feed the draft as always; on a check-enabled server the target also keeps the taps of the candidate wirings,
:func:`vllm_eagle3.wirings.online_candidates`) -> on a sample of requests the worker records every confirmed
position and scores the draft's FIRST step on each candidate wiring against the token the target actually
produced (:mod:`vllm_eagle3.online`) -> **this module's** :class:`Judge` -> verdict (a word of
:mod:`vllm_eagle3.verdicts`, shared with the watch and the doctor): one WARNING line from the engine,
``GET /v1/eagle3/wiring`` (``check``), ``vllm_eagle3_wiring_check_*`` gauges.

Why: the wiring watch (:mod:`vllm_eagle3.watch`) catches a collapse, but an EAGLE-3.1 ``fc_norm`` head fed the
incident's taps [3, 31, 59] keeps an acceptance length of ~1.3-1.5 instead of ~2.7-3.4: half the gain lost, no
collapse, and a hub head has no ``eval.json`` to compare with. Comparing wirings with each other on the same
positions needs no expectation at all.

What is scored. A tracked request contributes its anchors: positions i whose label (the token at i + 2) was
produced by the target. At anchor i the draft reads the target's taps at i (in the candidate's order) and the token
at i + 1, and predicts i + 2: exactly the first draft step vLLM's proposer runs, so a match is a first-position
acceptance of greedy verification. Only requests sampled at ``temperature <= max_temperature`` are tracked: their
label is (nearly) the target's argmax, so sampled traffic raises no alarm; hotter requests are not looked at.

The test, per candidate c against the configured wiring 0, on per-request sums (a request is the independent
unit: neighbouring anchors of one request are correlated, so the test clusters by request, never by anchor):
``d_r = a * m_c,r - m_0,r`` with ``m`` = matches of request r. ``mean(d) > 0`` means ``M_0 < a * M_c``:

- ``costs``: ``a = 1 - TOLERANCE`` (the configured wiring's first-draft acceptance is more than 2 % below c's);
- ``wrong``: ``a = COLLAPSE_RATIO`` (under a quarter of c's: the incident);
- ``ok``: the reverse test ``m_0,r - (1 - TOLERANCE) * m_c,r > 0`` passes for EVERY candidate;
- ``pending`` before ``min_requests`` scored requests, ``undecided`` when none of the above passes yet.
(``TOLERANCE`` and ``COLLAPSE_RATIO``: :mod:`vllm_eagle3.verdicts`, the doctor's and the watch's too.)

Each is a one-sided t-test of the cluster sums (``t = sum d / sqrt(R / (R - 1) * sum (d - mean)^2)``, Student
quantile by its Cornish-Fisher expansion), run after every scored request once ``min_requests`` have been scored.
False alarms are bounded by spending ``false_alarm`` over candidates (Bonferroni) and over looks: look j gets
``false_alarm * 6 / (pi^2 j^2)``, a series summing to ``false_alarm``, so the probability that a server whose
configured wiring is within tolerance of every candidate EVER says costs or wrong is at most ``false_alarm``
(default 0.001), however long it runs. The price is a slowly growing threshold (t > 4.6 at look 10, > 5.3 at look
1,000 for 12 candidates): the incident (first-draft acceptance ~0.2 vs ~0.7) is decided at the first look, a 5 %
loss takes a few hundred requests. The verdict never decides from anchors of one request alone.

Acceptance terms: reported per wiring as first-draft acceptance ``p0 = M / anchors`` and, under the geometric
approximation of a chain (each further draft accepted with the same p0), acceptance length
``AL(k) = 1 + p0 + ... + p0^k`` at the served k.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from statistics import NormalDist
from typing import Any, ClassVar, Mapping, Sequence

from pydantic import Field

from vllm_eagle3 import envs
from vllm_eagle3.settings import Settings
from vllm_eagle3.spec import CaptureSpecError, taps_label
from vllm_eagle3.verdicts import COLLAPSE_RATIO, COSTS, OK, PENDING, TOLERANCE, UNDECIDED, WRONG, Verdict


class CheckConfig(Settings):
    """The ``check:`` mapping of a capture spec: each key declared once, validated (:mod:`vllm_eagle3.settings`)."""

    section: ClassVar[str] = "check"
    error: ClassVar[type[Exception]] = CaptureSpecError

    enabled: bool = Field(True, description="score candidate wirings on a sample of live requests inside the engine")
    sample_every: int = Field(4, ge=1, description="track one in this many eligible requests")
    max_temperature: float = Field(0.3, ge=0, description="requests sampled hotter are not tracked")
    max_positions: int = Field(
        2048, ge=32, description="positions recorded per tracked request; it is scored when it ends or reaches that"
    )
    max_followed: int = Field(
        4,
        ge=1,
        description="requests followed at the same time (memory: each holds its positions x candidate taps x hidden "
        "size in the served dtype)",
    )
    budget: float = Field(
        0.02,
        gt=0,
        le=0.5,
        description="at most this fraction of the engine's time goes to the check; no new request is tracked while "
        "it is spent",
    )
    false_alarm: float = Field(
        0.001,
        gt=0,
        lt=0.1,
        description=f"probability that a server with a right wiring ever reports {COSTS} or {WRONG}",
    )
    min_requests: int = Field(12, ge=8, description="scored requests before any verdict")
    warn_interval_s: float = Field(600.0, ge=0, description="at least this long between two WARNING lines")


# ----------------------------------------------------------------------------------------------- statistics


def t_quantile(p_upper: float, df: int) -> float:
    """Student-t quantile with upper tail ``p_upper`` (Cornish-Fisher expansion to 1/df^2 around the normal one:
    within 1 % of the exact value for df >= 10 and tails down to 1e-8, conservative below that)."""
    z = NormalDist().inv_cdf(1.0 - p_upper)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    return z + g1 / df + g2 / df**2


def geometric_length(p0: float, k: int) -> float:
    """Acceptance length at ``k`` drafts if every draft position were accepted with ``p0``: 1 + p0 + ... + p0^k."""
    return sum(p0**i for i in range(k + 1))


class _Sums:
    """Running sums of one candidate's per-request matches, paired with the configured wiring's."""

    __slots__ = ("m", "mm", "m0")

    def __init__(self) -> None:
        self.m = self.mm = self.m0 = 0.0  # sum m_c, sum m_c^2, sum m_c * m_0


@dataclasses.dataclass(frozen=True)
class CheckReading:
    """The check's verdict after one scored request, with the numbers behind it."""

    kind: Verdict  # pending | undecided | ok | costs | wrong
    requests: int
    anchors: int
    looks: int
    threshold: float  # the t a test had to pass at the last look
    p0: tuple[float, ...]  # per candidate, candidate 0 = configured
    best: int  # index of the candidate with the most matches
    flagged: int | None  # the candidate the costs/wrong test rejected against (the best such), else None
    loss: float  # point estimate of 1 - M_0 / M_flagged (or / M_best)
    t_costs: tuple[float, ...]
    t_ok: tuple[float, ...]


class Judge:
    """Accumulates scored requests (per candidate matches + anchors) and decides, after each one, the verdict."""

    def __init__(self, candidates: Sequence[Sequence[int]], cfg: CheckConfig | None = None) -> None:
        if len(candidates) < 2:
            raise ValueError("a wiring check needs the configured wiring and at least one other candidate")
        self.cfg = cfg or CheckConfig()
        self.taps = [tuple(c) for c in candidates]
        self.sums = [_Sums() for _ in candidates]
        self.requests = 0
        self.anchors = 0
        self.m0m0 = 0.0
        self.looks = 0
        self.verdict = CheckReading(PENDING, 0, 0, 0, math.inf, (0.0,) * len(candidates), 0, None, 0.0, (), ())

    def add(self, anchors: int, matches: Sequence[int]) -> CheckReading:
        """One scored request: its anchor count and each candidate's matches (candidate order). Returns the verdict."""
        if len(matches) != len(self.sums):
            raise ValueError(f"{len(matches)} match counts for {len(self.sums)} candidates")
        if anchors <= 0:
            return self.verdict
        m0 = float(matches[0])
        for s, m in zip(self.sums, matches):
            s.m += m
            s.mm += float(m) * m
            s.m0 += float(m) * m0
        self.m0m0 += m0 * m0
        self.requests += 1
        self.anchors += anchors
        self.verdict = self._decide()
        return self.verdict

    def _t(self, c: int, a: float, b: float) -> float:
        """t statistic of the per-request sums d_r = a * m_c,r - b * m_0,r (0 when they do not vary)."""
        s, r = self.sums[c], self.requests
        total = a * s.m - b * self.sums[0].m
        sq = a * a * s.mm - 2 * a * b * s.m0 + b * b * self.m0m0  # sum d_r^2
        var = sq - total * total / r
        if var <= 1e-12:
            return math.inf if total > 0 else (-math.inf if total < 0 else 0.0)
        return total / math.sqrt(r / (r - 1) * var)

    def _decide(self) -> CheckReading:
        n, r = len(self.sums), self.requests
        p0 = tuple(s.m / self.anchors for s in self.sums)
        best = max(range(n), key=lambda c: (self.sums[c].m, -c))
        if r < self.cfg.min_requests:
            return CheckReading(PENDING, r, self.anchors, self.looks, math.inf, p0, best, None, 0.0, (), ())
        self.looks += 1
        level = self.cfg.false_alarm * 6 / (math.pi**2 * self.looks**2) / (n - 1)
        thr = t_quantile(level, r - 1)
        others = range(1, n)
        t_wrong = [self._t(c, COLLAPSE_RATIO, 1.0) for c in others]
        t_costs = [self._t(c, 1.0 - TOLERANCE, 1.0) for c in others]
        t_ok = [self._t(c, -(1.0 - TOLERANCE), -1.0) for c in others]  # m_0 - (1 - tol) m_c
        kind, flagged = UNDECIDED, None
        for name, ts in ((WRONG, t_wrong), (COSTS, t_costs)):
            hits = [c for c, t in zip(others, ts) if t > thr]
            if hits:
                kind, flagged = name, max(hits, key=lambda c: self.sums[c].m)
                break
        if kind == UNDECIDED and all(t > thr for t in t_ok):
            kind = OK
        ref = flagged if flagged is not None else best
        loss = 1.0 - self.sums[0].m / self.sums[ref].m if self.sums[ref].m > 0 else 0.0
        return CheckReading(
            kind, r, self.anchors, self.looks, thr, p0, best, flagged, loss, tuple(t_costs), tuple(t_ok)
        )

    def report(self, whys: Sequence[str], k: int) -> dict[str, Any]:
        """The verdict as JSON-ready data (what the engine writes for the API server's endpoint and gauges)."""
        v = self.verdict

        def wiring(c: int) -> dict[str, Any]:
            return {
                "taps": taps_label(self.taps[c]),
                "why": whys[c],
                "position0": round(v.p0[c], 4),
                "acceptance_length_geometric": round(geometric_length(v.p0[c], k), 3),
            }

        return {
            "verdict": v.kind,
            "requests": v.requests,
            "anchors": v.anchors,
            "looks": v.looks,
            "t_threshold": None if math.isinf(v.threshold) else round(v.threshold, 2),
            "configured": wiring(0),
            "best": wiring(v.best),
            "better": wiring(v.flagged) if v.flagged is not None else None,
            "loss": round(v.loss, 4),
            "tolerance": TOLERANCE,
            "collapse_ratio": COLLAPSE_RATIO,
            "false_alarm": self.cfg.false_alarm,
            "num_speculative_tokens": k,
            "candidates": [wiring(c) for c in range(len(self.taps))],
        }


# ----------------------------------------------------------------------------------------------- reports


def report_file(name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """``$EAGLE3_CHECK_DIR/<name>``: the folder where the engine's processes leave reports for the API server (the
    online check's, live k's); None when it is not set."""
    folder = envs.get(envs.CHECK_DIR, environ)
    return Path(folder) / name if folder else None


def write_report_file(path: Path, data: Any) -> None:
    """Replace ``path`` whole (through a file of this process's), so a reader never sees half a report."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def read_report_file(path: Path) -> Any | None:
    """A report's content, or None when it is absent or being replaced right now (the next read has it)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def report_path(engine_index: int, environ: Mapping[str, str] | None = None) -> Path | None:
    """Where engine ``engine_index``'s check writes its verdict: ``$EAGLE3_CHECK_DIR/engine<i>.json``."""
    return report_file(f"engine{engine_index}.json", environ)


def read_reports(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every engine's latest check report, by engine index (the API server's view; empty before the first step)."""
    folder = envs.get(envs.CHECK_DIR, environ)
    out: dict[str, Any] = {}
    if not folder or not Path(folder).is_dir():
        return out
    for f in sorted(Path(folder).glob("engine*.json")):
        report = read_report_file(f)
        if report is not None:
            out[f.stem.removeprefix("engine")] = report
    return out
