"""Stop signals that end ``vllm-eagle3 serve`` and everything it started, at any phase, within a bound.

Data flow position: outside the engine, around it. ``vllm-eagle3 serve`` validates, then runs vLLM's server in a
child process and stays as its supervisor (a few MB, no vLLM import). Why: vLLM 0.32's API server turns a
SIGTERM that arrives during engine start-up into a ``KeyboardInterrupt`` whose clean-up can wait forever on an
engine core that already died (seen: API server alive 10+ minutes, engine core defunct); once serving, vLLM exits
on SIGTERM in under a second. Orchestrators, ``timeout`` and Ctrl-C send these signals at any phase.

The supervisor is a child subreaper: vLLM's API server, engine core and workers (which vLLM moves to process groups
of their own) stay below it in the process tree even when orphaned. On SIGTERM / SIGINT / SIGHUP it forwards SIGTERM
to vLLM's API server (vLLM's own graceful shutdown), waits up to :data:`STOP_GRACE_S`, then SIGKILLs every process
still below it, and exits
``128 + signal number`` with one line saying what happened. A second signal skips the wait. If the supervisor itself
is killed, the kernel kills vLLM's API server (``PR_SET_PDEATHSIG``).

Without a signal vLLM's server ends only when something failed, and vLLM 0.32 exits 0 even after its engine died.
The supervisor passes vLLM's output through, keeps it in a log file and its end in memory, and then exits
``failures.EXIT_START_FAILED`` (1) when vLLM never became ready or ``failures.EXIT_ENGINE_DIED`` (3) when it died
while serving, after one ``vllm-eagle3: error:`` line naming the cause (``failures.py``) and the log file, with
nothing left running.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

import psutil

from vllm_eagle3 import envs
from vllm_eagle3.tools.serve import failures

STOP_GRACE_S = 20.0
"""Seconds vLLM gets to shut down after a stop signal before its process group is killed (the whole stop stays
well inside the 30 s an orchestrator typically allows before its own SIGKILL)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def _child_setup() -> None:  # pragma: no cover - runs in the child between fork and exec
    """A process group of its own (a terminal's Ctrl-C reaches the supervisor, which forwards it), and a SIGKILL
    from the kernel when the supervisor dies."""
    os.setpgid(0, 0)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)
    except OSError:
        pass


def descendants(root: int) -> list[int]:
    """PIDs below ``root`` in the process tree (psutil), each parent before its children."""
    try:
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_descendants() -> int:
    """SIGKILL every process below this one and reap them; how many were signalled. This process is a child
    subreaper (set in :func:`supervise`), so engine processes orphaned by a dead API server are still below it."""
    victims = descendants(os.getpid())
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
    return len(victims)


def exit_on_stop_signals() -> None:
    """Before anything is started: a stop signal exits with ``128 + signum`` and one line (no traceback)."""

    def on_signal(signum, _frame) -> None:
        _say(f"{signal.Signals(signum).name} before vLLM started: stopped")
        raise SystemExit(128 + signum)

    for s in STOP_SIGNALS:
        signal.signal(s, on_signal)


LOG_ENV = envs.SERVE_LOG
"""Where ``serve`` keeps vLLM's whole output (default: a new file in the temp folder, named at start-up)."""


class OutputTee:
    """Copies the child's output to this process's stdout and a log file, keeping the last lines and whether vLLM
    said it is ready."""

    def __init__(self, stream, log_path: Path, keep: int = 3000) -> None:
        self.log_path = log_path
        self.tail: collections.deque[str] = collections.deque(maxlen=keep)
        self.ready = False
        self._stream = stream
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        out = sys.stdout.buffer
        with open(self.log_path, "ab") as log:
            for raw in iter(self._stream.readline, b""):
                for sink in (out, log):
                    try:
                        sink.write(raw)
                        sink.flush()
                    except (OSError, ValueError):
                        pass
                line = raw.decode("utf-8", "replace")
                self.tail.append(line)
                if failures.READY_MARK in line:
                    self.ready = True

    def end_line(self) -> None:
        """End vLLM's last line if it had no newline, so that the next line ``serve`` prints starts a line."""
        if self.tail and not self.tail[-1].endswith("\n"):
            try:
                sys.stdout.buffer.write(b"\n")
                sys.stdout.buffer.flush()
            except (OSError, ValueError):
                pass

    def text(self, wait_s: float = 5.0) -> str:
        self._thread.join(timeout=wait_s)
        return "".join(self.tail)


