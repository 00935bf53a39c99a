"""``vllm-eagle3 serve`` ends everything it started on a stop signal, at any phase, within a bound.

Guards the hang seen on main (issue 13): SIGTERM during engine start-up left vLLM's API server alive for 10+ minutes
with its engine core defunct, and once the supervisor existed, a vLLM worker that had moved to a process group of
its own survived a group kill. Here a stand-in "server" ignores SIGTERM and starts a grandchild that leaves the
process group and ignores SIGTERM too: the supervisor must still end both, with exit code 128 + signum.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vllm_eagle3.tools.supervisor import descendants, supervise

pytestmark = pytest.mark.unit

STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen([sys.executable, "-c",
        "import os, signal, time; os.setpgid(0, 0); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    open(sys.argv[1], "w").write(str(grandchild.pid))
    time.sleep(600)
""")

POLITE = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(600)"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _run_in_child(argv, signum, after_s, grace_s):
    """supervise() in a forked helper process (it sets signal handlers and a subreaper flag), signalled after
    ``after_s``; returns (exit code, seconds from signal to exit)."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import sys; from vllm_eagle3.tools.supervisor import supervise; "
                             f"sys.exit(supervise({argv!r}, dict(__import__('os').environ), grace_s={grace_s}))"])
    time.sleep(after_s)
    t0 = time.monotonic()
    proc.send_signal(signum)
    code = proc.wait(timeout=60)
    return code, time.monotonic() - t0


def test_stubborn_server_and_orphaned_grandchild_are_killed_after_the_grace(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code, took = _run_in_child([sys.executable, "-c", STUBBORN, str(pidfile)], signal.SIGTERM, 3.0, grace_s=1.0)
    assert code == 128 + signal.SIGTERM
    assert took < 10, f"stop took {took:.1f} s"
    grandchild = int(pidfile.read_text())
    time.sleep(0.5)
    assert not _alive(grandchild), "the grandchild in its own process group survived the stop"


def test_polite_server_stops_on_the_forwarded_signal_without_waiting_the_grace():
    code, took = _run_in_child([sys.executable, "-c", POLITE], signal.SIGINT, 1.5, grace_s=30.0)
    assert code == 128 + signal.SIGINT
    assert took < 10, f"a server that exits on SIGTERM should not wait the 30 s grace ({took:.1f} s)"


def test_exit_code_of_an_unsignalled_server_is_passed_through():
    assert supervise([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)) == 3


def test_descendants_walks_the_tree():
    proc = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                             "'import time; time.sleep(30)']); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(proc.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(descendants(proc.pid)) == 1
        assert proc.pid in descendants(os.getpid())
    finally:
        for pid in descendants(proc.pid) + [proc.pid]:
            os.kill(pid, signal.SIGKILL)
        proc.wait()
