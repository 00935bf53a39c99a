"""Patches to upstream engine code that this project needs, each small, version-guarded and recorded.

Data flow position: none of the taps flow through here; these patches make the engines *run* the
target + draft pair at all (e.g. vLLM-CPU refusing a DeepSeek target with a Llama-style draft).

Every patch is a :class:`Patch`: a docstring-carrying function plus the engine it touches, the engine
versions it was written against (a ``packaging`` specifier set; the vLLM patches take
:data:`vllm_eagle3.compat.SUPPORTED_VLLM` or a part of it) and the upstream change that would retire it. :func:`apply`
checks the installed version (the error names installed vs supported versions), applies a patch at most once per
process (a second call is a no-op) and records it; :func:`applied_patches` lists what this process applied.

``EAGLE3_SKIP_PATCHES=name[,name...]`` (environment, read at :func:`apply`) leaves the named patches out in
this process; they are recorded as skipped. It exists so a test can run the engine as stock vLLM would, minus one
patch, and show that the patch is what fixes it (tests/e2e/test_sampling_options.py). Never set it in production.

Engine-specific patch modules live next to this file (``vllm_*.py``, ``sglang_*.py``); each exposes a
module-level ``PATCH`` and is applied by that engine's plugin. The patch modules import their engine (the
``vllm_*.py`` ones vLLM, when :mod:`~vllm_eagle3.model_patches.vllm_plugin` imports them); this ``__init__`` imports
none, so SGLang's venv imports it too, and :func:`vllm_cpu_only` imports vLLM only when a vLLM patch asks it.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Sequence

from packaging.specifiers import SpecifierSet

from vllm_eagle3 import envs  # stdlib-only: importable in SGLang's venv too
from vllm_eagle3.versions import describe, release_in


class PatchVersionError(RuntimeError):
    """The installed engine version is not one a patch was written against."""


@dataclasses.dataclass(frozen=True)
class Patch:
    """One upstream patch.

    ``name``: short id used in logs and :func:`applied_patches`.
    ``engine``: the distribution it patches ("vllm", "sglang").
    ``supported``: the versions the patch was written against and checked on, a ``SpecifierSet`` (e.g.
    ``compat.supported_vllm_before("0.34")``: 0.32.x, 0.33.x), or a tuple of releases, each a release line
    (``"0.32."``) or one version (``"0.5.23"``); stored as a tuple of ``SpecifierSet``, any of which may hold.
    ``retire_when``: the upstream issue/PR whose fix makes the patch unnecessary.
    ``apply_fn``: does the patching; returns a one-line description of what it changed.
    ``needed_fn``: optional; returns ``(False, reason)`` when this process does not need the patch
    (e.g. not a CPU platform). The patch is then recorded as skipped, not applied.
    """

    name: str
    engine: str
    supported: SpecifierSet | tuple[str | SpecifierSet, ...]
    retire_when: str
    apply_fn: Callable[[], str]
    needed_fn: Callable[[], tuple[bool, str]] | None = None

    def __post_init__(self) -> None:
        if not self.supported:
            raise ValueError(f"patch {self.name}: list the engine versions it was written against")
        specs = (
            (self.supported,)
            if isinstance(self.supported, SpecifierSet)
            else tuple(
                s if isinstance(s, SpecifierSet) else SpecifierSet(f"=={s}*" if s.endswith(".") else f"=={s}")
                for s in self.supported
            )
        )
        object.__setattr__(self, "supported", specs)


_lock = threading.Lock()
_records: dict[str, str] = {}

SKIP_ENV = envs.SKIP_PATCHES


def skipped_by_env(environ=None) -> frozenset[str]:
    """Patch names listed in ``EAGLE3_SKIP_PATCHES`` (comma-separated; blanks ignored)."""
    return envs.get(SKIP_ENV, environ)


def check_version(patch: Patch, installed: str) -> None:
    """Raise :class:`PatchVersionError` unless ``installed`` is in one of ``patch.supported``."""
    if not any(release_in(spec, installed) for spec in patch.supported):
        supported = ", ".join(describe(spec) for spec in patch.supported)
        raise PatchVersionError(
            f"model patch {patch.name!r} was written for {patch.engine} {supported} but {patch.engine} "
            f"{installed} is installed; install a supported {patch.engine} version, or check whether "
            f"{patch.retire_when} made the patch unnecessary and update vllm_eagle3/model_patches/"
        )


def apply(patch: Patch, installed_version: str) -> str:
    """Apply ``patch`` once in this process (re-entrant: later calls return the first record)."""
    with _lock:
        if patch.name in _records:
            return _records[patch.name]
        if patch.needed_fn is not None:  # not needed here (a vLLM-CPU patch on GPU): not held to its versions either
            needed, reason = patch.needed_fn()
            if not needed:
                _records[patch.name] = f"{patch.name}: skipped ({reason})"
                return _records[patch.name]
        check_version(patch, installed_version)
        if patch.name in skipped_by_env():
            _records[patch.name] = f"{patch.name}: skipped ({SKIP_ENV} names it)"
            return _records[patch.name]
        what = patch.apply_fn()
        _records[patch.name] = f"{patch.name}: applied for {patch.engine} {installed_version} ({what})"
        return _records[patch.name]


def apply_all(patches: Sequence[Patch], installed_version: str) -> list[str]:
    return [apply(p, installed_version) for p in patches]


def applied_patches() -> list[str]:
    """One line per patch this process applied or skipped, in order."""
    with _lock:
        return list(_records.values())


def vllm_cpu_only() -> tuple[bool, str]:
    """``needed_fn`` of the vLLM-CPU patches: needed on vLLM's CPU platform only (GPU backends are untouched)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False, f"platform is {current_platform.device_type}, not cpu"
    return True, ""