def _ended(pid: int) -> int | None:
    """``None`` while ``pid`` runs; once it has ended: the signal that killed it if it is a zombie whose parent has
    not reaped it yet (the ``waitpid`` status, ``/proc/<pid>/stat`` field 52: psutil does not give it), else 0."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return None
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (psutil.NoSuchProcess, OSError):
        return 0
    status = int(fields[49]) if len(fields) > 49 else 0
    return status & 0x7F


def _look(seen: dict[int, str], gone: list[list[str]], rescan: bool = True) -> dict[int, str]:
    """Add to ``gone`` the vLLM processes of ``seen`` that have ended since the last look (one list per look), and
    return the processes running now (``rescan``: also look for new ones, a walk of the process table; without it only
    ``seen``'s few processes are read, cheap enough for every 0.2 s). Processes that end between two looks are
    ordered by what ended them: one killed by a signal (a zombie not yet reaped says which) before one that exited,
    then the oldest (lowest pid) first. A SIGKILLed worker and the engine core that shuts down because of it can end
    within one look; the signal says which went first."""
    ended = {pid: _ended(pid) for pid in seen}
    now = {pid: name for pid, name in seen.items() if ended[pid] is None}
    new = sorted((pid for pid, how in ended.items() if how is not None), key=lambda pid: (not ended[pid], pid))
    named = {name for group in gone for name in group}
    names = [seen[pid] for pid in new if seen[pid] not in named]
    if names:
        gone.append(names)
    if rescan:  # a zombie's cmdline is empty: only running processes are listed
        now.update(_vllm_processes())
    return now


def _vllm_processes() -> dict[int, str]:
    """vLLM's processes below this one that named themselves (``VLLM::EngineCore``, ``VLLM::Worker...``)."""
    out = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        if argv and argv[0].startswith("VLLM::"):
            out[proc.pid] = argv[0].strip()
    return out


def supervise(argv: Sequence[str], env: Mapping[str, str], grace_s: float = STOP_GRACE_S) -> int:
    """Run ``argv`` as a child (own process group, this process its subreaper) and return its exit code, or
    ``128 + signum`` after a stop signal, or a failure code (see the module docstring)."""
    got: list[int] = []

    def on_signal(signum, _frame) -> None:
        got.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    log_path = Path(envs.get(LOG_ENV, env) or tempfile.mkstemp(prefix="vllm-eagle3-serve-", suffix=".log")[1])
    _say(f"vLLM's output is also kept in {log_path}")
    try:
        child = subprocess.Popen(
            list(argv), env=dict(env), preexec_fn=_child_setup, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        tee = OutputTee(child.stdout, log_path)
        deadline = None
        forwarded = 0
        seen: dict[int, str] = {}
        gone: list[list[str]] = []  # the vLLM processes that ended, one list per look
        next_look = 0.0
        while True:
            try:
                code = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if not got:  # which vLLM process ends first, when nobody asked: every 0.2 s, new ones every 1 s
                rescan = time.monotonic() >= next_look
                seen = _look(seen, gone, rescan)
                if rescan:
                    next_look = time.monotonic() + 1.0
            if got and deadline is None:
                deadline = time.monotonic() + (0.0 if len(got) > 1 else grace_s)
            if got and forwarded < len(got):
                forwarded = len(got)
                try:
                    child.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if deadline is not None and (len(got) > 1 or time.monotonic() >= deadline):
                killed = kill_descendants()
                tee.text()
                tee.end_line()
                _say(
                    f"{signal.Signals(got[0]).name}: vLLM did not stop within {grace_s:.0f} s; killed its "
                    f"{killed} remaining process(es)"
                )
                return 128 + got[0]
        if not got:
            _look(seen, gone)  # the API server may end within a second of the process that died first
        leftovers = kill_descendants()  # engine processes that outlived the API server
        if got:
            tee.text()  # vLLM's last words (a child's exit message may lack a newline) before the stop line
            tee.end_line()
            extra = f"; killed {leftovers} leftover process(es)" if leftovers else ""
            _say(f"{signal.Signals(got[0]).name}: vLLM stopped (exit code {code}){extra}")
            return 128 + got[0]
        log = tee.text()
        tee.end_line()
        if tee.ready or failures.served_headless(argv, log):
            death = failures.engine_death(log, [name for group in gone for name in group], gone[0][1:] if gone else [])
            _say(f"error: the engine died while serving: {death}; vLLM exited with code {code}; full log: {log_path}")
            return failures.EXIT_ENGINE_DIED
        _say(f"error: vLLM did not start: {failures.start_failure(log)}; full log: {log_path}")
        return code if code == 2 else failures.EXIT_START_FAILED
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _say(text: str) -> None:
    print(f"vllm-eagle3: {text}", file=sys.stderr, flush=True)
