"""One verdict vocabulary (vllm_eagle3/verdicts.py) for the doctor, the wiring watch and the online wiring check.

The bug it guards: three judges of one question, each with its own words and its own copy of the thresholds. On the
fc_norm MLA head served with the incident's wiring the watch logged INFO "suspiciously low", the check WARNING
"COSTS 63 %" and the endpoint said "suspicious"; COLLAPSE_RATIO = 0.25 was written three times, TOLERANCE twice, so
a change to one judge's cut silently left the others behind. Here: every threshold and verdict word is defined once
(a grep of the package), and one synthetic wrong wiring, fed to each judge's real code, reads the same word in the
watch's line, the check's line, the doctor's line, the endpoint and the gauges.
"""

from __future__ import annotations

import ast
import json
import logging
import random
from pathlib import Path

import pytest
import torch

from vllm_eagle3 import verdicts

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_eagle3"
HOME = PACKAGE / "verdicts.py"
THRESHOLDS = {"TOLERANCE", "COLLAPSE_RATIO", "COSTS_RATIO", "SUSPICIOUS_RATIO", "MIN_GAIN", "FLOOR", "VERDICT_LEVEL"}
RETIRED = {"collapsed", "suspicious", "inactive", "cannot tell"}  # the judges' own words before the shared ones
JUDGES = [
    PACKAGE / "watch.py",
    PACKAGE / "watch_vllm.py",
    PACKAGE / "wiring_check.py",
    *sorted((PACKAGE / "online").glob("*.py")),
    *sorted((PACKAGE / "tools" / "doctor").glob("*.py")),
]


def assigned_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    names.add(n.id)
    return names


def test_each_threshold_is_defined_once_in_the_verdicts_module():
    """Guards: a second copy of a threshold drifting from the first. No module of the package but verdicts.py
    assigns a threshold's name (importing it is how the judges use it)."""
    defined = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in assigned_names(ast.parse(path.read_text())) & THRESHOLDS:
            defined.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    assert {n: p for n, p in defined.items() if p != ["verdicts.py"]} == {}, (
        "define each threshold once, in vllm_eagle3/verdicts.py, and import it"
    )
    assert set(defined) == THRESHOLDS - {"SUSPICIOUS_RATIO", "VERDICT_LEVEL"}


def string_constants(tree: ast.AST) -> list[str]:
    """String literals that are not docstrings."""
    docs = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        ):
            docs.add(id(node.body[0].value))
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_each_verdict_word_is_defined_once_in_the_verdicts_module():
    """Guards: a judge spelling a verdict itself (and the next one spelling it differently). No judge module holds
    a verdict word, in any case, nor a retired word, as a string literal: they name verdicts by the constants of
    vllm_eagle3.verdicts."""
    words = {w.word for w in verdicts.VOCABULARY} | RETIRED
    found = [
        (str(path.relative_to(PACKAGE)), s)
        for path in JUDGES
        for s in string_constants(ast.parse(path.read_text()))
        if s.strip().lower() in words
    ]
    assert found == [], "use vllm_eagle3.verdicts' constants (OK, COSTS, WRONG, ...) instead of literals"
    homes = [
        p.relative_to(PACKAGE)
        for p in PACKAGE.rglob("*.py")
        if any(
            isinstance(n, ast.ClassDef) and n.name in ("Verdict", "VerdictWord")
            for n in ast.walk(ast.parse(p.read_text()))
        )
    ]
    assert [str(h) for h in homes] == ["verdicts.py"]


def test_vocabulary_is_ordered_and_each_word_says_how_it_is_logged():
    """Guards: a gauge or a combination rule reading levels in another order than the words' severity."""
    levels = [w.level for w in verdicts.VOCABULARY]
    assert levels == sorted(set(levels)), "one level per word, in the vocabulary's order"
    assert verdicts.level(verdicts.OK) == 0 and verdicts.level(verdicts.COSTS) < verdicts.level(verdicts.WRONG)
    assert all(w.meaning and w.log_level in (logging.NOTSET, logging.WARNING) for w in verdicts.VOCABULARY)
    assert verdicts.ALARMS == {verdicts.COSTS, verdicts.WRONG, verdicts.NO_WIRING_WORKS}
    assert (
        verdicts.overall([verdicts.UNDECIDED, verdicts.OK, verdicts.PENDING]) == verdicts.OK
    )  # a decision outranks none
    assert verdicts.overall([verdicts.OK, verdicts.COSTS]) == verdicts.COSTS and verdicts.overall([]) == verdicts.OFF
    assert (
        verdicts.worst([verdicts.OK, verdicts.UNDECIDED]) == verdicts.UNDECIDED
    )  # a config is ok only if every reading is
    with pytest.raises(ValueError, match="is not a verdict word; use one of off, pending"):
        verdicts.entry("collapsed")


# ----------------------------------------------------------------------------------------------- one wrong wiring

INCIDENT, RIGHT = (3, 31, 59), (0, 3, 31)  # served / trained taps (0 = embed)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def watch_on_wrong_wiring():
    from vllm_eagle3 import watch as W

    log = logging.getLogger(f"test_verdicts.watch.{random.random()}")
    log.propagate, lines = False, Lines()
    log.addHandler(lines)
    e = W.Expectation(0.8, 3.0, "test", verdicts.COLLAPSE_RATIO * 0.8, verdicts.COSTS_RATIO * 0.8)
    w = W.WiringWatch(W.WatchConfig(), e, {"taps": "[3, 31, 59]", "source": "test"}, 3, "doctor", log=log)
    rng = random.Random(0)
    for _ in range(64):  # 512 drafts, the first token accepted 3 % of the time
        first = sum(rng.random() < 0.03 for _ in range(8))
        w.observe(8, [first, 0, 0])
    return w, lines.records


