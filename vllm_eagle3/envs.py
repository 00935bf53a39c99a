"""Every environment variable this project reads, with its default and meaning, in one place.

Data flow position: configuration, read by the plugin in every vLLM process and by the commands before vLLM starts.
Other modules import the names from here (``model_patches`` keeps its own two, listed below with a pointer: it is
also loaded in SGLang's venv, which does not import this package). tests/unit/test_envs.py fails when a
``VLLM_EAGLE3_*`` name appears anywhere in the package without being listed here.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------------------------- the project's own

SPEC = "VLLM_EAGLE3_SPEC"
"""Path of the capture-spec YAML (``taps: [embed, 3, 31]``) the plugin captures; default: none. Set by
``vllm-eagle3 serve --capture-spec``; read by the plugin in every vLLM process and by the wiring watch."""

CONVENTION = "VLLM_EAGLE3_CONVENTION"
"""Convention the draft config's ids are written in (``vllm``, ``sglang-legacy``, ...) when there is no spec; default:
none (a draft with ids and neither is refused). Set by ``vllm-eagle3 serve --convention``."""

SKIP_PATCHES = "VLLM_EAGLE3_SKIP_PATCHES"
"""Comma-separated engine patches to leave out (``model_patches/__init__.py`` ``SKIP_ENV``); default: none."""

CPU_MLA_VERIFY_AS_DECODE = "VLLM_EAGLE3_CPU_MLA_VERIFY_AS_DECODE"
"""``0`` verifies speculative tokens on vLLM-CPU's own MLA prefill path; unset / ``1``: on the decode kernel
(``model_patches/vllm_cpu_mla_verify_decode.py`` ``ENV``)."""

SERVE_LOG = "VLLM_EAGLE3_SERVE_LOG"
"""File where ``vllm-eagle3 serve`` keeps vLLM's whole output; default: a new file in the temp folder, named at
start-up."""

CHECK_DIR = "VLLM_EAGLE3_CHECK_DIR"
"""Folder where each engine's online wiring check writes ``engine<i>.json`` (read by ``GET /v1/eagle3/wiring`` and the
gauges); default: a new folder in the temp folder, made by the first vLLM process and inherited by the engine's."""

SERVE_CHILD = "_VLLM_EAGLE3_SERVE_CHILD"
"""Internal: marks the supervised child process of ``vllm-eagle3 serve`` (never set it yourself)."""

# ----------------------------------------------------------------------------------------------- vLLM's, read or set

VLLM_PLUGINS = "VLLM_PLUGINS"
"""vLLM's plugin allowlist. Unset: ``serve`` names every installed plugin plus the wiring watch's endpoint route."""

CPU_KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM-CPU's KV cache in GiB. Unset (and no ``--gpu-memory-utilization``): ``serve`` picks 1-4 GiB from free memory."""

PP_LAYER_PARTITION = "VLLM_PP_LAYER_PARTITION"
"""vLLM's pipeline-parallel layer split: read to refuse a tap a non-last stage would drop."""

ALLOW_INSECURE_SERIALIZATION = "VLLM_ALLOW_INSECURE_SERIALIZATION"
"""Set to 1 while the doctor's ``--engine vllm`` brings recorded tensors back from the worker."""

LD_PRELOAD = "LD_PRELOAD"
"""Read to keep exactly one OpenMP runtime; ``serve`` puts Intel OpenMP first on vLLM-CPU when none is there."""

MALLOC_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                "MALLOC_ARENA_MAX", "GLIBC_TUNABLES")
"""glibc malloc settings: any of them set means ``serve`` leaves the allocator alone on vLLM-CPU."""

ONEDNN_CACHE = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")
"""oneDNN's primitive cache size: set means ``serve`` leaves it alone (else 64 on vLLM-CPU)."""

ALL = (SPEC, CONVENTION, SKIP_PATCHES, CPU_MLA_VERIFY_AS_DECODE, SERVE_LOG, CHECK_DIR, SERVE_CHILD, VLLM_PLUGINS,
       CPU_KVCACHE_SPACE, PP_LAYER_PARTITION, ALLOW_INSECURE_SERIALIZATION, LD_PRELOAD, *MALLOC_KNOBS, *ONEDNN_CACHE)
