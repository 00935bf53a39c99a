"""The vLLM patches of this folder, and an entry point that applies only them.

Data flow position: none (the patches make vLLM run the target + draft pair). ``vllm_eagle3.plugin.register``
applies :data:`VLLM_PATCHES` in every vLLM process. :func:`register` is meant for a second
``vllm.general_plugins`` entry point (``vllm_eagle3_model_patches = "vllm_eagle3.model_patches.vllm_plugin:register"``):
with ``VLLM_PLUGINS=vllm_eagle3_model_patches`` vLLM runs *stock* model code plus these patches only, which
is how tests/e2e/test_stock_vllm.py records what unpatched capture does on CPU.
"""

from __future__ import annotations

from vllm_eagle3.model_patches import Patch, apply_all
from vllm_eagle3.model_patches import vllm_cpu_amx_float32, vllm_cpu_block_size, vllm_cpu_mla_verify_decode
from vllm_eagle3.model_patches import vllm_cpu_rope_3d
from vllm_eagle3.model_patches import vllm_cpu_onednn_release, vllm_cpu_spec_expand, vllm_cpu_top_k_empty
from vllm_eagle3.model_patches import vllm_cpu_spec_min_p_logit_bias
from vllm_eagle3.model_patches import vllm_endpoint_default
from vllm_eagle3.model_patches import vllm_v2_spec_min_p_logit_bias
from vllm_eagle3.model_patches import vllm_media_fetch_unreachable
from vllm_eagle3.model_patches import vllm_cpu_no_spin

VLLM_PATCHES = (
    vllm_cpu_block_size.PATCH,
    vllm_cpu_rope_3d.PATCH,
    vllm_cpu_mla_verify_decode.PATCH,
    vllm_cpu_spec_expand.PATCH,
    vllm_cpu_top_k_empty.PATCH,
    vllm_media_fetch_unreachable.PATCH,
    vllm_cpu_amx_float32.PATCH,
    vllm_endpoint_default.PATCH,
    vllm_cpu_onednn_release.PATCH,
    vllm_cpu_spec_min_p_logit_bias.PATCH,
    vllm_v2_spec_min_p_logit_bias.PATCH,
    vllm_cpu_no_spin.PATCH,
)


def vllm_patches(environ=None) -> tuple[Patch, ...]:
    """:data:`VLLM_PATCHES`, less the ones their environment variable opts out of
    (``EAGLE3_CPU_MLA_VERIFY_AS_DECODE=0``: :mod:`model_patches.vllm_cpu_mla_verify_decode`, vLLM's own MLA
    verification path). A value other than 0/1 raises, naming the variable."""
    if vllm_cpu_mla_verify_decode.opted_out(environ):
        return tuple(p for p in VLLM_PATCHES if p is not vllm_cpu_mla_verify_decode.PATCH)
    return VLLM_PATCHES


def register() -> list[str]:
    """Apply every vLLM patch once in this process (version-guarded); returns the records."""
    from vllm import __version__

    return apply_all(vllm_patches(), str(__version__))
