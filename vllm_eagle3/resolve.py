"""Static resolution and validation of a target + EAGLE-3 draft + capture spec, before any engine starts.

Data flow position: this decides the **taps** (``target forward -> taps -> concat -> draft fc -> proposer``) from
files alone: the target's ``config.json``, the draft's ``config.json`` and the draft's safetensors *headers* (no
weights are read). The CLI runs it before ``vllm serve`` (one clear line instead of a worker traceback), and the
plugin runs it again inside every vLLM process.

Where the spec comes from (:func:`spec_source`, the one statement of the precedence):
1. vLLM's own config: ``--additional-config '{"vllm_eagle3": {"capture_spec": {<a capture-spec mapping>}}}'`` (or
   ``{"convention": ...}``); part of ``VllmConfig``, handed to every worker, no file needed on any node;
2. else the environment: a capture-spec YAML named by ``EAGLE3_SPEC``, or ``EAGLE3_CONVENTION``.
A capture spec may name ``draft_ids_convention``; with no spec, the draft config's ids are read under the DECLARED
convention. Neither -> error: a draft config's ids are never read under a guessed convention.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Mapping

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from vllm_eagle3 import envs
from vllm_eagle3.checkpoint import (
    IDS_KEY,
    TAP_CAPTURE_ARCHITECTURES,
    TRAINED_KEY,
    DraftInfo,
    TargetInfo,
    draft_option_warnings,
    draft_readings,
)
from vllm_eagle3.conventions import CONVENTIONS, engine_default_ids, get_convention, ids_to_taps, taps_to_ids
from vllm_eagle3.settings import Settings
from vllm_eagle3.spec import CaptureSpec, CaptureSpecError
from vllm_eagle3.watch import WatchConfig
from vllm_eagle3.wiring_check import CheckConfig

ENV_SPEC = envs.SPEC
ENV_CONVENTION = envs.CONVENTION


# ----------------------------------------------------------------------------------------------- file readers


class SpecFile(Settings):
    """A capture-spec YAML, loaded: every key it may hold, declared once; unknown keys are rejected. ``spec`` is its
    ``taps`` as a :class:`CaptureSpec` whose ``source`` names where the mapping came from."""

    error: ClassVar[type[Exception]] = CaptureSpecError

    taps: list[Any] = Field(description="ordered list: `embed` or k = hidden state entering decoder layer k")
    num_layers: int | None = Field(None, ge=1, description="the target's decoder layer count, checked at start-up")
    draft_ids_convention: str | None = Field(
        None, description=f"convention of the draft config's ids, for the cross-check: {' | '.join(CONVENTIONS)}"
    )
    description: Any = Field(None, description="free text")
    watch: WatchConfig | None = Field(None, description="the runtime wiring watch (vllm_eagle3.watch.WatchConfig)")
    check: CheckConfig | None = Field(
        None, description="the online wiring check in the engine (vllm_eagle3.wiring_check.CheckConfig)"
    )
    _spec: CaptureSpec = PrivateAttr()

    @field_validator("draft_ids_convention")
    @classmethod
    def _known_convention(cls, value: str | None) -> str | None:
        return None if value is None else get_convention(value).name

    @model_validator(mode="after")
    def _capture_spec(self, info: ValidationInfo) -> "SpecFile":
        self._spec = CaptureSpec(taps=tuple(self.taps), source=(info.context or {}).get("source", "inline"))
        if self.num_layers is not None:
            self._spec.check_num_layers(self.num_layers)
        return self

    @property
    def spec(self) -> CaptureSpec:
        return self._spec


def load_spec_file(path: str | Path) -> SpecFile:
    """Load a capture-spec YAML into a :class:`SpecFile`; every problem is a :class:`CaptureSpecError`."""
    return spec_file_from_mapping(read_spec_mapping(path), str(path))


def read_spec_mapping(path: str | Path) -> Any:
    """The content of a capture-spec YAML, unvalidated (:func:`spec_file_from_mapping` validates it)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise CaptureSpecError(
            f"capture spec {path} does not exist; pass a YAML file such as configs/kimi_k25_eagle3.yaml"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CaptureSpecError(f"capture spec {path} is not valid YAML: {exc}") from None
    return data


def spec_file_from_mapping(data: Any, path: str) -> SpecFile:
    """Validate the mapping a capture-spec YAML holds into a :class:`SpecFile`; ``path`` names where it came from in
    errors and in ``spec.source``."""
    if not isinstance(data, dict):
        raise CaptureSpecError(f"capture spec {path} must be a mapping with a `taps:` key, got {type(data).__name__}")
    return SpecFile.from_mapping(data, f"capture spec {path}", context={"source": path})


def load_spec_yaml(path: str | Path) -> CaptureSpec:
    """Just the :class:`CaptureSpec` of a capture-spec YAML."""
    return load_spec_file(path).spec


# ---------------------------------------------------------------------------------------- where the spec comes from

CONFIG_KEY = "vllm_eagle3"
"""This plugin's key in vLLM's ``--additional-config`` mapping."""


class PluginConfig(Settings):
    """The ``vllm_eagle3`` mapping of vLLM's ``--additional-config``: the keys this plugin reads. The values are
    validated where they are read: the capture spec by :class:`SpecFile` (its errors name the channel), live k by
    :mod:`vllm_eagle3.live_k` (also here, so `vllm-eagle3 serve` refuses it before vLLM starts), the back-off by
    :mod:`vllm_eagle3.request_speculation`."""

    error: ClassVar[type[Exception]] = CaptureSpecError
    list_key_help: ClassVar[bool] = True

    capture_spec: Any = Field(None, description="a capture-spec mapping, exactly what a capture-spec YAML holds")
    convention: str | None = Field(None, description="convention of the draft config's ids, when there is no spec")
    live_k: Any = Field(
        None, description="true, false or a mapping: k per batch size measured while serving (vllm_eagle3/live_k.py)"
    )
    draft_backoff: Any = Field(
        None,
        description="true, false (the default when absent) or a mapping: a request whose drafts keep failing stops "
        "drafting and re-probes (vllm_eagle3/request_speculation.py)",
    )


CONFIG_SPEC_SOURCE = "--additional-config"


@dataclasses.dataclass(frozen=True)
class SpecSource:
    """The capture spec (or the declared convention) a process uses, and where it came from."""

    spec_file: SpecFile | None
    convention: str | None
    origin: str  # "--additional-config", "$EAGLE3_SPEC", "$EAGLE3_CONVENTION" or "none"
    ignored: tuple[str, ...] = ()  # env vars set but overridden by the config, named in the taps line

    def label(self) -> str:
        """E.g. ``--additional-config; $EAGLE3_SPEC ignored``."""
        return "; ".join([self.origin, *(f"{name} ignored" for name in self.ignored)])


def plugin_config(additional_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``vllm_eagle3`` mapping of vLLM's additional config (empty when absent), its keys checked."""
    mine = (additional_config or {}).get(CONFIG_KEY)
    if mine is None:
        return {}
    if not isinstance(mine, Mapping):
        raise CaptureSpecError(
            f"--additional-config {CONFIG_KEY!r} must be a mapping such as "
            f'{{"capture_spec": {{"taps": ["embed", 3, 31]}}}}, got {mine!r}'
        )
    PluginConfig.from_mapping(dict(mine), f"--additional-config {CONFIG_KEY!r}")
    if "live_k" in mine:  # checked here too, so `vllm-eagle3 serve` refuses it before vLLM starts
        from vllm_eagle3.live_k import LiveKError, Settings

        try:
            Settings.from_config(mine["live_k"])
        except LiveKError as exc:
            raise CaptureSpecError(f"--additional-config {CONFIG_KEY!r}: {exc}") from None
    return dict(mine)


def spec_source(config: Any = None, environ: Mapping[str, str] | None = None) -> SpecSource:
    """The precedence, stated once: ``config`` (a ``VllmConfig``, or its ``additional_config`` mapping) carrying
    ``vllm_eagle3.capture_spec`` or ``vllm_eagle3.convention`` wins over the environment's ``EAGLE3_SPEC`` /
    ``EAGLE3_CONVENTION`` (``environ``, default ``os.environ``), which are the fallback. A ``vllm_eagle3`` mapping
    with neither (only runtime options such as ``live_k``) says nothing of the spec, so the environment's applies."""
    additional = getattr(config, "additional_config", config)
    mine = plugin_config(additional if isinstance(additional, Mapping) else None)
    if "capture_spec" in mine or "convention" in mine:
        sf = (
            spec_file_from_mapping(mine["capture_spec"], f"{CONFIG_SPEC_SOURCE} {CONFIG_KEY}.capture_spec")
            if "capture_spec" in mine
            else None
        )
        ignored = tuple(f"${n}" for n in (ENV_SPEC, ENV_CONVENTION) if envs.get(n, environ))
        return SpecSource(sf, mine.get("convention"), CONFIG_SPEC_SOURCE, ignored)
    path, convention = envs.get(ENV_SPEC, environ), envs.get(ENV_CONVENTION, environ)
    if path:
        return SpecSource(load_spec_file(path), convention, f"${ENV_SPEC}")
    return SpecSource(None, convention, f"${ENV_CONVENTION}" if convention else "none")


# ----------------------------------------------------------------------------------------------- resolution


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What the plugin will capture and why."""

    spec: CaptureSpec
    target: TargetInfo
    draft_ids: tuple[int, ...]  # as written at top level in the draft config (what vLLM's runner reads)
    draft_convention: str | None
    runner_ids: tuple[int, ...]  # what vLLM's runner hands set_aux_hidden_state_layers
    warnings: tuple[str, ...] = ()  # draft options / fan-in an engine would ignore or read differently
    draft_arch: str = ""  # the draft config's architectures[0]: the draft class vLLM builds
    spec_from: str = ""  # SpecSource.origin: --additional-config, $EAGLE3_SPEC, ...

    def log_line(self) -> str:
        conv = f"{self.draft_convention} " if self.draft_convention else ""
        origin = f" (spec from {self.spec_from})" if self.spec_from else ""
        return (
            f"vllm-eagle3: capturing taps {self.spec.label()}{origin} (hidden state entering layer k; embed = "
            f"embedding output) in this order, from {self.spec.source}; draft config {conv}ids "
            f"{list(self.draft_ids)}; vLLM runner ids {list(self.runner_ids)}; "
            f"{self.target.num_layers}-layer target, draft fc fan-in {self.spec.fan_in(self.target.hidden_size)}"
            + (f", draft class {self.draft_arch}" if self.draft_arch else "")
        )

    def check_runner_ids(self, ids) -> None:
        """The runner's ids must be the draft config's ids; anything else would capture other taps."""
        if sorted(ids) != sorted(self.runner_ids):
            raise CaptureSpecError(
                f"vLLM's runner asked to capture ids {sorted(ids)} but the draft config says {list(self.runner_ids)} "
                f"= taps {self.spec.label()}; refusing to capture other taps. Put the ids at the top level of the "
                f"draft config.json ({IDS_KEY}) so the runner reads them"
            )


def resolve_capture(
    target: str | Path | Mapping[str, Any],
    draft: str | Path | DraftInfo,
    spec_path: str | Path | SpecFile | None = None,
    convention: str | None = None,
    spec_from: str = "",
) -> Resolution:
    """Resolve and validate; every problem raises :class:`CaptureSpecError` with the fix in its message.
    ``spec_path``: a capture-spec YAML or an already loaded :class:`SpecFile`; ``spec_from``: where the spec or the
    convention came from (:attr:`SpecSource.origin`), for the start-up line."""
    info = TargetInfo.load(target)
    d = draft if isinstance(draft, DraftInfo) else DraftInfo.load(draft)
    L = info.num_layers
    if d.target_hidden_size is not None and d.target_hidden_size != info.hidden_size:
        raise CaptureSpecError(
            f"the draft was built for a target hidden size of {d.target_hidden_size} (config target_hidden_size, "
            f"else hidden_size) but the target's hidden size is {info.hidden_size}: vLLM would build an fc of "
            f"{d.target_hidden_size} x taps and fail to load the weights. Use the draft trained for this target, or "
            "fix target_hidden_size in the draft config"
        )

    # The id lists each engine reads.
    if d.top_ids is None and d.nested_ids is None:
        raise CaptureSpecError(
            f"the draft config has no {IDS_KEY}; vLLM and SGLang would silently fall back to their defaults "
            f"{list(engine_default_ids(L))} (the engines' default wiring). Write the ids the draft was trained on, "
            "e.g. `vllm-eagle3 convert --from hf --to vllm` output, into config.json"
        )
    if d.top_ids is None:
        raise CaptureSpecError(
            f"the draft config has ids only in eagle_config.{IDS_KEY} = {list(d.nested_ids)}; vLLM's V2 runner "
            f"(the GPU default) reads only the top-level {IDS_KEY} and would silently use its default "
            f"{list(engine_default_ids(L))} instead. Copy the list to the top level (`vllm-eagle3 convert` writes both)"
        )
    if d.nested_ids is not None and tuple(d.nested_ids) != tuple(d.top_ids):
        raise CaptureSpecError(
            f"the draft config has two different id lists: top-level {list(d.top_ids)} (read by vLLM) and "
            f"eagle_config {list(d.nested_ids)} (read by SGLang); make them equal"
        )
    ids = d.top_ids

    # The spec.
    if spec_path is not None:
        sf = spec_path if isinstance(spec_path, SpecFile) else load_spec_file(spec_path)
        spec = sf.spec
        spec_path = spec.source
        if sf.num_layers is not None and sf.num_layers != L:
            raise CaptureSpecError(
                f"capture spec {spec_path} was written for a {sf.num_layers}-layer model but the target has {L} layers"
            )
        if (
            convention is not None
            and sf.draft_ids_convention is not None
            and get_convention(convention).name != sf.draft_ids_convention
        ):
            raise CaptureSpecError(
                f"the convention given ({convention}) disagrees with capture spec {spec_path} "
                f"(draft_ids_convention: {sf.draft_ids_convention}); state it once"
            )
        conv = get_convention(convention).name if convention else sf.draft_ids_convention
        if conv is None:
            raise CaptureSpecError(
                f"capture spec {spec_path} does not say how to read the draft config's ids {list(ids)}; add "
                f"`draft_ids_convention: <{'|'.join(CONVENTIONS)}>` so they can be checked"
            )
    elif convention is not None:
        conv = get_convention(convention).name
        spec = CaptureSpec(taps=ids_to_taps(ids, conv, L), source=f"draft config ids {list(ids)} read as {conv}")
    else:
        raise CaptureSpecError(
            f"the draft config's ids {list(ids)} have no stated convention, and they mean different taps in "
            "different engines; pass --capture-spec configs/<spec>.yaml or --convention "
            f"<{'|'.join(CONVENTIONS)}> (env EAGLE3_SPEC / EAGLE3_CONVENTION); with plain vllm serve, "
            '--additional-config \'{"vllm_eagle3": {"capture_spec": {"taps": [...]}}}\''
        )

    spec.check_num_layers(L)
    draft_taps = ids_to_taps(ids, conv, L)
    if sorted(draft_taps) != sorted(spec.taps):
        raise CaptureSpecError(
            f"spec {spec.label()} ({spec.source}) and the draft config disagree: its ids {list(ids)} read as {conv} "
            f"are taps {CaptureSpec(draft_taps).label()}; fix whichever is wrong (`vllm-eagle3 doctor` measures "
            "which wiring the draft was trained on)"
        )
    trained = d.trained_taps
    if trained is not None and trained != spec.taps:
        raise CaptureSpecError(
            f"the draft records that it was trained on taps {CaptureSpec(trained).label()} (draft config "
            f"{TRAINED_KEY}.taps, written by its trainer) but the spec resolves to {spec.label()} ({spec.source}); "
            "the head would get other hidden states than it learned on. Fix the spec, or the config if the record "
            "is wrong"
        )
    vllm_reading = draft_readings(d.config)[0]  # validates num_aux_hidden_states
    n_aux = d.config.get("num_aux_hidden_states")
    if n_aux is not None and n_aux != spec.num_taps:
        raise CaptureSpecError(
            f"draft config num_aux_hidden_states = {n_aux} but the spec {spec.label()} has {spec.num_taps} taps"
        )
    if vllm_reading.num_taps != spec.num_taps:
        raise CaptureSpecError(
            f"{vllm_reading.source} sizes the draft's fc for {vllm_reading.num_taps} taps (from "
            f"{vllm_reading.num_taps_from}) but the spec {spec.label()} has {spec.num_taps}; add "
            f'"num_aux_hidden_states": {spec.num_taps} to the draft config (`vllm-eagle3 convert` writes it)'
        )
    if d.fc_in_features is not None:
        spec.check_fan_in(d.fc_in_features, info.hidden_size)
    elif d.shapes:
        raise CaptureSpecError(f"draft {d.path} has no fc.weight; is it an EAGLE-3 head?")
    draft_vocab = d.config.get("draft_vocab_size")
    if d.shapes and draft_vocab and draft_vocab != info.vocab_size and not d.has("d2t"):
        raise CaptureSpecError(
            f"the draft predicts a reduced vocabulary ({draft_vocab} of {info.vocab_size} tokens) but has no d2t "
            "tensor; without it vLLM maps draft token i to target token i (wrong tokens, silent near-zero "
            "acceptance). Export d2t with the draft"
        )
    if not info.plugin_captures:
        _check_native_capture(info, ids, spec)
    return Resolution(
        spec=spec,
        target=info,
        draft_ids=tuple(ids),
        draft_convention=conv,
        runner_ids=_runner_ids(ids),
        warnings=tuple(m for _, m in draft_option_warnings(d.config)),
        draft_arch=str((d.config.get("architectures") or [""])[0]),
        spec_from=spec_from,
    )


def _check_native_capture(info: TargetInfo, ids: tuple[int, ...], spec: CaptureSpec) -> None:
    """On a target whose capture the plugin does not replace, vLLM captures ``sorted(set(ids))`` read as its own
    taps (``EagleModelMixin``): a spec that means anything else would be silently ignored, so it is refused."""
    try:
        native = tuple(sorted(set(ids_to_taps(ids, "vllm", info.num_layers))))
    except CaptureSpecError:
        native = None
    if native != spec.taps:
        got = CaptureSpec(native).label() if native else f"nothing valid (ids {list(ids)})"
        raise CaptureSpecError(
            f"target architecture {info.architecture} keeps vLLM's own capture (vllm-eagle3 replaces it only for "
            f"{', '.join(TAP_CAPTURE_ARCHITECTURES)}), which captures {got}, not the spec's {spec.label()}; the "
            "capture spec would be silently ignored. Write the draft config's ids in vLLM's convention, ascending "
            "(`vllm-eagle3 convert --to vllm`), or serve a DeepSeek/Kimi target"
        )


def _runner_ids(ids: tuple[int, ...]) -> tuple[int, ...]:
    """vLLM 0.32's runner passes the draft config's top-level ids through unchanged, as a tuple
    (``v1/worker/gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_config``; the V1 runner falls back to the nested
    list, the V2 runner does not)."""
    return tuple(ids)


def resolve_from_env(target, draft, environ: Mapping[str, str] | None = None, config: Any = None) -> Resolution:
    """The plugin's entry: the spec or convention of :func:`spec_source` (``config``: a ``VllmConfig`` or its
    additional config; else the environment)."""
    src = spec_source(config, environ)
    return resolve_capture(target, draft, spec_path=src.spec_file, convention=src.convention, spec_from=src.label())


def ids_for_engines(spec: CaptureSpec, num_layers: int) -> dict[str, tuple[int, ...] | str]:
    """The spec written in every convention (or why it cannot be)."""
    out: dict[str, tuple[int, ...] | str] = {}
    for name in CONVENTIONS:
        try:
            out[name] = taps_to_ids(spec.taps, name, num_layers)
        except CaptureSpecError as exc:
            out[name] = f"not expressible: {exc}"
    return out
