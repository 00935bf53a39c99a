"""Moved to :mod:`vllm_eagle3.cpu_attention` (the runtime imports no tooling); re-exported for
``vllm_eagle3/tools/bench/machine.py`` until it imports the new place, then delete this file."""

from vllm_eagle3.cpu_attention import *  # noqa: F401,F403
from vllm_eagle3.cpu_attention import AMX_MLA, CPU_MLA, host_has_amx, is_float32  # noqa: F401
