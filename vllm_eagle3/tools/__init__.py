"""Tooling around the runtime core: the ``vllm-eagle3`` command and everything it runs outside the engine.

Nothing here is imported by vLLM: the core (``vllm_eagle3.{spec,conventions,resolve,capture,plugin,compat}``)
imports no tool. ``cli`` dispatches to ``serve`` (validate, then vLLM's own server), ``demo``, ``inspect``,
``convert``, ``doctor`` and ``bench``; ``process`` starts and stops a server process; ``metrics`` reads its
``/metrics``.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The source checkout (editable install): ``models/``, ``configs/`` and the results files live here."""
