"""The two shims SGLang 0.5.23 needs to import on a CPU-only machine, and the proof they stay unused.

Where this sits: ``runner.py`` (executed by ``.venv-sglang/bin/python``) calls :func:`install` before it
imports anything from ``sglang``; the parity tests then compare the taps SGLang's real DeepseekV2 / KimiK25
code captured. Nothing here is installed into the venv: the shims live only in the runner's process.

1. ``sgl_kernel`` (PyPI ``sglang-kernel``) has no CPU build on PyPI, yet ~130 SGLang modules import it at
   module top. :class:`_KernelStubFinder` answers every ``sgl_kernel`` / ``sgl_kernel.*`` import with a stub
   module whose attributes are :class:`StubKernel` objects: calling one RECORDS the call in :data:`CALLS`
   and raises. The runner asserts :data:`CALLS` is empty after the compared forward
   (:func:`assert_no_stub_called`), so a stub can never stand in for a function the compared path uses —
   even if some SGLang code caught the exception and fell back silently.
2. ``torchvision::nms`` / ``torchvision::qnms``: ``sglang.srt.configs`` imports torchvision at module top
   (InternVL utils). PyPI's torchvision 0.28 (the torch 2.13 pair) is CUDA-linked: its C extension does not
   load next to the CPU torch, so the ops are never defined, and ``torchvision/_meta_registrations.py``
   then dies registering fake kernels for exactly these two operators. :func:`_define_nms_schema` defines
   ONLY the two schemas (no kernel): a real call of ``torch.ops.torchvision.nms`` would still fail loudly
   ("no kernel registered"), and the compared path (an MLA/MoE text forward, the Kimi vision tower) has no
   detection ops. Only torchvision's pure-Python transforms are usable.
3. DeepSeek attention dispatch for ``torch_native`` (:func:`route_torch_native_to_mla`): SGLang picks the
   DeepSeek attention forward method per backend name (``models/deepseek_common/attention_backend_handler.py``
   ``AttentionBackendRegistry``); ``torch_native`` has no entry and falls back to the ``triton`` handler, which
   chooses the non-absorbed MHA prefill. ``torch_native`` cannot run that against the MLA KV pool
   ("Expected size for first two dimensions of batch2 tensor to be: [2, 128] but got: [2, 576]"). The shim
   registers ``torch_native`` -> SGLang's own ``_dispatch_mla_subtype``: the absorbed MLA forward that SGLang
   itself uses for decode and for prefill with a cached prefix (``forward_mla.py``). It selects between two
   SGLang code paths; it replaces no computation. Both paths compute the same attention (MLA weight
   absorption is an exact re-association), which the parity test against transformers checks.

Retire this file when a CPU build of ``sglang-kernel`` exists on PyPI.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

#: Every call of a stubbed kernel, as ``"sgl_kernel.module.name"`` strings, in call order.
CALLS: list[str] = []


class StubKernelCalled(RuntimeError):
    """Raised when SGLang calls a function of the stub ``sgl_kernel`` (it has no CPU build)."""


class StubKernel:
    """Stands in for one ``sgl_kernel`` attribute: importable, subclass-safe, never callable for real."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        CALLS.append(self._qualname)
        raise StubKernelCalled(
            f"{self._qualname} was called, but sgl_kernel is a stub on this CPU machine "
            "(tests/parity/sglang_harness/shims.py). The compared SGLang path must not need it: "
            "choose a torch-native code path (attention_backend torch_native, SGLANG_USE_CPU_ENGINE=1)."
        )

    def __getattr__(self, name: str) -> "StubKernel":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StubKernel(f"{self._qualname}.{name}")

    def __repr__(self) -> str:
        return f"<StubKernel {self._qualname}>"


class _StubKernelModule(types.ModuleType):
    """A stub ``sgl_kernel`` (sub)module: every missing attribute is a :class:`StubKernel`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StubKernel(f"{self.__name__}.{name}")


class _KernelStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Meta-path finder that serves :class:`_StubKernelModule` for ``sgl_kernel`` and its submodules."""

    ROOT = "sgl_kernel"

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 - importlib protocol
        if fullname == self.ROOT or fullname.startswith(self.ROOT + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubKernelModule(spec.name)
        module.__path__ = []  # a package, so ``sgl_kernel.x.y`` imports resolve here too
        module.__version__ = "0.0.0+stub"
        return module

    def exec_module(self, module):
        return None


_NMS_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


def _define_nms_schema() -> None:
    """Define the ``torchvision::nms``/``qnms`` schemas (no kernels) unless torchvision's C extension did."""
    import torch

    try:
        torch.ops.torchvision.nms.default  # noqa: B018 - defined already (a working torchvision build)
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _NMS_SCHEMAS:
        lib.define(schema)
    _KEEP.append(lib)  # the schemas live as long as the Library object


_KEEP: list[Any] = []
_INSTALLED = False


def install() -> None:
    """Install both shims (idempotent). Call before the first ``import sglang``."""
    global _INSTALLED
    if _INSTALLED:
        return
    if "sglang" in sys.modules:
        raise RuntimeError("shims.install() must run before sglang is imported (the stub finder would be too late)")
    sys.meta_path.insert(0, _KernelStubFinder())
    _define_nms_schema()
    _INSTALLED = True


def route_torch_native_to_mla() -> None:
    """Shim 3 (see module docstring): DeepSeek attention on ``torch_native`` takes SGLang's absorbed MLA path."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry,
        _dispatch_mla_subtype,
    )

    AttentionBackendRegistry.register("torch_native", _dispatch_mla_subtype)


def reset_calls() -> None:
    """Forget recorded stub calls (call right before the compared forward)."""
    CALLS.clear()


def assert_no_stub_called(where: str) -> None:
    """Fail if any stubbed ``sgl_kernel`` function was called since :func:`reset_calls`."""
    if CALLS:
        raise AssertionError(
            f"{len(CALLS)} stubbed sgl_kernel call(s) during {where}: {sorted(set(CALLS))}. "
            "The compared SGLang path used a kernel the CPU harness only stubs; the parity result is void."
        )
