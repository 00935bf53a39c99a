"""What a target and an EAGLE-3 draft folder say, read statically: configs and safetensors headers, no weights.

Data flow position: before the engine. ``resolve.py`` decides the taps from what this module reads (the target's
layer count and hidden size, the draft config's id lists, the draft ``fc`` fan-in from its safetensors header), and
refuses here, in one line, the drafts vLLM would only reject 10-80 s into start-up with a traceback: pickle-only or
missing weights, truncated safetensors, a draft built for another hidden size. It also says how each engine's draft
class reads the config (:func:`draft_readings`: fan-in and the EAGLE-3.1 options ``fc_norm``, ``norm_before_fc``,
``norm_output``, ``norm_before_residual`` with each engine's own defaults) and where they disagree
(:func:`draft_option_warnings`). Standard library only: the CLI and every vLLM process read it cheaply.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any, Mapping

from vllm_eagle3.engines import ENGINES, LIST_NAMES, NESTED, NUM_AUX, TOP
from vllm_eagle3.spec import CaptureSpecError, parse_tap

IDS_KEY = "eagle_aux_hidden_state_layer_ids"
"""The draft config key vLLM and SGLang read the capture ids from (top level in vLLM, ``eagle_config`` in SGLang)."""

TRAINED_KEY = "vllm_eagle3"
"""Draft config block in which this project's trainer records the taps the head was trained on (engines ignore it;
``resolve.py`` checks the resolved spec against it)."""

TAP_CAPTURE_ARCHITECTURES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "KimiK25ForConditionalGeneration",
)
"""Target architectures whose capture the plugin replaces (``capture.py``; registered by ``plugin.py``). vLLM 0.32
captures ``hidden_states + residual`` for them, so tap 0 (the embedding) crashes stock vLLM. Any other target would
run vLLM's own capture and ignore a capture spec: ``resolve.py`` refuses that combination."""

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise CaptureSpecError(f"{what} {path} does not exist; check the path")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CaptureSpecError(f"{what} {path} is not valid JSON ({exc}); restore it from the checkpoint") from None
    if not isinstance(data, dict):
        raise CaptureSpecError(f"{what} {path} must hold a JSON object, got {type(data).__name__}")
    return data


def safetensors_header(f: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file, checked against the file's size (a truncated download is an error
    here, not a vLLM traceback at weight loading)."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise CaptureSpecError(f"{f} is truncated (no safetensors header); download it again")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise CaptureSpecError(f"{f} is not a safetensors file (header length {n})")
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CaptureSpecError(f"{f} has a corrupt safetensors header; download it again") from None
    if not isinstance(header, dict):
        raise CaptureSpecError(f"{f} has a corrupt safetensors header; download it again")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not isinstance(info.get("shape"), list):
            raise CaptureSpecError(f"{f}: tensor {name!r} has no shape in the safetensors header (corrupt file)")
        offsets = info.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets):
            end = max(end, offsets[1])
    if size < 8 + n + end:
        raise CaptureSpecError(
            f"{f} is truncated: its header describes {8 + n + end} bytes but the file has {size}; download it again"
        )
    return header


def weight_files(folder: Path, what: str) -> list[Path]:
    """The safetensors files of a model folder. Pickle-only folders, folders without weights and an index naming a
    missing shard are refused: vLLM would fail later, and pickle files can run code when loaded."""
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, f"{what} weight index").get("weight_map") or {}
        missing = sorted({str(v) for v in weight_map.values()} - {f.name for f in files})
        if missing:
            raise CaptureSpecError(
                f"{what} {folder}: {index.name} names shard(s) {missing} that are not in the folder; download them"
            )
    if files:
        return files
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CaptureSpecError(
            f"{what} {folder} holds only pickle weights ({', '.join(pickles)}); vllm-eagle3 loads safetensors only "
            '(pickle can run code when loaded). Convert: python -c "import torch, safetensors.torch as s; '
            f"s.save_file(torch.load('{pickles[0]}', weights_only=True), 'model.safetensors')\" in that folder"
        )
    raise CaptureSpecError(f"{what} {folder} has no weight files (*.safetensors); is this the right folder?")


def safetensors_shapes(folder: Path, what: str = "draft") -> dict[str, list[int]]:
    """Tensor name -> shape from every safetensors header of ``folder`` (see :func:`weight_files`)."""
    shapes: dict[str, list[int]] = {}
    for f in weight_files(folder, what):
        for name, info in safetensors_header(f).items():
            if name != "__metadata__":
                shapes[name] = list(info["shape"])
    return shapes


