"""One vocabulary for the three judges of "is the draft fed the wiring it was trained on?", and their thresholds.

Data flow position: beside the judges, below all of them. The doctor (offline, :mod:`vllm_eagle3.tools.doctor`),
the wiring watch (API server, :mod:`vllm_eagle3.watch`: served acceptance against the draft's expectation) and the
online wiring check (worker, :mod:`vllm_eagle3.wiring_check`: the served wiring against its near misses) measure
different statistics; each maps its statistic onto one :class:`Verdict`, so one wrong wiring reads ``wrong`` in the
check's log line, the watch's log line, the doctor's report, ``GET /v1/eagle3/wiring`` and the gauges. Words are
lower case in data (JSON, gauges, constants) and upper case where a line leads with them (:func:`heading`).
Standard library only: vLLM loads this in every process.
"""

from __future__ import annotations

import enum
import logging
import re
from typing import Iterable

TOLERANCE = 0.02
"""``costs`` when the served wiring loses more than 2 % of another wiring's acceptance (doctor: acceptance length;
check: first-draft acceptance). Tokens per target forward are proportional to acceptance length, so this bounds the
throughput lost to the wiring at ~2 %: below what a serving benchmark resolves on this project (95 % intervals of
+-10-20 %, BENCHMARKS.md) and below the spread between a head's own +-1-layer neighbours (0.3-2 points of
position-0 acceptance on the shipped miniature's heads), which are not worth a config change."""

COLLAPSE_RATIO = 0.25
"""``wrong`` when the served wiring keeps less than a quarter of what it should: of the best wiring's speculative
gain AL - 1 (doctor), of the best candidate's first-draft acceptance (check), of the expected position-0 acceptance
(watch). At k = 3 on a draft at AL 2.2 that is < 0.3 extra tokens per forward, where speculation no longer pays for
drafting; a head trained on [embed, 3, 31] and served [3, 31, 59] keeps ~0-3 %."""

COSTS_RATIO = 0.5
"""The watch's ``costs``: served position-0 acceptance below half the expectation. The watch compares live traffic
with an offline greedy evaluation, which real traffic legitimately serves below (sampling, other text: the
miniature's teacher-forced p0 on plain text is 0.59 of its 0.86 greedy), so it cannot resolve :data:`TOLERANCE`;
only a fall to half is a cost it can stand behind."""

FLOOR = 0.15
"""The watch's expectation when the draft has no ``eval.json`` (capture spec ``watch.floor``): working heads serve
position-0 acceptance 0.45-0.86, wrong wirings 0.00-0.10; ``wrong`` below the floor, ``costs`` below twice it."""

MIN_GAIN = 0.1
"""``no wiring works`` (doctor): even the best wiring accepts under 0.1 drafts per target forward; the head is the
problem, not the wiring."""


