"""The multi-node tests' ``--master-port`` (``vllm_eagle3.testing.nodes.quiet_port``) lies below the kernel's ephemeral
port range, where no outgoing connection or ``bind(0)`` of another test can take it before node 0 binds it (a
fresh-clone ``make test`` lost test_headless_node_worker_death_exits_3 to ``EADDRINUSE`` on a port from that range)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from vllm_eagle3.testing.nodes import quiet_port

pytestmark = pytest.mark.unit


def test_master_ports_are_free_and_below_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [quiet_port() for _ in range(20)]
    assert all(20000 <= p < low for p in ports), ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[0]))  # free when handed out
