"""Every environment variable this project reads, one entry each (name, default, parser, meaning), read through getters.

Data flow position: configuration, read by the plugin in every vLLM process, by ``model_patches`` (also in SGLang's
venv: this module is stdlib-only so it imports there) and by the commands before vLLM starts. In the style of vLLM's
``vllm/envs.py``: ``envs.EAGLE3_SPEC`` is the parsed value from ``os.environ``; ``envs.get(name, environ)`` reads a
given mapping (the environment a child will get). Nothing else reads a variable directly; tests/unit/test_envs.py
scans the sources for such reads. The project's names avoid vLLM's reserved ``VLLM_`` prefix (vLLM warns about
unknown ``VLLM_*`` names); the old ``VLLM_EAGLE3_*`` names still work, with one deprecation line per process.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from vllm_eagle3 import LOGGER

logger = logging.getLogger(LOGGER)

# Names, for the modules that set a variable for a child or name it in a message (a read goes through get()).
SPEC = "EAGLE3_SPEC"
CONVENTION = "EAGLE3_CONVENTION"
SKIP_PATCHES = "EAGLE3_SKIP_PATCHES"
CPU_MLA_VERIFY_AS_DECODE = "EAGLE3_CPU_MLA_VERIFY_AS_DECODE"
SERVE_LOG = "EAGLE3_SERVE_LOG"
CHECK_DIR = "EAGLE3_CHECK_DIR"
HOME = "EAGLE3_HOME"
EMULATED_ISA = "EAGLE3_EMULATED_ISA"
LIVE_K_STEP_LOG = "EAGLE3_LIVE_K_STEP_LOG"
SERVE_CHILD = "_EAGLE3_SERVE_CHILD"
PLUGINS = "VLLM_PLUGINS"
CPU_KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"
MALLOC_KNOBS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)
"""glibc malloc settings: any one set means the user chose (GLIBC_TUNABLES counts when it has glibc.malloc.*)."""
ONEDNN_CACHE = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")
"""oneDNN reads either name."""


def _text(value: str) -> str | None:
    """A free-text value; empty counts as unset."""
    return value or None


def _names(value: str) -> frozenset[str]:
    """Comma-separated names, blanks ignored: "a, b," -> {"a", "b"}."""
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def _flag_default_on(name: str) -> Callable[[str], bool]:
    def parse(value: str) -> bool:
        value = value.strip()
        if value not in ("", "0", "1"):
            raise ValueError(f"{name}={value!r}: use 0 or 1 (unset means 1)")
        return value != "0"

    return parse


def _flag(value: str) -> bool:
    return value.strip() == "1"


def _isa(value: str) -> str | None:
    """The instruction set a process emulates: only ``avx2`` (vLLM-CPU ships AVX2, AVX-512 and AVX-512 BF16 kernels)."""
    value = value.strip().lower()
    if value not in ("", "avx2"):
        raise ValueError(f"{EMULATED_ISA}={value!r}: the only one is avx2 (set by `vllm-eagle3 emulate avx2`)")
    return value or None


@dataclass(frozen=True)
class Var:
    """One variable: ``parse`` turns the raw string into the value; ``default`` is the value when unset."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    deprecated: str | None = None  # an older name still accepted (with one deprecation line per process)


