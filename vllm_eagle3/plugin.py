"""vLLM entry point (``vllm.general_plugins`` -> ``vllm_eagle3.plugin:register``).

Data flow position: runs in every vLLM process (API server, EngineCore, workers) before a model is built.
:func:`register` does six things, in this order:

1. checks the vLLM version (``compat.py``);
2. applies the upstream patches of ``model_patches`` (recorded, idempotent) and logs one line naming them; in the API
   server, before vLLM builds its app, one of them lets the wiring watch's read-only route load with ``VLLM_PLUGINS``
   unset;
3. points vLLM's registry at the capture subclasses in ``capture.py``, which make the DeepSeek/Kimi target capture the
   spec's taps;
4. hooks the online wiring check into vLLM's runner (``online/engine_hook.py``; it reads each step and changes
   nothing) and makes the folder its verdicts go to;
5. wraps vLLM's scheduler so that ``live_k`` in the plugin's config can choose k per batch size from this machine's
   step times (``live_k.py``, ``live_k_vllm.py``);
6. lets a request turn speculation off, and stops drafting for one whose drafts keep failing
   (``request_speculation.py``, ``request_speculation_vllm.py``).

Registration is lazy ("module:Class" strings): no model code is imported here. Calling :func:`register` twice is a
no-op.
"""

from __future__ import annotations

from vllm_eagle3 import LOGGER

CAPTURE_MODULE = "vllm_eagle3.capture"

_registered = False


def register() -> None:
    """The six steps of this module's docstring: check the vLLM version, apply (and log) the vLLM patches, override
    the DeepSeek/Kimi architectures, hook the online wiring check, install live k, install per-request speculation.
    Re-entrant: a second call returns at once."""
    global _registered
    if _registered:
        return
    from vllm_eagle3.compat import check_vllm_version

    version = check_vllm_version()

    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches.vllm_plugin import vllm_patches

    records = model_patches.apply_all(vllm_patches(), version)
    _log_patches(records)

    from vllm import ModelRegistry

    from vllm_eagle3.checkpoint import TAP_CAPTURE_ARCHITECTURES

    # The Kimi subclass keeps vLLM's class name: the EAGLE proposer checks
    # ``type(target).__name__ == "KimiK25ForConditionalGeneration"`` to read ``media_placeholder_token_id``.
    for arch in TAP_CAPTURE_ARCHITECTURES:
        ModelRegistry.register_model(arch, f"{CAPTURE_MODULE}:{arch}")
    _install_wiring_check()
    from vllm_eagle3 import live_k_vllm, request_speculation_vllm

    live_k_vllm.install()
    request_speculation_vllm.install()  # after live k: its wrappers run outside live k's (request_speculation_vllm.py)
    _registered = True


def _install_wiring_check() -> None:
    """The online wiring check's hook in vLLM's runner (``vllm_eagle3.online.engine_hook``) and the folder its
    verdicts go to: made by the first vLLM process (the API server) and inherited by the engine processes."""
    import os
    import tempfile

    from vllm.logger import init_logger

    from vllm_eagle3 import envs
    from vllm_eagle3.online.engine_hook import install

    if not envs.EAGLE3_CHECK_DIR:
        os.environ[envs.CHECK_DIR] = tempfile.mkdtemp(prefix="vllm-eagle3-check-")
    done = install()
    if done.startswith("not installed"):
        init_logger(LOGGER).warning("vllm-eagle3 wiring check: %s", done)


def _log_patches(records: list[str]) -> None:
    """One line per process naming the engine patches in force: they change vLLM-CPU code paths for every model
    this process serves, so an operator must be able to see them (and leave one out)."""
    from vllm.logger import init_logger

    from vllm_eagle3 import envs

    names = [r.split(":", 1)[0] + (" (skipped)" if ": skipped" in r else "") for r in records]
    init_logger(LOGGER).info(
        "vllm-eagle3: engine patches in this process: %s (details: model_patches.applied_patches(); "
        "%s=name,... leaves patches out)",
        ", ".join(names) or "none",
        envs.SKIP_PATCHES,
    )
