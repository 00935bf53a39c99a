"""docs/DEPLOYMENT.md's ``vllm serve`` / ``vllm-eagle3 serve`` commands, parsed by each vLLM wheel's own parser.

Data flow position: none at run time; part of ``make compat`` (:mod:`vllm_eagle3.tools.compat_check`). The page's
``bash`` blocks run in a bash with no ``PATH`` where ``vllm`` and ``vllm-eagle3`` are functions that record their
argv (``$SPEC`` and line continuations resolved by bash itself, nothing else runs); inline commands with options
are read too. ``vllm-eagle3 serve`` argv becomes the vLLM argv it would hand on (``--capture-spec`` folded into
``--additional-config``, as the serve tool does). Each wheel's Python sources are unpacked (no install, no compiled
extension) and a child Python with them first on ``sys.path`` builds vLLM's own ``vllm serve`` parser, parses every
command, runs the subcommand's ``validate`` and ``AsyncEngineArgs.from_cli_args``. A vLLM dependency this venv lacks
(e.g. ``orjson`` for 0.33) is stood in for by a module whose every name is ``object``, only when the wheel requires
it; the results name them.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from vllm_eagle3.tools.compat_source import REPO

DOC = REPO / "docs" / "DEPLOYMENT.md"
_RS, _US = "\x1e", "\x1f"  # record / unit separators between recorded commands and their arguments


def doc_commands(doc: Path = DOC) -> list[dict]:
    """``{"where": "docs/DEPLOYMENT.md:LINE", "argv": [...]}`` for each ``vllm``/``vllm-eagle3`` serve command."""
    text = doc.read_text()
    rel = doc.relative_to(REPO).as_posix()
    script = ["command_not_found_handle() { return 0; }"]
    for prog in ("vllm", "vllm-eagle3"):
        script.append(f"{prog}() {{ printf '{_RS}%s' \"${{BASH_LINENO[0]}}\"; printf '{_US}%s' {prog} \"$@\"; }}")
    starts = []  # (line in the script, line in the page) where each piece starts
    pieces = [
        (m.group(1), text[: m.start(1)].count("\n") + 1) for m in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S)
    ]
    pieces += [
        (m.group(1), text[: m.start()].count("\n") + 1)
        for m in re.finditer(r"`((?:vllm|vllm-eagle3) serve [^`]*--[^`]*)`", text)
    ]
    for piece, line in pieces:
        starts.append((sum(p.count("\n") + 1 for p in script) + 1, line))
        script.append(piece.rstrip("\n"))
    out = subprocess.run(
        [shutil.which("bash") or "/bin/bash", "--noprofile", "--norc", "-c", "\n".join(script)],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent", "HOME": "/nonexistent"},
        cwd=REPO,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the bash blocks of {rel} did not run: {out.stderr.strip()}")
    found = []
    for record in out.stdout.split(_RS)[1:]:
        at, *argv = record.split(_US)
        script_line, page_line = max(s for s in starts if s[0] <= int(at))
        if argv[1:2] == ["serve"]:
            found.append({"where": f"{rel}:{page_line + int(at) - script_line}", "argv": argv})
    return found


def vllm_argv(argv: list[str]) -> list[str]:
    """What ``vllm serve`` receives for ``argv``: ``vllm-eagle3 serve`` folds ``--capture-spec``/``--convention``
    into ``--additional-config`` (``tools/serve/cli.py``), relative paths read from the repository root."""
    if argv[0] == "vllm":
        return argv[1:]
    from vllm_eagle3.tools.serve.args import take_option
    from vllm_eagle3.tools.serve.cli import capture_spec_argv

    rest = argv[2:]
    spec, rest = take_option(rest, ["--capture-spec", "--capture_spec"])
    convention, rest = take_option(rest, ["--convention"])
    return ["serve", *capture_spec_argv(rest, spec and str(REPO / spec), convention)]


def unpack(wheel_path: Path, cache: Path) -> Path:
    """The wheel's ``vllm/`` package without compiled extensions, under ``cache/src/<wheel>`` (kept between runs)."""
    dest = cache / "src" / wheel_path.stem
    done = dest / ".unpacked"
    if not done.is_file():
        with zipfile.ZipFile(wheel_path) as z:
            for name in z.namelist():
                if name.startswith("vllm/") and not name.endswith((".so", ".cubin", ".fatbin")):
                    z.extract(name, dest)
        done.write_text(wheel_path.name + "\n")
    return dest