_VARS = (
    # ------------------------------------------------------------------------------------------ the project's own
    Var(
        SPEC,
        None,
        _text,
        "Path of a capture-spec YAML (taps: [embed, 3, 31]); the fallback when --additional-config carries none.",
        "VLLM_EAGLE3_SPEC",
    ),
    Var(
        CONVENTION,
        None,
        _text,
        "Convention the draft config's ids are written in (vllm, sglang-legacy, ...) when there is no spec.",
        "VLLM_EAGLE3_CONVENTION",
    ),
    Var(
        SKIP_PATCHES,
        frozenset(),
        _names,
        "Comma-separated engine patches (model_patches) to leave out.",
        "VLLM_EAGLE3_SKIP_PATCHES",
    ),
    Var(
        CPU_MLA_VERIFY_AS_DECODE,
        True,
        _flag_default_on(CPU_MLA_VERIFY_AS_DECODE),
        "0: verify speculative tokens on vLLM-CPU's own MLA prefill path; unset / 1: on its decode kernel.",
        "VLLM_EAGLE3_CPU_MLA_VERIFY_AS_DECODE",
    ),
    Var(
        SERVE_LOG,
        None,
        _text,
        "File where `vllm-eagle3 serve` keeps vLLM's whole output; unset: a new file in the temp folder.",
        "VLLM_EAGLE3_SERVE_LOG",
    ),
    Var(
        CHECK_DIR,
        None,
        _text,
        "Folder of the online wiring check's engine<i>.json; unset: made by the first vLLM process, inherited.",
        "VLLM_EAGLE3_CHECK_DIR",
    ),
    Var(
        HOME,
        None,
        _text,
        "A vllm-eagle3 clone whose models/ and configs/ demo, bench and soak use by default; unset: the clone this "
        "package is installed from (editable), else the current folder.",
    ),
    Var(
        EMULATED_ISA,
        None,
        _isa,
        "Set by `vllm-eagle3 emulate avx2`: host facts read as an AVX2-only CPU (AVX-512 and AMX flags hidden).",
    ),
    Var(
        LIVE_K_STEP_LOG,
        None,
        _text,
        "File where live k appends one JSON line per engine step (batch, k, cost sample or not, seconds); unset: none "
        "(`vllm-eagle3 live-k-trace` sets it).",
    ),
    Var(
        SERVE_CHILD,
        False,
        _flag,
        "Internal: marks the supervised child of `vllm-eagle3 serve` (never set it yourself).",
        "_VLLM_EAGLE3_SERVE_CHILD",
    ),
    # ------------------------------------------------------------------------------------------ vLLM's, read or set
    Var(
        PLUGINS,
        None,
        _text,
        "vLLM's plugin allowlist; unset: `serve` names every installed plugin plus the watch's endpoint route.",
    ),
    Var(
        CPU_KVCACHE_SPACE,
        None,
        _text,
        "vLLM-CPU's KV cache in GiB; unset (and no --gpu-memory-utilization): `serve` picks 1-4 GiB.",
    ),
    Var("VLLM_CPU_OMP_THREADS_BIND", "auto", str, "vLLM-CPU's OpenMP thread binding; recorded with benchmarks."),
    Var(
        "VLLM_PP_LAYER_PARTITION",
        None,
        _text,
        "vLLM's pipeline-parallel layer split: read to refuse a tap a non-last stage would drop.",
    ),
    Var(
        "VLLM_ALLOW_INSECURE_SERIALIZATION",
        None,
        _text,
        "Set to 1 while the doctor's --engine vllm brings recorded tensors back from the worker.",
    ),
    Var("LD_PRELOAD", "", str, "Read to keep one OpenMP runtime; `serve` puts Intel OpenMP first on vLLM-CPU."),
    *(
        Var(n, None, _text, "glibc malloc setting: any set means `serve` leaves the allocator alone on vLLM-CPU.")
        for n in MALLOC_KNOBS
    ),
    Var("GLIBC_TUNABLES", "", str, "glibc tunables; a glibc.malloc.* entry means `serve` leaves the allocator alone."),
    *(
        Var(n, None, _text, "oneDNN's primitive cache size: set means `serve` leaves it alone (else 64 on vLLM-CPU).")
        for n in ONEDNN_CACHE
    ),
)
VARIABLES: dict[str, Var] = {v.name: v for v in _VARS}

_warned = threading.Event()


def _entry(name: str) -> Var:
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(
            f"{name!r} is not an environment variable of vllm_eagle3/envs.py; add an entry there "
            f"(known: {', '.join(VARIABLES)})"
        ) from None


def _warn_deprecated(env: Mapping[str, str]) -> None:
    """One line per process, naming every old name set and its new name."""
    if _warned.is_set():
        return
    old = [f"{v.deprecated} -> {v.name}" for v in _VARS if v.deprecated and v.deprecated in env]
    if old:
        _warned.set()
        logger.warning(
            "vllm-eagle3: deprecated environment variable names (vLLM reserves VLLM_*): %s; rename them", ", ".join(old)
        )


def raw(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The unparsed value of ``name`` (or of its deprecated name) in ``environ`` (default ``os.environ``); None if
    unset. For saving and restoring a value exactly; everything else uses :func:`get`."""
    var, env = _entry(name), os.environ if environ is None else environ
    if name in env:
        return env[name]
    if var.deprecated and var.deprecated in env:
        _warn_deprecated(env)
        return env[var.deprecated]
    return None


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``name`` (or its deprecated name) is present in ``environ``, even empty."""
    return raw(name, environ) is not None


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of ``name`` in ``environ`` (default ``os.environ``), or the entry's default when unset."""
    value = raw(name, environ)
    return _entry(name).default if value is None else _entry(name).parse(value)


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *VARIABLES])