def text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language-model part of a target config (Kimi K2.5 nests it under ``text_config``)."""
    return cfg.get("text_config") or cfg


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    num_layers: int
    hidden_size: int
    vocab_size: int
    architecture: str

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "TargetInfo":
        tc = text_config(cfg)
        try:
            return cls(
                int(tc["num_hidden_layers"]),
                int(tc["hidden_size"]),
                int(tc["vocab_size"]),
                (cfg.get("architectures") or ["?"])[0],
            )
        except KeyError as exc:
            raise CaptureSpecError(f"target config lacks {exc}; is this a DeepSeek/Kimi config.json?") from None

    @classmethod
    def load(cls, target: str | Path | Mapping[str, Any]) -> "TargetInfo":
        if isinstance(target, Mapping):
            return cls.from_config(target)
        return cls.from_config(read_json(Path(target) / "config.json", "target config"))

    @property
    def plugin_captures(self) -> bool:
        """Whether the plugin's capture (and so a capture spec) applies to this architecture."""
        return self.architecture in TAP_CAPTURE_ARCHITECTURES


@dataclasses.dataclass(frozen=True)
class DraftInfo:
    path: Path | None
    config: Mapping[str, Any]
    top_ids: tuple[int, ...] | None
    nested_ids: tuple[int, ...] | None
    shapes: Mapping[str, list[int]]

    @classmethod
    def load(cls, draft: str | Path, weights: bool = True) -> "DraftInfo":
        """``weights=False`` reads the config alone (a published head's config.json without its weights): the
        checks that need the safetensors headers (fan-in of fc, d2t, norm tensors) are then skipped."""
        path = Path(draft)
        if not path.is_dir():
            raise CaptureSpecError(f"draft {path} does not exist or is not a folder; pass the EAGLE-3 draft's folder")
        cfg = read_json(path / "config.json", "draft config")
        return cls.from_config(cfg, path=path, shapes=safetensors_shapes(path) if weights else {})

    @classmethod
    def from_config(
        cls, cfg: Mapping[str, Any], path: Path | None = None, shapes: Mapping[str, list[int]] | None = None
    ) -> "DraftInfo":
        nested = cfg.get("eagle_config") or {}
        if not isinstance(nested, Mapping):
            raise CaptureSpecError(f"draft config: eagle_config must be an object, got {nested!r}")
        return cls(
            path,
            cfg,
            _ids_or_none(cfg.get(IDS_KEY), IDS_KEY),
            _ids_or_none(nested.get(IDS_KEY), f"eagle_config.{IDS_KEY}"),
            shapes or {},
        )

    @property
    def fc_in_features(self) -> int | None:
        shape = self.shapes.get("fc.weight") or self.shapes.get("model.fc.weight")
        return shape[1] if shape else None

    @property
    def target_hidden_size(self) -> int | None:
        """The target hidden size vLLM builds the draft's ``fc`` for: ``target_hidden_size``, else the draft's own
        ``hidden_size`` (vLLM 0.32 ``llama_eagle3.py`` / ``deepseek_eagle3.py``)."""
        value = self.config.get("target_hidden_size", self.config.get("hidden_size"))
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def trained_taps(self) -> tuple[int, ...] | None:
        """The taps the draft's trainer recorded in the config's ``vllm_eagle3`` block (``"taps": "[embed, 3, 31]"``,
        written by ``vllm_eagle3.miniature.train_draft``), or None when the draft carries no such record."""
        block = self.config.get(TRAINED_KEY)
        if block is None:
            return None
        taps = block.get("taps") if isinstance(block, Mapping) else None
        if not isinstance(taps, str) or not (taps.startswith("[") and taps.endswith("]")):
            raise CaptureSpecError(
                f'draft config {TRAINED_KEY}.taps must be a label such as "[embed, 3, 31]", got '
                f"{taps!r}; fix or remove the {TRAINED_KEY} block"
            )
        return tuple(parse_tap(t) for t in taps[1:-1].split(",") if t.strip())

    def has(self, name: str) -> bool:
        return name in self.shapes or f"model.{name}" in self.shapes


