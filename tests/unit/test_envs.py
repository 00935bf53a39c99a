"""Typed environment access (vllm_eagle3/envs.py): one entry per variable, read through its getters, nowhere else.

Guards issue 39: the same variables were read as string literals in five modules (12 direct ``os.environ`` reads)
while ``envs.py`` listed names nothing read; and issue 38: the project's ``VLLM_EAGLE3_*`` names sit in vLLM's
reserved prefix, so every start logged "Unknown vLLM environment variable detected" (an error with vLLM's
fail-on-unknown setting). The source scan reads files only (``ast``); nothing here starts an engine.
"""

from __future__ import annotations

import ast
import logging
import re
import sys
import threading
from pathlib import Path

import pytest

from vllm_eagle3 import envs

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("vllm_eagle3",)
KNOWN = set(envs.VARIABLES) | {v.deprecated for v in envs.VARIABLES.values() if v.deprecated}


@pytest.fixture()
def fresh_warning(monkeypatch):
    """A process that has not said its deprecation line yet."""
    monkeypatch.setattr(envs, "_warned", threading.Event())


def test_every_entry_parses_its_default_and_documents_itself():
    """An entry whose default its own parser cannot produce, or without a line of meaning, is a variable nobody can
    set correctly from the docs."""
    for name, var in envs.VARIABLES.items():
        assert envs.get(name, {}) == var.default, name
        envs.get(name, {name: ""})  # set but empty: parses, no error
        assert var.doc and "\n" not in var.doc, name
        assert name.startswith(("EAGLE3_", "_EAGLE3_")) or not name.startswith("EAGLE3"), name
    assert envs.get("EAGLE3_SKIP_PATCHES", {"EAGLE3_SKIP_PATCHES": " a, ,b"}) == {"a", "b"}
    assert envs.get("EAGLE3_CPU_MLA_VERIFY_AS_DECODE", {"EAGLE3_CPU_MLA_VERIFY_AS_DECODE": "0"}) is False
    with pytest.raises(ValueError, match=r"EAGLE3_CPU_MLA_VERIFY_AS_DECODE='yes': use 0 or 1"):
        envs.get("EAGLE3_CPU_MLA_VERIFY_AS_DECODE", {"EAGLE3_CPU_MLA_VERIFY_AS_DECODE": "yes"})
    with pytest.raises(KeyError, match="add an entry there"):
        envs.get("EAGLE3_NO_SUCH_VARIABLE", {})


def test_attribute_access_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("EAGLE3_CONVENTION", "vllm")
    assert envs.EAGLE3_CONVENTION == "vllm"
    with pytest.raises(AttributeError):
        envs.EAGLE3_NO_SUCH_VARIABLE  # noqa: B018


def test_project_names_leave_vllms_prefix_and_vllm_knows_the_rest():
    """vLLM warns about (or, with its fail-on-unknown setting, refuses) every ``VLLM_*`` variable it does not define:
    the project's own names must not start with ``VLLM_``, and each vLLM name listed here must be one vLLM reads."""
    from vllm import envs as vllm_envs

    ours = [n for n in envs.VARIABLES if n.lstrip("_").startswith("EAGLE3_")]
    assert ours and not any(n.startswith("VLLM_") for n in ours)
    theirs = {n for n in envs.VARIABLES if n.startswith("VLLM_")}
    assert theirs <= set(vllm_envs.environment_variables), theirs - set(vllm_envs.environment_variables)


def test_deprecated_names_work_with_one_line_per_process(fresh_warning, caplog):
    """``VLLM_EAGLE3_*`` from before the rename keep working (deployments set them), with ONE line naming old and new
    names however often they are read; the new name wins when both are set."""
    old = {"VLLM_EAGLE3_SPEC": "/s.yaml", "VLLM_EAGLE3_CONVENTION": "vllm"}
    with caplog.at_level(logging.WARNING, logger="vllm.vllm_eagle3"):
        assert envs.get("EAGLE3_SPEC", old) == "/s.yaml" and envs.get("EAGLE3_CONVENTION", old) == "vllm"
        assert envs.get("EAGLE3_SPEC", old) == "/s.yaml"
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "VLLM_EAGLE3_SPEC -> EAGLE3_SPEC" in lines[0] and "VLLM_EAGLE3_CONVENTION -> EAGLE3_CONVENTION" in lines[0]
    assert envs.get("EAGLE3_SPEC", {**old, "EAGLE3_SPEC": "/new.yaml"}) == "/new.yaml"


def test_envs_is_stdlib_only():
    """model_patches reads its variables through envs.py in SGLang's venv too, which lacks this package's deps."""
    tree = ast.parse((REPO / "vllm_eagle3" / "envs.py").read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= set(sys.stdlib_module_names) | {"__future__", "vllm_eagle3"}, mods
    init = ast.parse((REPO / "vllm_eagle3" / "__init__.py").read_text())  # the package root it takes LOGGER from
    assert not [n for n in ast.walk(init) if isinstance(n, (ast.Import, ast.ImportFrom))]


# ----------------------------------------------------------------------------------------------- the source scan


def _is_os_environ(node: ast.AST, environ_names: set[str]) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    ) or (isinstance(node, ast.Name) and node.id in environ_names)


