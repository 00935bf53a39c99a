"""Run at interpreter start-up by ``vllm-eagle3 emulate avx2`` (this folder first on ``PYTHONPATH``): torch's CPU
feature tests answer as on a CPU with AVX2 only.

vLLM-CPU asks ``torch.cpu._is_avx512_supported`` / ``_is_avx512_bf16_supported`` which kernel library to load
(``platforms/cpu.py`` ``import_kernels``: ``_C``, ``_C_AVX512`` or ``_C_AVX2``) and ``_is_amx_tile_supported`` /
``_is_avx512_*`` where it picks attention, MoE and linear kernels; all of them call through the ``torch.cpu`` module
at use time, so replacing the module's functions is enough. ``torch.cpu`` is patched as it is imported (a meta-path
hook), so a Python process that never imports torch pays nothing. Stdlib only; reads no environment.
"""

import importlib.abc
import sys

HIDDEN = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported", "_is_avx512_fp16_supported",
          "_is_amx_tile_supported", "_is_amx_fp16_supported")


def _no() -> bool:
    return False


class _Patching(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        for name in HIDDEN:
            if hasattr(module, name):
                setattr(module, name, _no)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cpu":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patching(spec.loader)
                return spec
        return None


sys.meta_path.insert(0, _Finder())
