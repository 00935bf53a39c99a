"""Servers shared by the whole test session (test support).

Data flow position: outside the engine, like ``tools/serve/process.py``. A server is keyed by what makes servers
different - its ``vllm-eagle3 serve`` argv and the environment it adds - so every test that can use the same
server gets the same running process, whichever module it is in (tests/conftest.py ``server_pool``). At most
``capacity`` servers are alive at once, fewer when less than ``min_free_gib`` of memory is available (an idle server
costs memory, ~3 GiB with a 1 GiB KV cache, not CPU); asking for one more stops the least recently used, and asking for
that one again starts it anew, said in the log (the module order
in tests/conftest.py keeps such restarts away). A test that kills its server, or needs a fresh one, does not use
the pool.

Servers start with the environment the session had before any in-process engine ran (an offline ``vllm.LLM``
leaves vLLM's own ``LD_PRELOAD`` in ``os.environ``), so a server is the same whatever ran before it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Mapping

from vllm_eagle3.tools.serve.process import VllmServer
from vllm_eagle3.tools.serve.vllm_cpu import mem_available_gib


@dataclasses.dataclass(frozen=True)
class ServerKey:
    """What makes two servers different. ``name`` is for logs only; equal argv + env = the same server."""

    name: str = dataclasses.field(compare=False)
    argv: tuple[str, ...]
    env: tuple[tuple[str, str | None], ...] = ()  # added to / removed from (None) the session's environment

    @classmethod
    def of(cls, name: str, argv: list[str], env: Mapping[str, str | None] | None = None) -> "ServerKey":
        return cls(name, tuple(str(a) for a in argv), tuple(sorted((env or {}).items())))


class ServerPool:
    """``get(key)`` -> a healthy server for ``key``, started on first use and kept for the session."""

    def __init__(
        self,
        base_env: Mapping[str, str],
        cwd: Path,
        *,
        capacity: int = 3,
        min_free_gib: float = 6.0,
        start_timeout: float = 900.0,
        say: Callable[[str], None] = print,
    ) -> None:
        self.base_env = dict(base_env)
        self.cwd = cwd
        self.capacity = capacity
        self.min_free_gib = min_free_gib
        self.start_timeout = start_timeout
        self.say = say
        self.alive: OrderedDict[ServerKey, VllmServer] = OrderedDict()  # least recently used first
        self.startup_s: dict[str, list[float]] = {}

    def get(self, key: ServerKey) -> VllmServer:
        server = self.alive.get(key)
        if server is not None:
            if not server.alive():
                del self.alive[key]
                code = server.proc.returncode
                why = (
                    " (0 with no shutdown in its log: something else in this test process killed and reaped it, "
                    "e.g. supervise() called in-process)"
                    if code == 0
                    else ""
                )
                raise AssertionError(
                    f"shared server {key.name!r} died (exit code {code}{why}) while idle or in an "
                    f"earlier test; log {server.log_path}:\n{server.log_tail(60)}"
                )
            self.alive.move_to_end(key)
            return server
        while self.alive and (len(self.alive) >= self.capacity or mem_available_gib() < self.min_free_gib):
            self.stop(next(iter(self.alive)))
        env = dict(self.base_env)
        for k, v in key.env:
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        server = VllmServer(list(key.argv), cwd=self.cwd, env=env)
        again = (
            f" (start {len(self.startup_s[key.name]) + 1}: it was stopped to make room)"
            if key.name in self.startup_s
            else ""
        )
        self.say(f"starting server {key.name!r}{again}: vllm-eagle3 serve {' '.join(key.argv)} (log {server.log_path})")
        server.start()
        try:
            ready = server.wait_ready(timeout=self.start_timeout, progress=self.say, progress_every=30)
        except BaseException:
            server.stop()
            raise
        self.startup_s.setdefault(key.name, []).append(ready)
        self.say(f"server {key.name!r} ready after {ready:.1f} s")
        self.alive[key] = server
        return server

    def stop(self, key: ServerKey) -> None:
        server = self.alive.pop(key, None)
        if server is not None:
            t0 = time.monotonic()
            code = server.stop()
            self.say(f"server {key.name!r} stopped in {time.monotonic() - t0:.1f} s (exit code {code})")

    def stop_all(self) -> None:
        for key in list(self.alive):
            self.stop(key)