class Verdict(enum.StrEnum):
    """The one verdict type of the three judges, in order of severity: each member is its word (what JSON, log
    lines and the endpoint carry; a ``StrEnum`` so ``json.dumps`` and ``==`` on a word read from a report need no
    conversion), with its severity ``level`` (the gauges' value), its ``meaning`` and the ``log_level`` of the one
    line a judge writes on reaching it (``logging.NOTSET``: no line)."""

    level: int
    meaning: str
    log_level: int

    def __new__(cls, word: str, level: int, meaning: str, log_level: int = logging.NOTSET) -> "Verdict":
        if word != word.lower() or not word:
            raise ValueError(f"verdict word {word!r} must be non-empty lower case (heading() shouts it)")
        member = str.__new__(cls, word)
        member._value_ = word
        member.level, member.meaning, member.log_level = level, meaning, log_level
        return member

    @property
    def word(self) -> str:
        return self.value

    OFF = (
        "off",
        -3,
        "the judge is not running: disabled in the capture spec, or stopped after an internal "
        "error (serving is not affected)",
    )
    PENDING = (
        "pending",
        -2,
        "too little evidence yet: fewer drafts, requests or sequences than the judge's minimum; nothing is judged",
    )
    UNDECIDED = ("undecided", -1, "judged, and the evidence decides neither way yet: more traffic or text will")
    OK = (
        "ok",
        0,
        "the served wiring gets the acceptance it should: within the tolerance of the best "
        "wiring (check, doctor), not below the expectation's costs cut (watch)",
    )
    COSTS = (
        "costs",
        1,
        f"the served wiring loses acceptance: more than {TOLERANCE:.0%} below another wiring "
        f"(check, doctor), under {COSTS_RATIO:g} x the expectation (watch); a better wiring "
        "is named where one was measured",
        logging.WARNING,
    )
    WRONG = (
        "wrong",
        2,
        f"the draft is not fed the wiring it was trained on: it keeps under {COLLAPSE_RATIO:g} "
        "of the acceptance it should reach (e.g. taps [3, 31, 59] for a head trained on "
        "[embed, 3, 31])",
        logging.WARNING,
    )
    NO_WIRING_WORKS = (
        "no wiring works",
        3,
        f"even the best wiring gains under {MIN_GAIN:g} accepted drafts per "
        "target forward: the head is untrained or for another target (doctor)",
        logging.WARNING,
    )


VOCABULARY = tuple(Verdict)
BY_WORD = {v.word: v for v in VOCABULARY}
OFF, PENDING, UNDECIDED, OK, COSTS, WRONG, NO_WIRING_WORKS = VOCABULARY
ALARMS = frozenset(v for v in VOCABULARY if v.log_level >= logging.WARNING)
"""Verdicts a judge reports with a WARNING line."""

ALARM_LINE = re.compile(
    r"vllm-eagle3 wiring (?:watch|check) \[engine \d+\]: (?:%s)\b"
    % "|".join(re.escape(w.upper()) for w in sorted(ALARMS))
)
"""Matches the WARNING line of the watch or the online check (what a soak or a log alert looks for)."""


def entry(word: str) -> Verdict:
    """The verdict of ``word`` (a member or a word read from a report); an unknown word is a bug in a judge, said
    with the known ones."""
    try:
        return BY_WORD[word]
    except KeyError:
        raise ValueError(
            f"{word!r} is not a verdict word; use one of {', '.join(BY_WORD)} (vllm_eagle3.verdicts)"
        ) from None


def level(word: str) -> int:
    return entry(word).level


def heading(word: str, loss: float | None = None) -> str:
    """How a line leads with a verdict: ``WRONG``, ``COSTS 63.0%`` (``loss``: the share of acceptance lost)."""
    head = entry(word).word.upper()
    return f"{head} {loss:.1%}" if word == COSTS and loss is not None else head


def overall(words: Iterable[str]) -> Verdict:
    """One wiring seen by several judges (or engines): the most severe decision any of them reached; when none
    decided (off, pending, undecided), the most advanced of those; ``off`` when there is nothing to combine."""
    return max(map(entry, words), key=lambda v: v.level, default=OFF)


def worst(words: Iterable[str]) -> Verdict:
    """Several wirings, each judged once (the doctor's readings of one config): the most severe, where a wiring
    not shown ``ok`` (undecided, pending) outranks ``ok``: the config is ok only if every reading is."""
    return max(map(entry, words), key=lambda v: (v.level > 0, v != OK, v.level), default=UNDECIDED)


def levels_help() -> str:
    """The gauges' value legend: ``-3 off, -2 pending, ...``."""
    return ", ".join(f"{v.level} {v.word}" for v in VOCABULARY)


def as_json() -> list[dict]:
    """The vocabulary as the endpoint shows it."""
    return [
        {
            "verdict": v.word,
            "level": v.level,
            "meaning": v.meaning,
            "logged_at": logging.getLevelName(v.log_level) if v.log_level else None,
        }
        for v in VOCABULARY
    ]
