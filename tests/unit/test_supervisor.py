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
from pathlib import Path

import pytest

from vllm_eagle3.tools.serve.supervisor import descendants

pytestmark = pytest.mark.unit

STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen([sys.executable, "-c",
        "import os, signal, time; os.setpgid(0, 0); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    open(sys.argv[1], "w").write(str(grandchild.pid))
    time.sleep(600)
""")

POLITE = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
    "open(sys.argv[1], 'w').write('up'); time.sleep(600)"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _supervisor(argv, grace_s: float | None = None) -> list[str]:
    """The command that runs supervise(``argv``) in a process of its own. Never call supervise() in the test
    process: it makes its process a subreaper and, when vLLM ends, SIGKILLs and reaps every process below it, which
    in a pytest-xdist worker are the shared vLLM servers of the e2e tests (CI saw one found dead, "exit code 0":
    Popen's answer for a child someone else reaped)."""
    grace = "" if grace_s is None else f", grace_s={grace_s}"
    return [
        sys.executable,
        "-c",
        "import os, sys; from vllm_eagle3.tools.serve.supervisor import supervise; "
        f"sys.exit(supervise({list(argv)!r}, dict(os.environ){grace}))",
    ]


def _run_in_child(argv, signum, ready: Path, grace_s):
    """supervise() in a helper process, signalled once the server it started has written ``ready`` (so the
    supervisor's handlers are in place: it installs them before it starts the server; a fixed sleep lost that race
    on a loaded CI box and Python's default SIGINT ended the helper). Returns (exit code, the supervisor's stderr)."""
    proc = subprocess.Popen(_supervisor(argv, grace_s), stderr=subprocess.PIPE, text=True)
    try:
        while not (ready.exists() and ready.read_text()):
            assert proc.poll() is None, f"the supervisor ended before its server was up: {proc.stderr.read()}"
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err


def test_stubborn_server_and_orphaned_grandchild_are_killed_after_the_grace(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code, err = _run_in_child([sys.executable, "-c", STUBBORN, str(pidfile)], signal.SIGTERM, pidfile, grace_s=1.0)
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM: vLLM did not stop within 1 s; killed its 2 remaining process(es)" in err, err
    assert not _alive(int(pidfile.read_text())), "the grandchild in its own process group survived the stop"


def test_polite_server_stops_on_the_forwarded_signal_without_waiting_the_grace(tmp_path):
    """The supervisor's own line tells whether it waited: "vLLM stopped (exit code 0)" (the server took the forwarded
    SIGTERM) and not "did not stop within 30 s; killed" (the grace ran out)."""
    ready = tmp_path / "ready"
    code, err = _run_in_child([sys.executable, "-c", POLITE, str(ready)], signal.SIGINT, ready, grace_s=30.0)
    assert code == 128 + signal.SIGINT, err
    assert "SIGINT: vLLM stopped (exit code 0)" in err and "killed" not in err, err


def _fake_vllm(tmp_path, script: str, *args: str) -> tuple[int, str, str]:
    """``script`` as vLLM under the supervisor (in a process of its own); its exit code, stdout and stderr."""
    env = {**os.environ, "EAGLE3_SERVE_LOG": str(tmp_path / "serve.log")}
    proc = subprocess.run(
        _supervisor([sys.executable, "-c", script, *args]), env=env, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_the_helper_leaves_the_test_process_children_alone(tmp_path):
    """Guards the suite itself: the shared vLLM servers of a pytest-xdist worker are its children, and supervise()
    SIGKILLs every process below the process it runs in once vLLM has ended."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        code, _, _ = _fake_vllm(tmp_path, "print('INFO:     Application startup complete.', flush=True)")
        assert code == 3
        assert bystander.poll() is None, f"the supervisor killed a process of the test's own ({bystander.returncode})"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_server_that_dies_after_start_up_exits_3_naming_the_process(tmp_path):
    """Guards issue 27: vLLM 0.32's API server exits 0 after its engine died (a worker SIGKILLed, as the OOM killer
    does): systemd / Docker `on-failure` would not restart it. Exit 3 and one line naming the worker and signal."""
    code, out, err = _fake_vllm(
        tmp_path,
        (
            "print('INFO:     Application startup complete.', flush=True); "
            "print('(EngineCore pid=7) ERROR 12-02 10:00:00 [multiproc_executor.py:316] Worker proc VllmWorker-0 died "
            "unexpectedly (exit code: -9), shutting down executor.', flush=True)"
        ),
    )
    assert code == 3, err
    assert "Application startup complete" in out  # vLLM's output still reaches the user
    line = err.strip().splitlines()[-1]
    assert line.startswith(
        "vllm-eagle3: error: the engine died while serving: vLLM worker VllmWorker-0 was killed "
        "by SIGKILL (what the kernel's OOM killer sends"
    ), line
    assert f"full log: {tmp_path / 'serve.log'}" in line
    assert "died unexpectedly" in (tmp_path / "serve.log").read_text()


WORKER_KILLED = (
    "print('(Worker pid=7) ERROR 12-02 10:00:00 [multiproc_executor.py:315] Worker proc VllmWorker-1 "
    "died unexpectedly (exit code: -9), shutting down executor.', flush=True)"
)


def test_a_headless_node_whose_worker_dies_while_serving_exits_3_not_did_not_start(tmp_path):
    """A ``--headless`` node (workers only) never prints uvicorn's ready line; its executor's worker monitor runs only
    after every worker was ready, so a death it logs is a death while serving (it was reported as "vLLM did not
    start", exit 1). Without --headless the same output without the ready line is still a failed start."""
    code, _, err = _fake_vllm(tmp_path, WORKER_KILLED, "serve", "--headless")
    line = err.strip().splitlines()[-1]
    assert code == 3 and line.startswith(
        "vllm-eagle3: error: the engine died while serving: vLLM worker VllmWorker-1 was killed by SIGKILL"
    ), line
    code, _, err = _fake_vllm(tmp_path, WORKER_KILLED, "serve")
    assert code == 1 and "vLLM did not start" in err.strip().splitlines()[-1]
    # what a real headless node logged when its worker was SIGKILLed (the monitor looked before the reap)
    code, _, err = _fake_vllm(tmp_path, WORKER_KILLED.replace("-9", "None"), "serve", "--headless")
    line = err.strip().splitlines()[-1]
    assert code == 3 and "the engine died while serving: vLLM worker VllmWorker-1 died (vLLM saw no exit code" in line


def test_a_server_that_never_starts_exits_1_with_the_cause_and_the_fix(tmp_path):
    code, _, err = _fake_vllm(
        tmp_path,
        (
            "import sys; print('RuntimeError: expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8', "
            "file=sys.stderr); raise SystemExit(1)"
        ),
    )
    line = err.strip().splitlines()[-1]
    assert code == 1 and line.startswith("vllm-eagle3: error: vLLM did not start: the attention backend cannot load")
    assert "--dtype bfloat16" in line and "full log:" in line


def test_vllms_own_usage_error_keeps_exit_2(tmp_path):
    code, _, err = _fake_vllm(
        tmp_path,
        "import sys; print('vllm serve: error: unrecognized arguments: --bogus', file=sys.stderr); raise SystemExit(2)",
    )
    assert code == 2 and "vllm-eagle3: error: vLLM did not start" in err


def test_descendants_walks_the_tree():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(30)']); time.sleep(30)",
        ]
    )
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


def test_the_error_line_starts_a_line_after_output_without_a_newline(tmp_path):
    """Seen when the engine core was SIGKILLed: vLLM's last output (a nanobind leak notice) had no newline, and the
    one error line was glued to it, so a reader looking for lines starting with `vllm-eagle3: error:` found none."""
    code, out, err = _fake_vllm(
        tmp_path,
        "import sys; print('Application startup complete.', flush=True); "
        "sys.stdout.write('See https://nanobind.readthedocs.io'); sys.stdout.flush()",
    )
    assert code == 3 and out.endswith("nanobind.readthedocs.io\n"), repr(out[-80:])
    assert err.strip().splitlines()[-1].startswith("vllm-eagle3: error: the engine died while serving")


def test_of_two_processes_ended_between_looks_the_killed_one_is_named_first():
    """CI saw it: the worker SIGKILLed, the engine core shut down within the same 1 s look, and the older engine
    core was named as the process that died. A zombie still says what ended it, so the killed one comes first
    whatever the pids."""
    from vllm_eagle3.tools.serve.supervisor import _look

    exits = subprocess.Popen([sys.executable, "-c", "pass"])  # lower pid: would win on age alone
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    seen = {exits.pid: "VLLM::EngineCore", killed.pid: "VLLM::Worker"}
    gone: list[list[str]] = []
    try:
        os.kill(killed.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z" for p in seen):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _look(seen, gone, rescan=False) == {}
        assert gone == [["VLLM::Worker", "VLLM::EngineCore"]]  # one look, the killed one first
    finally:
        for p in (exits, killed):
            p.kill()
            p.wait()