def _ids_or_none(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise CaptureSpecError(f"draft config {where} must be a list of ints, got {value!r}")
    for v in value:
        if isinstance(v, list):
            raise CaptureSpecError(
                f"draft config {where} = {value} is a nested list; vLLM and SGLang read a flat list of ints, "
                "e.g. [-1, 2, 30]: flatten it"
            )
        if isinstance(v, bool) or not isinstance(v, int):
            raise CaptureSpecError(f"draft config {where} = {value} holds {v!r}, which is not an integer")
    return tuple(value)


# ----------------------------------------------------------------------------------- EAGLE-3.1 options, fan-in


def mla_draft_architectures() -> tuple[str, ...]:
    """MLA-style EAGLE-3 draft architectures: those some engine's "mla" draft class loads (the engine table)."""
    names = (a for e in ENGINES.values() for a in getattr(e.draft_classes.get("mla"), "architectures", ()))
    return tuple(dict.fromkeys(names))


DRAFT_OPTIONS = ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual", "use_aux_norm")
"""The EAGLE-3.1 flags some engine reads from a draft config (``use_aux_norm``: SGLang's legacy name for fc_norm)."""

VLLM_MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "kimi_k2")
"""Draft ``model_type`` values (a subset: the DeepSeek/Kimi ones) for which vLLM 0.32 treats the model as MLA
(``transformers_utils/model_arch_config_convertor.py`` ``ModelArchConfigConvertorBase.is_deepseek_mla``, which also
needs ``kv_lora_rank``)."""


@dataclasses.dataclass(frozen=True)
class DraftReading:
    """What one engine's draft class reads from a draft config: how many taps its ``fc`` is sized for and which
    EAGLE-3.1 options it applies, with that engine's own defaults. ``ignored`` lists options set in the config that
    this class never reads."""

    engine: str
    source: str
    num_taps: int
    num_taps_from: str
    options: Mapping[str, bool]
    ignored: tuple[str, ...]
    reads: tuple[str, ...] = ()


def _flag(mapping: Any, key: str) -> bool:
    return bool(mapping.get(key, False)) if isinstance(mapping, Mapping) else False


def _count(value: Any) -> int | None:
    return len(value) if isinstance(value, list) and value else None


def draft_readings(cfg: Mapping[str, Any]) -> list[DraftReading]:
    """How each engine of the table with draft classes (:data:`vllm_eagle3.engines.ENGINES`, ``draft_classes``)
    reads this draft config, per the draft class its architecture selects ("mla" or "llama").

    Fan-in, as each class computes it: the first of its ``fan_in`` sources present (``num_aux_hidden_states``, the
    eagle_config list, the top-level list), else 3; e.g. vLLM ``llama_eagle3.py`` ``LlamaModel.__init__`` /
    ``deepseek_eagle3.py`` ``DeepseekV2Eagle3Model.__init__`` and SGLang ``llama_eagle3.py`` ``LlamaModel.__init__``
    never count the top-level list, SGLang ``kimi_k25_eagle3.py`` ``_get_eagle_aux_layer_count`` never reads
    ``num_aux_hidden_states``. Options: the first place each class looks that holds the flag; absent means off in every
    class.
    """
    nested = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), Mapping) else {}
    kind = "mla" if (cfg.get("architectures") or ["?"])[0] in mla_draft_architectures() else "llama"
    n_aux = cfg.get(NUM_AUX)
    if n_aux is not None and (isinstance(n_aux, bool) or not isinstance(n_aux, int) or n_aux < 1):
        raise CaptureSpecError(
            f"draft config num_aux_hidden_states must be a positive integer (the number of taps "
            f"the draft's fc takes), got {n_aux!r}; fix it or remove it"
        )
    counts = {NUM_AUX: n_aux, NESTED: _count(nested.get(IDS_KEY)), TOP: _count(cfg.get(IDS_KEY))}
    where = {TOP: cfg, NESTED: nested}
    out = []
    for engine in ENGINES.values():
        dc = engine.draft_classes.get(kind)
        if dc is None:
            continue
        n, n_from = next(
            ((int(counts[src]), LIST_NAMES[src]) for src in dc.fan_in if counts[src] is not None),
            (3, "the default 3: no " + ", no ".join(LIST_NAMES[src].replace("the ", "") for src in dc.fan_in)),
        )
        applied = {}
        for opt, places in dc.options.items():
            present = [where[p] for p in places if isinstance(where[p], Mapping) and opt in where[p]]
            applied[opt] = bool(present[0][opt]) if present else False
        if "use_aux_norm" in applied:  # SGLang: `fc_norm or use_aux_norm`
            aux_norm = applied.pop("use_aux_norm")
            applied["fc_norm"] = applied["fc_norm"] or aux_norm
        ignored = tuple(
            opt
            for opt in DRAFT_OPTIONS
            if (_flag(cfg, opt) or _flag(nested, opt))
            and not applied.get("fc_norm" if opt == "use_aux_norm" else opt, False)
        )
        out.append(
            DraftReading(
                engine.label, f"{engine.label} {dc.source}", n, n_from, applied, ignored, tuple(sorted(dc.options))
            )
        )
    return out


