"""Where a served model's files are on this machine: a local folder as given, a Hugging Face hub id in the hub cache.

Data flow position: serve time, after vLLM has loaded the target and the draft. vLLM takes ``--model`` and
``speculative_config.model`` as a folder or a hub id (``moonshotai/Kimi-K2.5``) and downloads a hub id into the
Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub). What the plugin reads
from those files itself (the online check's scorer: the draft's head and the target's embedding) is found here the way
vLLM finds a cached file offline (``vllm/transformers_utils/repo_utils.py`` ``try_get_local_file``:
``huggingface_hub.try_to_load_from_cache``), never over the network. Not found: :class:`ModelFilesNotFound`, whose
message says why and the fix.
"""

from __future__ import annotations

from pathlib import Path

ANCHOR = "config.json"
"""The file whose cached copy locates a hub id's snapshot folder (vLLM reads it first, so it is always cached)."""

FIX = "pass a local folder, or set HF_HOME (or HF_HUB_CACHE) to where vLLM downloaded it"


class ModelFilesNotFound(FileNotFoundError):
    """A model named by folder or hub id whose files are not on this machine; the message names the fix."""


def looks_like_hub_id(model: str) -> bool:
    """``org/name`` as the hub spells repository ids: e.g. ``moonshotai/Kimi-K2.5`` yes, ``./models/x`` or
    ``/data/x`` no."""
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~")) and "\\" not in model


def model_folder(
    model: str | Path,
    *,
    what: str = "model",
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    anchor: str = ANCHOR,
) -> Path:
    """The local folder holding ``model``'s files: ``model`` itself when it is a folder, else the hub cache's
    snapshot of that hub id (``revision`` as vLLM's ``--revision``, default ``main``; ``cache_dir`` as vLLM's
    ``--download-dir``, default the hub cache), located by its cached ``anchor`` file.
    E.g. ``moonshotai/Kimi-K2.5`` -> ``~/.cache/huggingface/hub/models--moonshotai--Kimi-K2.5/snapshots/<commit>``."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    name = str(model)
    if not looks_like_hub_id(name):
        raise ModelFilesNotFound(f"{what} {name} is not a folder (nor a hub id such as org/name); {FIX}")
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        raise ModelFilesNotFound(
            f"{what} {name} is a hub id but huggingface_hub is not installed to find its cached files; {FIX}"
        ) from None
    where = str(cache_dir or constants.HF_HUB_CACHE)
    try:
        found = try_to_load_from_cache(repo_id=name, filename=anchor, cache_dir=cache_dir, revision=revision)
    except ValueError as exc:  # an id the hub would reject (huggingface_hub's HFValidationError)
        raise ModelFilesNotFound(f"{what} {name} is not a folder and not a valid hub id ({exc}); {FIX}") from None
    if not isinstance(found, str):
        rev = f" (revision {revision})" if revision else ""
        raise ModelFilesNotFound(
            f"{what} {name}{rev} is not a local folder and its {anchor} is not in the Hugging Face cache {where}; {FIX}"
        )
    return Path(found).parent
