"""vLLM-CPU: a process waiting on vLLM's shared-memory message queue sleeps 0.1 ms between looks instead of spinning.

Why: ``vllm/distributed/device_communicators/shm_broadcast.py`` (0.32) ``SpinCondition.wait`` keeps a reader
busy-looping on ``sched_yield()`` for ``busy_loop_s = 1`` s after its last read before it waits on the writer's zmq
notification. Under load a read comes every step, so the reader never stops: the engine core, waiting for its
worker's output, holds a core for the whole forward pass. On a GPU host that is a spare core buying microseconds.
vLLM-CPU's worker computes on the cores itself, and the spinner holds the core vLLM-CPU leaves to the engine core and
the API server (``reserve_cpu_num``), or, in ``make test`` on two cores, the other pytest worker's engine's core.

What this does: while vLLM would spin, the reader sleeps :data:`POLL_S` (0.1 ms) and looks again; after a second
without a read it takes vLLM's own idle path (the notification) as before. Messages, writers and the idle path are
untouched. Waiting on the notification at once (``busy_loop_s = 0``) was tried first and stalled: serving at
concurrency 32 the steps came ~5 s apart with the CPU idle, so a notification can go missing and the reader then
waits for its poll timeout; vLLM only takes that path after an idle second, where one late step goes unnoticed.

Measured (2-core AMD EPYC, AVX-512; the miniature served without speculation at concurrency 32, 64 held-out prompts
x 128 tokens per cell, two cells each, one server at a time): the engine core used 5.1-5.4 CPU-seconds per cell
instead of 42.9-43.6, and served 181.8-183.6 tok/s against 174.7-175.1 with vLLM's spin.

Retire when: vLLM exposes the busy-loop time, or stops spinning on CPU.
"""

from __future__ import annotations

from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

_MARK = "_vllm_eagle3_no_spin"


POLL_S = 1e-4
"""How long a reader sleeps between two looks at the buffer while it would have spun: 0.1 ms, against CPU steps of
tens to hundreds of milliseconds and two messages per step."""


def _apply() -> str:
    import time

    from vllm.distributed.device_communicators import shm_broadcast

    cls = shm_broadcast.SpinCondition
    original = cls.wait
    if getattr(original, _MARK, False):
        return "already patched"

    def wait(self, timeout_ms: int | None = None) -> None:
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(POLL_S)  # vLLM: sched_yield(), which returns at once to a process alone on its core
            return
        original(self, timeout_ms)

    wait.__doc__ = original.__doc__
    setattr(wait, _MARK, True)
    cls.wait = wait
    return f"shm_broadcast.SpinCondition.wait: a reader sleeps {POLL_S * 1e3:g} ms between looks instead of spinning"


PATCH = Patch(
    name="vllm_cpu_no_spin",
    engine="vllm",
    supported=supported_vllm_before("0.33"),
    retire_when="vLLM exposing SpinCondition's busy_loop_s (shm_broadcast.py), or defaulting it to 0 on CPU",
    apply_fn=_apply,
    needed_fn=vllm_cpu_only,
)
