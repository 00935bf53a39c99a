"""vllm_eagle3/model_patches/vllm_cpu_onednn_release.py: a oneDNN GEMM handler freed while torch's fake-tensor
machinery is active (as when Python's collector runs during torch.compile's trace of the warm-up forward) is
released, with its own pointer, and nothing raises inside ``__del__``.

Stock vllm-cpu 0.32.0 calls ``Tensor.item()`` there, which fake-tensor mode refuses (the handler leaks); in a compiled
engine's warm-up the same call recursed until the worker died of a stack overflow (the patch's docstring). Real
handlers from vLLM's own ``create_onednn_mm``; no engine is started.
"""

import gc
import sys

import pytest
import torch

pytestmark = pytest.mark.unit


@pytest.fixture()
def create():
    from vllm import _custom_ops

    if not _custom_ops._supports_onednn:
        pytest.skip("this vLLM build has no oneDNN matmul handlers")
    return lambda: _custom_ops.create_onednn_mm(torch.randn(64, 32), 16)


def test_stock_release_raises_under_fake_tensor_mode(create):
    """What the patch exists for: vLLM's own __del__ calls Tensor.item(), which fake-tensor mode refuses."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vllm_eagle3.model_patches import vllm_cpu_onednn_release

    handler = create()
    with pytest.raises(Exception, match="_local_scalar_dense|FakeTensor"):
        with FakeTensorMode():
            vllm_cpu_onednn_release.stock_release()(handler)  # when this stops raising, retire the patch
    vllm_cpu_onednn_release._release(handler)  # free it outside the mode


def test_patched_release_frees_the_handler_under_tracing_modes(create, monkeypatch):
    """Patched: a handler that becomes garbage under FakeTensorMode and the Python dispatcher (what Dynamo's trace
    runs under) is released once, with the pointer its tensor holds, and no exception is swallowed by __del__."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_cpu_onednn_release

    record = model_patches.apply(vllm_cpu_onednn_release.PATCH, "0.32.0")
    assert "vllm_cpu_onednn_release" in record and "skipped" not in record, record
    handler = create()
    pointer = int(handler.handler_tensor.item())
    assert vllm_cpu_onednn_release.handler_pointer(handler.handler_tensor) == pointer != 0
    released, swallowed = [], []
    real_dtor = handler.dtor
    handler.dtor = lambda p: (released.append(p), real_dtor(p))
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(repr(u.exc_value)))
    with FakeTensorMode(), enable_python_dispatcher():
        del handler
        gc.collect()
    assert swallowed == [], swallowed
    assert released == [pointer]


def test_handler_pointer_refuses_other_tensors():
    from vllm_eagle3.model_patches.vllm_cpu_onednn_release import handler_pointer

    assert handler_pointer(torch.tensor(123456789012, dtype=torch.int64)) == 123456789012
    with pytest.raises(ValueError, match="one int64"):
        handler_pointer(torch.tensor([1, 2], dtype=torch.int64))
    with pytest.raises(ValueError, match="one int64"):
        handler_pointer(torch.tensor(1.0, dtype=torch.float64))
