"""``vllm-eagle3 serve``: validate, then run vLLM's own ``vllm serve`` with the plugin, supervised.

Data flow position: before and around the engine, outside it.

- ``cli.py``: the command (validation, the settings it makes, the supervised child ``python -m
  vllm_eagle3.tools.serve``);
- ``args.py``: reading a ``vllm serve`` command line as vLLM will, without importing vLLM;
- ``vllm_cpu.py``: what it sets on vLLM-CPU (memory, allocator, OpenMP, the CLI version hook; the attention backend
  comes from the runtime's ``vllm_eagle3/cpu_attention.py``);
- ``supervisor.py``, ``failures.py``: stop signals, the kept log, exit codes and the one-line causes;
- ``process.py``, ``metrics.py``: a running server seen from outside (start, readiness, ``/metrics``).
"""

from .cli import main

__all__ = ["main"]