def draft_option_warnings(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """One line per way an engine would run another network than the draft's config describes: an option it
    ignores or reads from another place, a fan-in the engines size differently, an MLA draft an engine would not
    load or not treat as MLA. Each names the engine and version. Returns (code, message) pairs."""
    readings = draft_readings(cfg)
    nested = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), Mapping) else {}
    out = []
    for r in readings:
        for opt in r.ignored:
            if opt in r.reads:
                how, fix = "reads it only at the top level", f'put "{opt}": true at the top level of config.json'
            else:
                how, fix = "never reads it", "serve with an engine that reads it, or retrain without it"
            where = "eagle_config" if _flag(nested, opt) else "the config"
            out.append(
                (
                    "option-ignored",
                    f"draft option {opt} is set (in {where}) but "
                    f"{r.engine} {how} ({r.source}): it would run another network than the one trained; {fix}",
                )
            )
    counts = {r.engine: (r.num_taps, r.num_taps_from) for r in readings}
    if len({n for n, _ in counts.values()}) > 1:
        parts = "; ".join(f"{e} sizes fc for {n} taps (from {src})" for e, (n, src) in counts.items())
        out.append(
            (
                "fan-in-engines",
                f"the engines size the draft's fc differently: {parts}. "
                "Write num_aux_hidden_states and both id lists with the same number of taps "
                "(`vllm-eagle3 convert` does)",
            )
        )
    arch = (cfg.get("architectures") or ["?"])[0]
    mla = {e.label: e.draft_classes["mla"] for e in ENGINES.values() if "mla" in e.draft_classes}
    if arch in mla_draft_architectures():
        common = [a for a in mla_draft_architectures() if all(a in dc.architectures for dc in mla.values())]
        for engine, dc in mla.items():
            if arch not in dc.architectures:
                others = ", ".join(e for e in mla if e != engine)
                fix = (
                    f'write "architectures": ["{common[0]}"], which {others} also loads'
                    if common
                    else "serve it with an engine that loads it"
                )
                out.append(
                    (
                        "mla-arch",
                        f"architecture {arch}: {engine} has no such draft class "
                        f"({dc.architectures_ref} registers {', '.join(dc.architectures)} only); {fix}",
                    )
                )
        if cfg.get("model_type") not in VLLM_MLA_MODEL_TYPES or cfg.get("kv_lora_rank") is None:
            out.append(
                (
                    "mla-model-type",
                    f"MLA draft with model_type {cfg.get('model_type')!r} and kv_lora_rank "
                    f"{cfg.get('kv_lora_rank')!r}: vLLM 0.32 treats it as MLA only for model_type in "
                    f"{list(VLLM_MLA_MODEL_TYPES)} with kv_lora_rank set (model_arch_config_convertor.py "
                    'is_deepseek_mla) and sizes its KV cache wrongly otherwise; set "model_type": "kimi_k2" (or '
                    "deepseek_v3)",
                )
            )
        if cfg.get("num_hidden_layers", 1) != 1:
            out.append(
                (
                    "mla-layers",
                    f"MLA draft with num_hidden_layers = {cfg.get('num_hidden_layers')}: "
                    "SGLang 0.5.23 refuses it "
                    "(kimi_k25_eagle3.py Eagle3MLAModel.__init__: 'EAGLE3 currently only supports 1 layer')",
                )
            )
    if (
        arch not in mla_draft_architectures()
        and readings[0].options.get("fc_norm")
        and readings[0].options.get("norm_before_fc")
    ):
        out.append(
            (
                "norm-exclusive",
                "norm_before_fc and fc_norm are both set: "
                "vLLM 0.32 and SGLang 0.5.23 Llama drafts apply both "
                "(one norm over the concatenation, then one per tap); enable the one the draft was trained with",
            )
        )
    return out
