"""The speed numbers the documents quote come from the benchmark's results file, not from memory.

Guards the bug of issue 12: BENCHMARKS.md and README.md quoted speedups that no results file backed (a finding
edited by hand after the run, a README number from an older run or an older harness). BENCHMARKS.md is generated:
it must be exactly ``vllm-eagle3 bench --from-json bench/results.json``'s rendering of the committed results file
(and of the last soak, ``bench/soak.json``, and the last adaptive-k run, ``bench/adaptive/results.json``);
its template may quote no measured number; every speed number README.md quotes (``1.23x``, ``45.6 tok/s``) must be
one the results file gives. Reads files only; no engine.
"""

import json
import re

import pytest

from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.bench import report
from vllm_eagle3.tools.bench.cli import DOCS, repo_adaptive_runs
from vllm_eagle3.tools.bench.analysis import summarize

pytestmark = pytest.mark.unit

RESULTS = REPO / DOCS["json"]
FIX = "run `vllm-eagle3 bench --repo-page` (or the benchmark itself: make bench BENCH_ARGS=--publish)"
SPEEDUP = re.compile(r"(?<![\w.])(\d+\.\d+)x\b")
TOK_S = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) tok/s")
# Numbers the template may quote because they are not this benchmark's: the incident's own report
# (docs/conventions.md, The incident: 56.8 tok/s with speculation vs 90 without).
NOT_OURS = {"56.8", "90"}


def _results():
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else None


def test_benchmarks_md_is_the_rendering_of_the_results_file():
    """Any number in BENCHMARKS.md that differs from the results file (hand edit, stale run) fails here."""
    from vllm_eagle3.tools.bench.report_soak import soak_block

    expected = report.render(
        _results(),
        DOCS["png"],
        soak=soak_block(report.load_json(REPO / DOCS["soak"])),
        adaptive_runs=repo_adaptive_runs(),
    )
    actual = (REPO / "BENCHMARKS.md").read_text()
    if actual != expected:
        for i, (a, b) in enumerate(zip(actual.splitlines(), expected.splitlines()), 1):
            if a != b:
                pytest.fail(
                    f"BENCHMARKS.md line {i} differs from the rendering of {RESULTS.name}:\n  file:     {a}\n"
                    f"  rendered: {b}\n{FIX}"
                )
        pytest.fail(f"BENCHMARKS.md and the rendering of {RESULTS.name} differ in length; {FIX}")


def test_template_quotes_no_measured_number():
    """Prose is written once in the template; a measured number typed there would never be re-rendered."""
    text = report.TEMPLATE.read_text()
    quoted = {m.group(1) for rx in (SPEEDUP, TOK_S) for m in rx.finditer(text)} - NOT_OURS
    assert not quoted, f"{report.TEMPLATE} quotes measured-looking numbers {sorted(quoted)}: put them in a slot"


def _speeds(data) -> tuple[set[str], set[str]]:
    """Speedups (2 decimals) and tok/s (1 decimal) the results file gives: estimates and interval bounds."""
    if data is None:
        return set(), set()
    s = summarize(data)
    ups, toks = set(), set()
    for v in s["variants"]:
        for row in v["by_concurrency"].values():
            for key in ("speedup", "speedup_timed"):
                d = row.get(key)
                if d:
                    ups |= {f"{d[b]:.2f}" for b in ("value", "lo", "hi") if d[b] == d[b]}
            d = row.get("tok_s")
            if d:
                toks |= {f"{d[b]:.1f}" for b in ("value", "lo", "hi") if d[b] == d[b]}
    return ups, toks


def test_readme_speed_numbers_come_from_the_results_file():
    """README.md is read-only here: when this fails, the README line must be changed to the current numbers."""
    ups, toks = _speeds(_results())
    bad = []
    for i, line in enumerate((REPO / "README.md").read_text().splitlines(), 1):
        wrong = [m.group(0) for m in SPEEDUP.finditer(line) if m.group(1) not in ups]
        wrong += [m.group(0) for m in TOK_S.finditer(line) if m.group(1) not in toks and m.group(1) not in NOT_OURS]
        if wrong:
            bad.append(f"README.md:{i}: {', '.join(wrong)} not in {RESULTS.relative_to(REPO)}: {line.strip()}")
    assert not bad, "\n".join(bad + [f"speedups the results give: {sorted(ups) or 'none (no results file)'}"])


def test_suite_time_quoted_from_its_results_file():
    """Issue 24: README and docs/testing.md say how long `make test` takes on a 2-core box from a fresh clone, with
    and without the installs; the numbers are bench/suite.json's (written by `python -m
    vllm_eagle3.tools.suite_time LOG` from a run's output), never typed; so are the slower host's
    (bench/suite_slow_host.json: an avx2-only EPYC) and the AMX host's (bench/suite_amx.json)."""
    text = (REPO / "docs" / "testing.md").read_text()
    section = text[text.index("## How long the suite takes") :]
    for name in ("suite.json", "suite_slow_host.json", "suite_amx.json"):
        run = json.loads((REPO / "bench" / name).read_text())
        assert run["fresh_clone"] and run["exit_code"] == 0 and run["machine"]["nproc"] == "2", run
        for quote in (
            f"{run['total_s']} s",
            f"{run['installs_s']} s",
            f"{run['pytest_s']} s",
            run["machine"]["cpu"],
            run["date"],
            run["machine"]["commit"],
            f"{round(run['slowest'][0]['seconds'])} s",
        ):
            assert quote in section, f"docs/testing.md does not quote {quote!r} from bench/{name}"
    r = json.loads((REPO / "bench" / "suite.json").read_text())
    minutes = f"{round(r['total_s'] / 60)} minutes"
    readme = (REPO / "README.md").read_text()
    assert minutes in readme and f"{round(r['installs_s'] / 60)} of them installs" in readme, (
        f"README does not say the suite takes {minutes} from bench/suite.json"
    )
