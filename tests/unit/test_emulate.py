"""``vllm-eagle3 emulate avx2``: a command's Python processes see the CPU as AVX2-only (torch's feature tests, the
plugin's flags, the results' machine record), checked in real child processes on this host. The engine path (vLLM
loads ``_C_AVX2`` and serves the same tokens) is tests/e2e/test_avx2_kernels.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_eagle3 import cpu_attention, envs
from vllm_eagle3.tools import emulate

pytestmark = pytest.mark.unit

WIDE = {"avx512f", "amx_tile"} & cpu_attention.cpu_flags()


def test_environ_puts_the_site_folder_first_and_keeps_the_rest():
    env = emulate.environ({"PYTHONPATH": "/a:/b", "HOME": "/h"})
    assert env["PYTHONPATH"] == f"{emulate.SITE}:/a:/b" and env["HOME"] == "/h"
    assert (env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"], env["EAGLE3_EMULATED_ISA"]) == (
        "avx2",
        "AVX2",
        "avx2",
    )
    assert emulate.environ({})["PYTHONPATH"] == str(emulate.SITE)
    # compiled kernels apart from the host's own: a cached AVX-512 kernel under AVX2 dispatch broke TP=2
    assert all(env[k] == v and "emulate-avx2" in v for k, v in emulate.CACHES.items())
    assert set(emulate.CACHES) == {"TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT"}
    assert (emulate.SITE / "sitecustomize.py").is_file()


def test_an_unknown_isa_in_the_environment_is_refused_with_the_fix():
    assert envs.get("EAGLE3_EMULATED_ISA", {"EAGLE3_EMULATED_ISA": "AVX2"}) == "avx2"
    with pytest.raises(ValueError, match="the only one is avx2"):
        envs.get("EAGLE3_EMULATED_ISA", {"EAGLE3_EMULATED_ISA": "avx512"})


def test_flags_hide_avx512_and_amx_only_when_emulating(monkeypatch):
    monkeypatch.delenv("EAGLE3_EMULATED_ISA", raising=False)
    real = cpu_attention.cpu_flags()
    monkeypatch.setenv("EAGLE3_EMULATED_ISA", "avx2")
    seen = cpu_attention.cpu_flags()
    assert seen == {f for f in real if not f.startswith(("avx512", "amx"))}
    assert cpu_attention.hardware_flags() == real  # what emulate and the results' record read: the CPU's own
    assert not cpu_attention.host_has_amx()
    # an explicit cpuinfo text is read as given (what the unit tests of the backend choice fake)
    assert cpu_attention.cpu_flags("flags\t: avx2 avx512f amx_tile\n") == {"avx2", "avx512f", "amx_tile"}


@pytest.mark.skipif(not WIDE, reason="this CPU has neither AVX-512 nor AMX: nothing for the emulation to hide")
def test_a_child_process_sees_an_avx2_cpu_and_records_it_as_emulated():
    """The whole chain in one real child: the site hook patched torch.cpu as torch imported it, ATen dispatches AVX2,
    the plugin's flags and the results' machine record say AVX2 and that it is emulated (never a real AVX2 host)."""
    code = (
        "import json, torch; from vllm_eagle3.tools.machine import machine_info; m = machine_info(); "
        "print(json.dumps([torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported(), "
        "torch.cpu._is_amx_tile_supported(), torch.backends.cpu.get_cpu_capability(), m['flags'], "
        "m.get('emulated')]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=emulate.environ(), capture_output=True, text=True, timeout=300, check=True
    ).stdout
    avx512, bf16, amx, capability, flags, emulated = json.loads(out.strip().splitlines()[-1])
    assert (avx512, bf16, amx, capability) == (False, False, False, "AVX2")
    assert flags == "avx2" and emulated.startswith("vllm-eagle3 emulate avx2 on a CPU with")
    assert all(f in emulated for f in WIDE)


def test_the_command_refuses_no_command_and_a_missing_one(capsys):
    with pytest.raises(SystemExit):
        emulate.main(["avx2"])
    assert "no command" in capsys.readouterr().err
    if "avx2" in cpu_attention.cpu_flags():
        assert emulate.main(["avx2", "--", "no-such-command-here"]) == 127
        assert "command not found" in capsys.readouterr().err
