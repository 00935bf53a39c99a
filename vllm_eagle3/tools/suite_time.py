"""How long ``make test`` took, read from its output into ``bench/suite.json`` (what docs/testing.md quotes).

Data flow position: after a test run, like the benchmark's results file. ``make test`` prints ``make test: installs
done in N s`` and ``make test: N s in all, installs included (exit code C)``, and pytest's ``--durations=30`` table
and summary line; this reads them, adds the machine (as the benchmark records it) and the commit, and writes JSON.
tests/unit/test_docs_numbers.py checks that docs/testing.md quotes the file's numbers.

    make test 2>&1 | tee /tmp/make-test.log
    python -m vllm_eagle3.tools.suite_time /tmp/make-test.log --fresh-clone   # -> bench/suite.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from vllm_eagle3.tools import REPO

OUT = REPO / "bench" / "suite.json"
_INSTALLS = re.compile(r"make test: installs done in (\d+) s")
_TOTAL = re.compile(r"make test: (\d+) s in all, installs included \(exit code (\d+)\)")
_SUMMARY = re.compile(r"=+ (.*?) in ([\d.]+)s(?: \([\d:]+\))? =+")
_DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)")


def parse(log: str) -> dict:
    """The numbers of one ``make test`` output; raises ValueError naming what is missing."""
    installs, total, summary = _INSTALLS.search(log), _TOTAL.search(log), None
    for m in _SUMMARY.finditer(log):
        if "passed" in m.group(1) or "failed" in m.group(1):
            summary = m
    if not (installs and total and summary):
        missing = [
            n for n, v in (("installs line", installs), ("total line", total), ("pytest summary", summary)) if not v
        ]
        raise ValueError(f"not a whole `make test` output: no {', '.join(missing)}")
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary.group(1))}
    slowest = [
        {"seconds": float(s), "phase": ph, "test": t}
        for s, ph, t in (m.groups() for m in map(_DURATION.match, log.splitlines()) if m)
    ]
    return {
        "installs_s": int(installs.group(1)),
        "total_s": int(total.group(1)),
        "exit_code": int(total.group(2)),
        "pytest_s": round(float(summary.group(2))),
        "counts": counts,
        "slowest": slowest,
    }


def main(argv: list[str] | None = None) -> int:
    from vllm_eagle3.tools.machine import machine_info, now_utc

    p = argparse.ArgumentParser(prog="python -m vllm_eagle3.tools.suite_time", description=__doc__.split("\n")[0])
    p.add_argument("log", help="the saved output of `make test`")
    p.add_argument("--fresh-clone", action="store_true", help="the run started from a fresh clone (installs included)")
    p.add_argument("--commit", default=None, help="the commit the run tested (default: this checkout's HEAD)")
    p.add_argument("--out", default=str(OUT), help=f"where to write (default {OUT.relative_to(REPO)})")
    args = p.parse_args(argv)
    try:
        data = parse(Path(args.log).read_text(errors="replace"))
    except (OSError, ValueError) as exc:
        print(f"suite_time: error: {exc}", file=sys.stderr)
        return 1
    machine = machine_info()
    if args.commit:
        machine.update(commit=args.commit, dirty="no")
    data = {"date": now_utc(), "fresh_clone": args.fresh_clone, "machine": machine, **data}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(
        f"wrote {args.out}: {data['total_s']} s in all ({data['installs_s']} s installs, {data['pytest_s']} s "
        f"pytest), {data['counts']}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