def check_on_wrong_wiring():
    """The online check's Checker (engine side) on per-request match counts of the incident: ~10 % first-draft
    acceptance on the served taps, ~70 % on the trained ones."""
    from vllm_eagle3.online.plan import CheckPlan
    from vllm_eagle3.online import engine_hook
    from vllm_eagle3.wiring_check import CheckConfig
    from vllm_eagle3.wirings import Candidate

    plan = CheckPlan(CheckConfig(), (Candidate(INCIDENT, "configured"), Candidate(RIGHT, "embed prepended")))
    checker = engine_hook.Checker(plan, None, 0, 3, 61, None)
    rng = random.Random(1)
    for _ in range(40):
        n = rng.randint(40, 80)
        checker.judge.add(n, [sum(rng.random() < 0.1 for _ in range(n)), sum(rng.random() < 0.7 for _ in range(n))])
    return checker


def doctor_on_wrong_wiring():
    from vllm_eagle3.tools.doctor import cli, stats

    g = torch.Generator().manual_seed(2)

    def chains(taps, p):
        return stats.WiringChains.from_matches(taps, str(list(taps)), "test", torch.rand(24, 60, 5, generator=g) < p, 3)

    v = stats.judge(chains(INCIDENT, 0.05), [chains(RIGHT, 0.7)])
    return v, cli.verdict_line("--taps 3,31,59", v, 3, 24 * 64)


def test_one_wrong_wiring_reads_the_same_word_everywhere(monkeypatch):
    """Guards: three words for one wrong wiring. Each judge's real code on the incident says ``wrong``; the watch's
    and the check's log lines lead with WRONG at the word's log level (and match the alarm pattern a soak looks
    for), the doctor's line leads with WRONG, and the endpoint and every gauge show the same word's level."""
    from vllm_eagle3 import watch as W
    from vllm_eagle3 import watch_vllm

    watch, records = watch_on_wrong_wiring()
    assert watch.verdict == verdicts.WRONG
    assert [r.levelno for r in records] == [verdicts.entry(verdicts.WRONG).log_level]
    watch_line = records[0].getMessage()
    assert watch_line.startswith("vllm-eagle3 wiring watch [engine 0]: WRONG: ") and verdicts.ALARM_LINE.search(
        watch_line
    )

    checker = check_on_wrong_wiring()
    assert checker.judge.verdict.kind == verdicts.WRONG
    check_line = checker.warning_line()
    assert check_line.startswith("vllm-eagle3 wiring check [engine 0]: WRONG: ") and verdicts.ALARM_LINE.search(
        check_line
    )
    report = checker.status()

    verdict, doctor_line = doctor_on_wrong_wiring()
    assert verdict.kind == verdicts.WRONG and doctor_line.startswith("WRONG  --taps 3,31,59: [3, 31, 59]")

    W.register_watch(watch)
    monkeypatch.setattr(watch_vllm, "read_reports", lambda: {"0": json.loads(json.dumps(report))})
    try:
        body = W.report({"0": report})
        gauges = {m.name: [s.value for s in m.samples] for m in watch_vllm.WiringCollector().collect()}
    finally:
        W.unregister_watch(watch)
    assert body["verdict"] == verdicts.WRONG and body["judges"] == {"watch": verdicts.WRONG, "check": verdicts.WRONG}
    assert body["engines"][0]["verdict"] == verdicts.WRONG and body["check"]["0"]["verdict"] == verdicts.WRONG
    for name in ("vllm_eagle3_wiring_verdict", "vllm_eagle3_wiring_watch_verdict", "vllm_eagle3_wiring_check_verdict"):
        assert gauges[name] == [verdicts.level(verdicts.WRONG)], (name, gauges[name])


def test_the_docs_table_is_the_vocabulary():
    """Guards: docs that describe words or levels the code no longer has. docs/wiring-watch.md's verdict table has
    one row per word of vllm_eagle3/verdicts.py, with its level, meaning and log level, in order."""
    doc = (PACKAGE.parent / "docs" / "wiring-watch.md").read_text()
    table = doc.split("<!-- VERDICTS:", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    want = [
        f"| `{w.word}` | {w.level} | {w.meaning} | {logging.getLevelName(w.log_level) if w.log_level else 'no line'} |"
        for w in verdicts.VOCABULARY
    ]
    assert rows == want, "re-render the table in docs/wiring-watch.md from vllm_eagle3/verdicts.py"


def test_the_soak_counts_the_alarm_lines_of_a_real_server_log():
    """The soak looked for 'EAGLE-3 acceptance COLLAPSED', a line the watch no longer writes: a wrong wiring during a
    soak would have passed unnoticed. The lines of a real served wrong wiring (docs/wiring_watch_example.txt, written
    by tests/e2e/test_wiring_watch.py) must be found, and none in the healthy lines around them."""
    from vllm_eagle3.tools.soak import wiring_alarms

    text = (Path(__file__).resolve().parents[2] / "docs" / "wiring_watch_example.txt").read_text()
    alarms = wiring_alarms(text)
    assert len(alarms) == sum("WARNING" in ln and ": WRONG: " in ln for ln in text.splitlines()) >= 2, alarms
    assert wiring_alarms("INFO vllm-eagle3 wiring watch [engine 0]: ok: served acceptance 0.7") == []