def missing_requirements(wheel_path: Path) -> set[str]:
    """Import-name guesses (``flashinfer-python`` -> ``flashinfer_python``) of what the wheel requires and this venv
    lacks; a missing module is stood in for only when one of these names it."""
    with zipfile.ZipFile(wheel_path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    names = set()
    for line in lines:
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            name = re.match(r"[A-Za-z0-9_.-]+", line.split(":", 1)[1].strip()).group(0)
            try:
                importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                names.add(name.lower().replace("-", "_").replace(".", "_"))
    return names


def parse_with(wheel_path: Path, version: str, commands: list[dict], cache: Path, log=print) -> dict:
    """Every command parsed by this wheel's own parser: ``{"parser": ..., "stubbed": [...], "commands": [...]}``."""
    src = unpack(wheel_path, cache)
    allowed = missing_requirements(wheel_path)
    argvs = [vllm_argv(c["argv"]) for c in commands]
    stubs: list[str] = []
    while True:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO)]), "VLLM_PLUGINS": ""}
        child = subprocess.run(
            [sys.executable, "-m", "vllm_eagle3.tools.compat_flags"],
            capture_output=True,
            input=json.dumps({"argvs": argvs, "stubs": stubs}),
            text=True,
            env=env,
            cwd=REPO,
            timeout=600,
        )
        answer = (
            json.loads(child.stdout.strip().splitlines()[-1])
            if child.stdout.strip()
            else {"error": child.stderr.strip()[-2000:]}
        )
        missing = answer.get("missing_module")
        if missing and missing not in stubs and any(n == missing or n.startswith(missing + "_") for n in allowed):
            log(f"compat_check:     {version}: vLLM requires {missing}, not installed here: a stand-in module")
            stubs.append(missing)
            continue
        break
    if "results" not in answer:
        raise RuntimeError(f"vLLM {version}'s own parser could not be built from {src}: {answer}")
    if answer["version"] != version:
        raise RuntimeError(f"the child imported vLLM {answer['version']}, not {version}, from {src}")
    results = [{**c, "vllm_argv": a, **r} for c, a, r in zip(commands, argvs, answer["results"])]
    return {
        "parser": f"vllm {version}'s own `vllm serve` parser ({answer['parser']}), from the wheel's sources",
        "stubbed": stubs,
        "ok": all(r["ok"] for r in results),
        "commands": results,
    }


# ----------------------------------------------------------------------------------------------- the child process


def _install_stubs(names: set[str]) -> None:
    import importlib.abc
    import importlib.machinery
    import types

    class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in names:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            def attribute(name: str):
                if name.startswith("__"):
                    raise AttributeError(name)
                return object  # e.g. `from orjson import OPT_NON_STR_KEYS`, a base class, a decorator's target

            module = types.ModuleType(spec.name)
            module.__path__ = []
            module.__getattr__ = attribute
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Stub())


def _child() -> dict:
    import contextlib
    import io

    given = json.loads(sys.stdin.read())
    argvs = given["argvs"]
    _install_stubs(set(given["stubs"]))
    try:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.cli import serve

        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:
            from vllm.utils import FlexibleArgumentParser
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "vllm":
            return {"missing_module": (exc.name or "").split(".")[0], "error": str(exc)}
        raise
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds = {c.name: c for c in serve.cmd_init()}
    for cmd in cmds.values():
        cmd.subparser_init(subparsers)
    serve_parser = subparsers.choices["serve"]
    flag_of = {
        a.dest: next(
            (o for o in a.option_strings if o.startswith("--") and not o.startswith("--no-")), a.option_strings[0]
        )
        for a in serve_parser._actions
        if a.option_strings
    }
    results = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser.parse_args(argv)
            cmds[args.subparser].validate(args)
            AsyncEngineArgs.from_cli_args(args)
            parsed = {
                flag_of[dest]: repr(value)[:200]
                for dest, value in sorted(vars(args).items())
                if dest in flag_of and value != serve_parser.get_default(dest)
            }  # what the command set
            results.append(
                {
                    "ok": True,
                    "model": getattr(args, "model_tag", None) or getattr(args, "model", None),
                    "parsed": parsed,
                }
            )
        except SystemExit:
            results.append({"ok": False, "error": (err.getvalue().strip().splitlines() or ["SystemExit"])[-1]})
        except Exception as exc:  # noqa: BLE001 - a command this vLLM refuses: recorded, not raised
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return {
        "version": vllm.__version__,
        "parser": f"{FlexibleArgumentParser.__module__}.FlexibleArgumentParser + "
        f"{serve.__name__}.{type(cmds['serve']).__name__}",
        "results": results,
    }


if __name__ == "__main__":
    print(json.dumps(_child()))
