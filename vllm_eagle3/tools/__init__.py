"""Tooling around the runtime core: the ``vllm-eagle3`` command and everything it runs outside the engine.

Nothing here is imported by vLLM: the core (``vllm_eagle3.{spec,conventions,resolve,capture,plugin,compat}``)
imports no tool. ``cli`` dispatches to ``serve`` (validate, then vLLM's own server), ``demo``, ``inspect``,
``convert``, ``doctor`` and ``bench``; ``process`` starts and stops a server process; ``metrics`` reads its
``/metrics``.

``REPO`` is where the commands' defaults live (``models/``, ``configs/``, the published results under ``bench/``): a
clone of vllm-eagle3. A wheel carries none of them, so an installed package given its own paths never needs
``REPO``; the defaults that do say where they looked and how to point them elsewhere (:func:`bundled`).
"""

from pathlib import Path

from vllm_eagle3 import envs

HOME_ENV = envs.HOME
OUTPUT_HOME = Path.home() / ".cache" / "vllm-eagle3"
"""Where ``bench`` and ``soak`` write unless given a folder: outside any clone, so that a run never overwrites the
repository's committed results; their ``--publish`` writes there when asked."""


def _locate() -> tuple[Path, str]:
    """The folder holding the bundled miniature, and how it was chosen (for the one line that names it)."""
    if envs.EAGLE3_HOME:
        return Path(envs.EAGLE3_HOME).expanduser().resolve(), f"${HOME_ENV}"
    source = Path(__file__).resolve().parents[2]
    if (source / "pyproject.toml").is_file() and (source / "models").is_dir():
        return source, "the clone this package is installed from"
    # Installed from a wheel: site-packages holds no models; relative defaults resolve like any other path.
    return Path.cwd(), f"the current folder: installed from a wheel, ${HOME_ENV} unset"


REPO, REPO_SOURCE = _locate()
"""The clone whose ``models/``, ``configs/`` and results files the defaults name, and how it was found."""


class BundledMissing(SystemExit):
    """A default that names the bundled miniature, run where there is none; the message is the whole fix (Python
    prints it and exits 1 unless a command catches it)."""


def where() -> str:
    """One line: where the bundled miniature is looked for and how to point the commands at another clone."""
    return (
        f"bundled models and configs are looked for in {REPO} ({REPO_SOURCE}); run from a clone of vllm-eagle3 "
        f"or set {HOME_ENV}=<clone>"
    )


def bundled(relative: str | Path, command: str) -> Path:
    """``REPO / relative``, or :class:`BundledMissing` naming where it looked and how to fix it."""
    path = REPO / relative
    if not path.exists():
        raise BundledMissing(
            f"vllm-eagle3 {command}: error: {relative} not found: {where()} (or give your own paths, see --help)"
        )
    return path
