"""Moved to :mod:`vllm_eagle3.cpu_attention` (the runtime imports no tooling); re-exported for
``vllm_eagle3/tools/bench/machine.py`` until it imports the new place, then delete this file."""

from vllm_eagle3.cpu_attention import *  # noqa: F401,F403
