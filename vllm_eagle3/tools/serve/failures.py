"""Why a supervised vLLM server ended on its own: one line naming the cause and the fix, read from its output.

Data flow position: outside the engine, in ``vllm-eagle3 serve``'s supervisor (``supervisor.py``), which keeps the
end of vLLM's output. vLLM's API server stops by itself only when something failed: its engine could not start (a
dtype the attention backend cannot load, too little memory, an unreadable model, a taken port, two OpenMP runtimes)
or its engine died while serving (a worker or the engine core killed, e.g. by the OOM killer, or an exception in
the engine). vLLM 0.32 then exits with status 0 after an engine death; ``serve`` turns both into the exit codes of
:data:`EXIT_CODES` and one ``vllm-eagle3: error:`` line. Pure functions of the log text: unit-tested on real lines.
"""

from __future__ import annotations

import re
import signal

EXIT_START_FAILED = 1
EXIT_ENGINE_DIED = 3
EXIT_CODES = {
    0: "never on its own (vLLM's server runs until stopped)",
    1: "vLLM did not start (the line names the cause; the log file has the rest)",
    2: "refused before vLLM started: bad capture spec, draft, backend or options",
    3: "the engine died while serving (a worker or the engine core was killed, or raised)",
    "128+N": "stopped by signal N (143 = SIGTERM, 130 = SIGINT, 129 = SIGHUP)",
}

READY_MARK = "Application startup complete"
"""uvicorn's line once the OpenAI server accepts requests (what ``/health`` then answers 200 for)."""

# (pattern in vLLM's output, cause with the fix): the first pattern found (in this order) names the start-up failure.
START_FAILURES: tuple[tuple[str, str], ...] = (
    (
        r"expect weight to be bfloat16, float16, int8",
        "the attention backend cannot load these weights (vLLM-CPU's AMX_MLA packs bf16/fp16/int8 only): serve "
        "--dtype bfloat16, or --attention-backend CPU_MLA for float32",
    ),
    (
        r"less than desired CPU memory utilization|Available memory on node \d+ .* on startup",
        "not enough free memory for vLLM-CPU's default memory check (92% of the NUMA node): set "
        "VLLM_CPU_KVCACHE_SPACE=<GiB> (vllm-eagle3 serve picks one when you set neither it nor "
        "--gpu-memory-utilization), or free memory",
    ),
    (
        r"Cannot allocate memory|MemoryError|OutOfMemoryError",
        "out of memory while starting: a smaller VLLM_CPU_KVCACHE_SPACE / --max-model-len, or free memory",
    ),
    (
        r"Address already in use|error while attempting to bind on address",
        "the port is in use: pass another --port, or stop the process listening on it",
    ),
    (
        r"assert not \(self\.use_iomp and self\.use_gomp\)|cannot be preloaded",
        "an OpenMP runtime problem: LD_PRELOAD names a library that is missing or a second OpenMP runtime (vLLM-CPU "
        "takes exactly one); unset LD_PRELOAD and let vllm-eagle3 serve preload Intel OpenMP "
        "(pip install intel-openmp)",
    ),
    (
        r"HeaderTooLarge|SafetensorError|Error while deserializing header|incomplete metadata",
        "a model's weights cannot be read (a truncated or corrupt .safetensors file): download it again",
    ),
    (
        r"does not appear to have a file named|Invalid repository ID or local directory|"
        r"Can't load the configuration|not a valid JSON file|JSONDecodeError",
        "a model folder cannot be read (missing or broken config.json / tokenizer files): check the path",
    ),
)

_WORKER_DIED = re.compile(r"Worker proc (\S+) died unexpectedly \(exit code: (-?\d+|None)\)")
"""vLLM's worker monitor; the exit code is None when it looked before the process was reaped (seen on a headless
node whose worker was SIGKILLed)."""
_ENGINE_DEAD = re.compile(r"EngineDeadError|Engine core proc \S+ died|EngineCore[^ ]* died")


def _signal_name(exitcode: int) -> str:
    """multiprocessing's exit code -N: killed by signal N."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        oom = (
            " (what the kernel's OOM killer sends: check `dmesg` or the container's memory limit)"
            if -exitcode == signal.SIGKILL
            else ""
        )
        return f"was killed by {name}{oom}"
    return f"exited with code {exitcode}"


def start_failure(log: str) -> str:
    """The cause of a failed start-up with its fix, from the output of vLLM that never became ready."""
    for pattern, cause in START_FAILURES:
        if re.search(pattern, log):
            return cause
    from vllm_eagle3.tools.serve.process import root_cause, startup_phase

    exc = root_cause(log, max_lines=1)
    where = startup_phase(log)
    return f"{exc or 'vLLM exited without naming an exception'} (start-up reached: {where})"


def served_headless(argv, log: str) -> bool:
    """A ``--headless`` node (workers only: no API server, so no :data:`READY_MARK`) was serving when it ended: its
    executor's worker monitor, which vLLM starts only after every worker reported ready (``multiproc_executor.py``
    ``wait_for_ready`` then ``start_worker_monitor``), logged a worker's death."""
    return "--headless" in argv and _WORKER_DIED.search(log) is not None


def engine_death(log: str, gone: list[str] | None = None, together: list[str] | None = None) -> str:
    """Which process died while serving and why, from vLLM's output (``gone``: names of vLLM processes the
    supervisor saw disappear, first first, e.g. ``VLLM::Worker``; ``together``: those that ended in the same look
    as the first, whose order is the supervisor's best guess: a process killed by a signal before one that exited)."""
    m = _WORKER_DIED.search(log)
    if m and m.group(2) != "None":
        return f"vLLM worker {m.group(1)} {_signal_name(int(m.group(2)))}"
    if m and not gone:
        return (
            f"vLLM worker {m.group(1)} died (vLLM saw no exit code: killed, e.g. by the kernel's OOM killer, or "
            "crashed: its own output above says which)"
        )
    if gone:
        also = f" (with {', '.join(together)} within 0.2 s)" if together else ""
        return (
            f"vLLM process {gone[0]} ended first{also} (killed, e.g. by the kernel's OOM killer, or crashed: its "
            "own output above says which); the engine is dead"
        )
    if _ENGINE_DEAD.search(log):
        from vllm_eagle3.tools.serve.process import root_cause

        exc = root_cause(log, max_lines=1)
        return f"vLLM's engine core died{': ' + exc if exc else ''}"
    return "vLLM's server stopped by itself without a stop signal (its engine is gone)"
