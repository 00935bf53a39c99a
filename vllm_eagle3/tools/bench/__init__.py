"""``vllm-eagle3 bench`` (what ``make bench`` runs): with vs without EAGLE-3 on the real vLLM server, with speed
claims that carry their 95 % intervals, the draft/verify split, the embed-tap vs native-capture A/B and advice.

Data flow position: outside the engine, like ``demo.py``; one ``vllm-eagle3 serve`` process per variant.

- :mod:`.plan` - what a run measures: variants (one server each), cells, the named plans and their duration;
- :mod:`.timers` - :class:`StepTimers`, the vLLM worker extension that times the target forward and the draft in
  the worker (only in the timed cells), and the per-step split of its records;
- :mod:`.client` - the load generator: plain non-streaming completions (throughput), streamed ones (latency),
  ``/metrics`` and ``/collective_rpc`` reads;
- :mod:`.run` - orchestration: serve configs, servers, the compile cache, cells in order, the results file;
- :mod:`.stats` - estimates with bootstrap intervals and the step-cost models;
- :mod:`.analysis` - results file -> summary: speedups, acceptance, split, capture A/B verdict, advice;
- :mod:`.report` - ``BENCHMARKS.md`` (from ``template.md`` + the results file), the plot, the printed advice;
- :mod:`.cli` - the command line (``main``).

``StepTimers`` is importable from here because servers load it by this path (``--worker-extension-cls
vllm_eagle3.tools.bench.StepTimers``); importing the package imports no engine.
"""

from vllm_eagle3.tools.bench.cli import main
from vllm_eagle3.tools.bench.timers import StepTimers

__all__ = ["main", "StepTimers"]