def _known_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in KNOWN


def direct_reads(path: Path) -> list[str]:
    """Reads of ONE variable that bypass envs.py: ``os.environ.get(X)`` / ``os.environ[X]`` / ``os.getenv(X)`` /
    ``X in os.environ`` / a used ``os.environ.pop(X)``, and ``<mapping>.get("NAME")`` / ``<mapping>["NAME"]`` /
    ``"NAME" in <mapping>`` for a name envs.py lists. Allowed: building a whole child environment
    (``dict(os.environ)``, ``{**os.environ, ...}``, passing ``os.environ`` to a function), and setting or removing
    variables (for this process's children)."""
    tree = ast.parse(path.read_text())
    environ_names = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "os"
        for a in n.names
        if a.name == "environ"
    }
    getenv_names = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "os"
        for a in n.names
        if a.name == "getenv"
    }
    used_pops = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # a bare pop() only removes
    bad = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and _is_os_environ(f.value, environ_names):
                hit = f.attr == "get" or (f.attr == "pop" and id(node) not in used_pops)
            elif (
                isinstance(f, ast.Attribute)
                and f.attr == "getenv"
                and isinstance(f.value, ast.Name)
                and f.value.id == "os"
            ):
                hit = True
            elif isinstance(f, ast.Name) and f.id in getenv_names:
                hit = True
            elif isinstance(f, ast.Attribute) and f.attr == "get" and node.args and _known_literal(node.args[0]):
                hit = not (isinstance(f.value, ast.Name) and f.value.id == "envs")  # envs.get(NAME) is the way
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            hit = _is_os_environ(node.value, environ_names) or _known_literal(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
            hit = any(_is_os_environ(c, environ_names) for c in node.comparators) or _known_literal(node.left)
        if hit:
            bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:100]}")
    return bad


def test_no_direct_environment_reads_outside_envs():
    """Every read goes through envs.py, so a variable's default, parser and deprecated name apply everywhere (a
    direct read of EAGLE3_SPEC would miss VLLM_EAGLE3_SPEC, a direct read of EAGLE3_CPU_MLA_VERIFY_AS_DECODE would
    accept "yes")."""
    bad = [
        b
        for pkg in SCANNED
        for f in sorted((REPO / pkg).rglob("*.py"))
        if f != REPO / "vllm_eagle3" / "envs.py"
        for b in direct_reads(f)
    ]
    assert not bad, "read through vllm_eagle3.envs (envs.get(NAME, environ) / envs.NAME) instead:\n" + "\n".join(bad)


def test_the_scan_catches_each_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import os\nfrom os import environ as E\n"
        "a = os.environ.get('X')\nb = os.environ['X']\nc = os.getenv('X')\nd = 'X' in os.environ\n"
        "e = os.environ.pop('X', None)\nf = E.get('X')\ng = env.get('EAGLE3_SPEC')\n"
        "h = env['LD_PRELOAD']\ni = 'VLLM_PLUGINS' in env\n"
        "os.environ.pop('X', None)\nos.environ['X'] = '1'\nchild = {**os.environ, 'X': '1'}\n"
        "whole = dict(os.environ)\nrun(os.environ)\nenv['EAGLE3_SPEC'] = 'p'\n"
    )
    monkey = REPO
    try:
        globals()["REPO"] = tmp_path
        found = direct_reads(src)
    finally:
        globals()["REPO"] = monkey
    assert [int(b.split(":")[1]) for b in found] == list(range(3, 12)), found


def test_every_project_name_in_the_package_is_an_entry():
    """A variable read or set under a name envs.py does not list (a typo, or a new variable added in place) has no
    default, parser or deprecation handling."""
    used = set()
    for pkg in SCANNED:
        for f in (REPO / pkg).rglob("*.py"):
            used |= set(re.findall(r"[\"']((?:_?VLLM)?_?EAGLE3_[A-Z0-9_]+)[\"']", f.read_text()))
    assert used and not used - KNOWN, sorted(used - KNOWN)


def test_every_entry_is_read_somewhere():
    """envs.py listed five names nothing read (issue 39): an entry without a reader documents a setting that does
    nothing. A name counts as read when another module names it (``"NAME"``, ``envs.NAME``, or its name constant
    ``envs.SERVE_LOG``), or names the group holding it (``envs.MALLOC_KNOBS``)."""
    text = "\n".join(
        f.read_text() for pkg in SCANNED for f in (REPO / pkg).rglob("*.py") if f != REPO / "vllm_eagle3" / "envs.py"
    )
    groups = {n for g in ("MALLOC_KNOBS", "ONEDNN_CACHE") if f"envs.{g}" in text for n in getattr(envs, g)}
    constants = {n: [a for a, v in vars(envs).items() if v == n and a.isupper()] for n in envs.VARIABLES}
    unread = [
        n
        for n in envs.VARIABLES
        if n not in groups
        and not re.search(rf"[\"']{n}[\"']|envs\.{n}\b", text)
        and not any(re.search(rf"envs\.{a}\b", text) for a in constants[n])
    ]
    assert not unread, f"listed in vllm_eagle3/envs.py but read nowhere (remove them): {unread}"
