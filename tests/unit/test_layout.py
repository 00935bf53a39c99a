"""The package's shape, checked on its source: dependencies point down (what vLLM loads imports no tooling), no import
circle, modules stay small.

Guards issue 26: ``resolve.py`` and ``watch.py`` imported each other, ``tools/`` called ``testing.engine``, a wiring
tool depended on the training code, modules grew past 500 lines, and environment variables were read under names
defined in several modules (tests/unit/test_envs.py now guards those); issue 39: ``model_patches`` (loaded in every
vLLM process) imported ``vllm_eagle3.tools.serve``, outside the core set this test checked. Reads files only
(``ast``), no engine.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("vllm_eagle3",)
# Module size in logical lines (statements, tokenize's NEWLINE): what ``ruff format`` does not change. 300 was the
# biggest module's count when the limit moved from 450 physical lines (which formatting alone pushed past) to this.
MAX_LOGICAL_LINES = 300
CORE = {
    "vllm_eagle3.spec",
    "vllm_eagle3.conventions",
    "vllm_eagle3.checkpoint",
    "vllm_eagle3.resolve",
    "vllm_eagle3.capture",
    "vllm_eagle3.plugin",
    "vllm_eagle3.compat",
    "vllm_eagle3.watch",
    "vllm_eagle3.watch_vllm",
    "vllm_eagle3.envs",
    "vllm_eagle3.vllm_cpu_version",
    "vllm_eagle3.wirings",
    "vllm_eagle3.wiring_check",
    "vllm_eagle3.cpu_attention",
    "vllm_eagle3.engines",
    "vllm_eagle3.verdicts",
    "vllm_eagle3.versions",
    "vllm_eagle3.live_k",
    "vllm_eagle3.live_k_vllm",
    "vllm_eagle3.request_speculation",
    "vllm_eagle3.request_speculation_vllm",
    "vllm_eagle3.model_files",
    "vllm_eagle3.settings",
    "vllm_eagle3.pipeline",
}
CORE_PACKAGES = ("vllm_eagle3.online", "vllm_eagle3.model_patches")
"""Whole packages of the runtime: every module under them is core."""


def is_core(mod: str) -> bool:
    return mod in CORE or any(mod == p or mod.startswith(p + ".") for p in CORE_PACKAGES)


def vllm_entry_points() -> set[str]:
    """The modules vLLM itself imports: every entry point of this distribution in pyproject.toml."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {
        target.split(":")[0]
        for group, eps in project["entry-points"].items()
        if group.startswith("vllm.")
        for target in eps.values()
    }


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (function-level imports included)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_no_import_circle(graph):
    """Between modules (a package's ``__init__`` re-exporting its own children does not count as a circle)."""

    def is_parent(a: str, b: str) -> bool:
        return b.startswith(a + ".")

    edges = {a: {b for b in bs if not is_parent(a, b) and not is_parent(b, a)} for a, bs in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if state.get(nxt) is None and (cycle := visit(nxt, path + [node])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(edges):
        if state.get(node) is None:
            cycle = visit(node, [])
            assert cycle is None, "import circle: " + " -> ".join(cycle[cycle.index(cycle[-1]) :])


def test_dependencies_point_down(graph):
    """The runtime core imports no tooling, training or test support (the online check alone scores wirings with the
    reference head); nothing in the package imports ``testing``; the tools do not import the miniature's training
    code (the reference head is ``vllm_eagle3.reference``)."""
    bad = []
    for mod, deps in graph.items():
        for d in deps:
            banned = ("vllm_eagle3.tools", "vllm_eagle3.miniature", "vllm_eagle3.testing")
            if is_core(mod) and (
                d.startswith(banned)
                or (d.startswith("vllm_eagle3.reference") and not mod.startswith("vllm_eagle3.online"))
            ):
                bad.append(f"core {mod} imports {d}")
            if d.startswith("vllm_eagle3.testing") and not mod.startswith("vllm_eagle3.testing"):
                bad.append(f"{mod} imports test support {d}")
            if mod.startswith("vllm_eagle3.reference") and d.startswith(("vllm_eagle3.miniature", "vllm_eagle3.tools")):
                bad.append(f"the reference head {mod} imports {d}")
            if mod.startswith("vllm_eagle3.tools.doctor") and d.startswith("vllm_eagle3.miniature.train"):
                bad.append(f"the doctor {mod} imports training code {d}")
    assert not bad, "\n".join(bad)


def test_what_vllm_loads_imports_no_tooling(graph):
    """Everything reachable from vLLM's entry points (plugin, patches, capture, online check, watch) stays out of
    ``vllm_eagle3.tools``: a vLLM process must not load the commands, and a tooling change must not break serving
    (``vllm_eagle3/model_patches/vllm_cpu_amx_float32.py`` imported ``tools.serve.cpu_attention``). Function-level
    imports count."""
    entry = vllm_entry_points()
    assert {"vllm_eagle3.plugin", "vllm_eagle3.model_patches.vllm_plugin", "vllm_eagle3.watch_vllm"} <= entry, entry
    seen, todo, via = set(), sorted(entry), {}
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        for d in graph.get(mod, ()):
            via.setdefault(d, mod)
            todo.append(d)
    bad = sorted(m for m in seen if m.startswith(("vllm_eagle3.tools", "vllm_eagle3.testing", "vllm_eagle3.miniature")))
    assert not bad, "vLLM loads tooling: " + "; ".join(f"{m} (imported by {via[m]})" for m in bad)


def logical_lines(path: Path) -> int:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return sum(1 for t in tokens if t.type == tokenize.NEWLINE)


def test_no_module_over_300_logical_lines():
    long = {name: n for name, f in modules().items() if (n := logical_lines(f)) > MAX_LOGICAL_LINES}
    assert not long, f"modules over {MAX_LOGICAL_LINES} logical lines (split them by role): {long}"


def test_test_modules_have_unique_names():
    """The test folders are not packages: two test files with one basename stop pytest at collection ("import file
    mismatch"), the whole suite with them (it happened: tests/unit and tests/e2e both had test_wiring_check.py)."""
    seen: dict[str, list[str]] = {}
    for f in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(f.name, []).append(str(f.relative_to(REPO)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"test files sharing a basename: {clashes}"
