"""The engine table: one entry per engine and version rule, everything the project knows about how it reads taps.

Data flow position: configuration, before any engine starts. An entry says how an engine's draft-config ids map to
taps (:mod:`vllm_eagle3.spec`: tap k = hidden state entering decoder layer k), which config list it reads, how its
draft class sizes ``fc`` (fan-in), how many taps it serves and what to write for it. Every consumer iterates
:data:`ENGINES`: :mod:`~vllm_eagle3.conventions` (conversions), :mod:`~vllm_eagle3.checkpoint` (draft readings),
:mod:`~vllm_eagle3.wirings` (candidate wirings, config lines), ``tools/inspect``, ``tools/convert`` and the SGLang
parity harness, so a new entry shows up everywhere (``tests/unit/test_engine_table.py``). Standard library only.

Entries read from the trainers' and engines' own source (read, not copied; the function that does it, at the commit
or release named):

- ``torchspec`` (lightseekorg/TorchSpec @ 6f21829): id k = OUTPUT of decoder layer k = tap k+1.
  ``torchspec/models/target/eagle3_target_model.py`` registers a forward hook on ``layers[idx]`` for
  ``0 <= idx < len(layers)`` (else ValueError), concatenates in the listed order, defaults to
  ``[1, L//2-1, L-4]`` and takes any count ("Eagle3 uses 3, DFlash uses 5"). ``inference/engine/vllm_engine.py``
  shifts +1 for vLLM ("post-layer -> pre-next-layer"), and ``tools/convert_to_hf.py`` ``_fixup_export_config``
  adds +1 to both id lists when exporting a ``kimi_k2`` draft for vLLM: an exported lightseekorg MLA head
  ([2, 30, 58]) is in the ``vllm`` convention, its training config ([1, 29, 57]) in this one. No id names the
  embedding.
- ``sglang`` (SGLang 0.5.23, ``srt/models/deepseek_v2.py``): ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``
  shifts a list starting with 1, else keeps it; ``DeepseekV2Model.forward`` captures only inside the decoder-layer
  loop (``i in layers_to_capture`` for i in 0..L-1) into a packer sized ``len(layers_to_capture)`` (any count), so
  tap L (the final pre-norm state) is never captured and ``srt/layers/aux_hidden_states.py``
  ``AuxHiddenStatePacker.finalize`` raises "captured n-1 of n aux hidden states".
- ``sglang-legacy`` (SGLang 0.5.12.post1): ids of any count are captured (+1 each) and the draft's ``fc`` is sized
  from its list, but ``srt/speculative/eagle_info.py`` ``EagleDraftExtendInput.hidden_size_for`` sizes the
  draft-extend hidden states from the TARGET's config (else 3 x hidden), so only three taps are served
  (``served_count``; read, not run: SGLang's speculative loop needs CUDA). 0.5.23 reads the draft's config there
  (``speculative/eagle_utils.py`` ``get_draft_input_from_target_hidden_dim``).
- ``specforge`` (sgl-project/SpecForge @ a6b6b02): ``specforge/algorithms/model_providers.py``
  ``resolve_eagle_capture_layers`` raises unless the list holds exactly three non-negative ints.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Mapping, Sequence

from packaging.specifiers import SpecifierSet

from vllm_eagle3.versions import release_in
from vllm_eagle3.spec import EMBED, CaptureSpecError

IdRule = Callable[[Sequence[int], int], "tuple[int, ...]"]
"""``(ids or taps, num_layers) -> taps or ids``, keeping the listed order."""

TOP, NESTED = "top", "eagle_config"
"""The two places a draft config holds ids and EAGLE-3.1 options: its top level and its ``eagle_config`` block."""

NUM_AUX = "num_aux_hidden_states"
"""The draft config key some draft classes size ``fc`` from (a tap count, not a list)."""

LIST_NAMES = {TOP: "the top-level list", NESTED: "the eagle_config list", NUM_AUX: NUM_AUX}


def identity(ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    return tuple(ids)


def plus_one(ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    return tuple(i + 1 for i in ids)


def minus_one(taps: Sequence[int], num_layers: int) -> tuple[int, ...]:
    return tuple(t - 1 for t in taps)


def sglang_ids_to_taps(ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    # SGLang 0.5.13..0.5.23 DeepSeek/Kimi path (models/deepseek_v2.py set_eagle3_layers_to_capture): a list that
    # starts with 1 is read as a legacy "output of layer" list and shifted by one; any other list is taken as is.
    if ids and ids[0] == 1:
        return plus_one(ids, num_layers)
    return tuple(ids)


def sglang_taps_to_ids(taps: Sequence[int], num_layers: int) -> tuple[int, ...]:
    ids = tuple(taps)
    if ids and ids[0] == 1:
        # Written as is, a leading 1 would trigger SGLang's legacy shift. SGLang concatenates ascending whatever
        # the listed order, so listing another tap first expresses the same capture.
        if len(ids) == 1:
            raise CaptureSpecError(
                "tap 1 alone cannot be written for SGLang 0.5.13+: a list starting with 1 is shifted by one there"
            )
        ids = ids[1:] + ids[:1]
    return ids


@dataclasses.dataclass(frozen=True)
class ListReading:
    """One way an engine picks the id list out of a draft config: the first of ``lists`` present wins."""

    label: str  # as reports name this reading, e.g. "vLLM 0.32 V2 runner (top-level list)"
    lists: tuple[str, ...]  # TOP / NESTED, in the order the engine tries them


@dataclasses.dataclass(frozen=True)
class DraftClass:
    """How an engine's EAGLE-3 draft class reads a draft config: its ``fc`` fan-in and the EAGLE-3.1 options."""

    source: str  # the file and the functions of the class that read the config
    fan_in: tuple[str, ...]  # NUM_AUX / NESTED / TOP: the first present sizes fc (else 3 taps)
    options: Mapping[str, tuple[str, ...]]  # option -> the places it is read from (TOP / NESTED), first present wins
    architectures: tuple[str, ...] = ()  # the draft architectures that load this class ("mla"; "llama" takes the rest)
    architectures_ref: str = ""  # where the engine registers them


@dataclasses.dataclass(frozen=True)
class Write:
    """What to write so that an engine captures given taps: ``{ids}`` and ``{n}`` are filled in ``template``."""

    where: str  # e.g. "draft config.json, top level"
    template: str  # e.g. '"eagle_aux_hidden_state_layer_ids": {ids}'
    embed_note: str = ""  # said when the taps include the embedding
    keeps_spec_order: bool = False  # served with this plugin's capture, which concatenates in the spec's order

    def line(self, ids: Sequence[int], num_taps: int) -> str:
        return self.template.format(ids=json.dumps(list(ids)), n=num_taps)


@dataclasses.dataclass(frozen=True)
class VersionRule:
    """The releases of ``package`` an entry holds for, a PEP 440 specifier (``">=0.5.13"``)."""

    package: str
    flag: str  # how a command line names this rule (``inspect --sglang-version``)
    releases: str

    def holds(self, version: str) -> bool:
        # "0.5.12.post1" counts as 0.5.12, "0.6.0rc1" as 0.6.0 (versions.release_in)
        return release_in(SpecifierSet(self.releases), version)


@dataclasses.dataclass(frozen=True)
class Engine:
    """One engine (or trainer) and version rule: how its ids mean taps and what it does with them."""

    name: str  # the convention name users write (``--convention``, ``draft_ids_convention``)
    label: str  # the engine and version as messages name it, e.g. "vLLM 0.32"
    description: str
    code_ref: str
    to_taps: IdRule
    to_ids: IdRule
    min_id: int
    max_id_offset: int  # the largest valid id is num_layers + max_id_offset
    embed_id: int | None  # the id that means tap 0, None where the embedding cannot be written
    concat_order: str  # "ascending" (the engine sorts) or "listed" (it keeps the list)
    list_readings: tuple[ListReading, ...]  # the first is the engine's own reading
    serving: bool = False  # captures from a draft config at serving time (``inspect`` shows what it captures)
    draft_classes: Mapping[str, DraftClass] = dataclasses.field(default_factory=dict)  # "llama" / "mla"
    write: Write | None = None  # None: no config line is written for it
    version: VersionRule | None = None
    aliases: tuple[str, ...] = ()
    exact_count: int | None = None
    count_reason: str = ""  # why exact_count holds, with the source line
    max_tap_offset: int = 0  # the largest tap this engine can capture is num_layers + max_tap_offset
    tap_reason: str = ""  # why a tap above that cannot be captured
    served_count: int | None = None  # ids of any count are read, but only this many taps are served (write check)
    served_reason: str = ""  # why, with the source line

    def __post_init__(self) -> None:
        if self.concat_order not in ("ascending", "listed"):
            raise ValueError(
                f"engine {self.name}: concat_order must be 'ascending' or 'listed', got {self.concat_order!r}"
            )
        if not self.list_readings or any(p not in (TOP, NESTED) for r in self.list_readings for p in r.lists):
            raise ValueError(
                f"engine {self.name}: list_readings must name at least one reading of {TOP!r} / {NESTED!r} lists"
            )
        if "mla" in self.draft_classes and not self.draft_classes["mla"].architectures:
            raise ValueError(f"engine {self.name}: its mla draft class must list the architectures that load it")

    @property
    def reads(self) -> str:
        """The list the engine's own reading takes first: "top-level" or "nested"."""
        return "top-level" if self.list_readings[0].lists[0] == TOP else "nested"

    def id_range(self, num_layers: int) -> tuple[int, int]:
        return self.min_id, num_layers + self.max_id_offset

    def validate_taps(self, taps: Sequence[int], num_layers: int) -> None:
        """Refuse taps this engine cannot capture, and a count it cannot take, naming the reason."""
        top = num_layers + self.max_tap_offset
        for t in taps:
            if t > top:
                raise CaptureSpecError(
                    f"{self.name} cannot capture tap {t} of a {num_layers}-layer model (its "
                    f"largest is {top}): {self.tap_reason}"
                )
        if self.exact_count is not None and len(taps) != self.exact_count:
            raise CaptureSpecError(
                f"{self.name} requires exactly {self.exact_count} ids, got {len(taps)} ({self.count_reason})"
            )


IDS_LINE = '"eagle_aux_hidden_state_layer_ids": {ids}'
SGLANG_LINE = '"eagle_config": {{"eagle_aux_hidden_state_layer_ids": {ids}, "use_aux_hidden_state": true}}'

_VLLM_LLAMA = DraftClass(
    source="llama_eagle3.py LlamaDecoderLayer.__init__, LlamaModel.__init__",
    fan_in=(NUM_AUX, NESTED),
    options={
        "fc_norm": (TOP,),
        "norm_before_fc": (NESTED, TOP),
        "norm_output": (TOP,),
        "norm_before_residual": (TOP,),
    },
)
_VLLM_MLA = DraftClass(
    source="deepseek_eagle3.py DeepseekV2Eagle3DecoderLayer.__init__, DeepseekV2Eagle3Model.__init__",
    fan_in=(NUM_AUX, NESTED),
    options={"fc_norm": (TOP,), "norm_output": (TOP,), "norm_before_residual": (TOP,)},
    architectures=("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"),
    architectures_ref="registry.py _SPECULATIVE_DECODING_MODELS",
)
_SGLANG_LLAMA = DraftClass(
    source="llama_eagle3.py LlamaDecoderLayer.forward, LlamaModel.__init__",
    fan_in=(NUM_AUX, NESTED),
    options={"fc_norm": (TOP,), "use_aux_norm": (TOP,), "norm_before_fc": (NESTED, TOP), "norm_output": (TOP,)},
)
_SGLANG_MLA = DraftClass(
    source="kimi_k25_eagle3.py _get_eagle_aux_layer_count, Eagle3MLADecoderLayer.forward, Eagle3MLAModel.__init__",
    fan_in=(NESTED, TOP),
    options={"fc_norm": (TOP,), "use_aux_norm": (TOP,), "norm_output": (TOP,)},
    architectures=("Eagle3DeepseekV2ForCausalLM",),
    architectures_ref="kimi_k25_eagle3.py EntryClass",
)

ENGINES: dict[str, Engine] = {
    engine.name: engine
    for engine in (
        Engine(
            name="vllm",
            label="vLLM 0.32",
            description="vLLM 0.32/0.33: id k is tap k (no transform); 0 = embedding",
            code_ref="vllm/v1/worker/gpu_model_runner.py (ids from the draft config, handed to the model unchanged)",
            to_taps=identity,
            to_ids=identity,
            min_id=0,
            max_id_offset=0,
            embed_id=EMBED,
            concat_order="ascending",
            list_readings=(
                ListReading("vLLM 0.32 V2 runner (top-level list)", (TOP,)),
                ListReading("vLLM 0.32 V1 runner (top-level, else nested)", (TOP, NESTED)),
            ),
            serving=True,
            draft_classes={"llama": _VLLM_LLAMA, "mla": _VLLM_MLA},
            write=Write(
                "draft config.json, top level + eagle_config",
                IDS_LINE + ', "num_aux_hidden_states": {n}',
                embed_note="tap embed on DeepSeek/Kimi needs the vllm-eagle3 plugin: stock vLLM 0.32 crashes on id 0",
                keeps_spec_order=True,
            ),
            aliases=("vllm-v1", "vllm-v2"),
        ),
        Engine(
            name="speculators",
            label="speculators 0.9",
            description="speculators 0.9: vLLM's convention, range [0, L]",
            code_ref="speculators models/eagle3 config -> vLLM transformers_utils/configs/speculators/algos.py",
            to_taps=identity,
            to_ids=identity,
            min_id=0,
            max_id_offset=0,
            embed_id=EMBED,
            concat_order="ascending",
            list_readings=(ListReading("speculators 0.9 (top-level list)", (TOP,)),),
            write=Write("config.json", IDS_LINE),
        ),
        Engine(
            name="hf",
            label="Hugging Face transformers",
            description="Hugging Face output_hidden_states index: id k is tap k",
            code_ref="transformers modeling outputs: hidden_states[0] = embeddings",
            to_taps=identity,
            to_ids=identity,
            min_id=0,
            max_id_offset=0,
            embed_id=EMBED,
            concat_order="listed",
            list_readings=(ListReading("hf (top-level list)", (TOP,)),),
            aliases=("huggingface", "transformers"),
        ),
        Engine(
            name="sglang",
            label="SGLang 0.5.23",
            description="SGLang 0.5.13..0.5.23 DeepSeek/Kimi: id k is tap k, unless the list starts with 1 (then every "
            "id is shifted +1); 0 = embedding; -1 fails; any number of ids; tap L not capturable",
            code_ref="sglang/srt/models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture (the ids), "
            "DeepseekV2Model.forward (the capture loop); model_runner_components/spec_aux_hidden_state.py "
            "_resolve_eagle_aux_hidden_state reads the nested eagle_config list",
            to_taps=sglang_ids_to_taps,
            to_ids=sglang_taps_to_ids,
            min_id=0,
            max_id_offset=-1,
            embed_id=EMBED,
            concat_order="ascending",
            list_readings=(ListReading("SGLang 0.5.13+ (nested list)", (NESTED,)),),
            serving=True,
            draft_classes={"llama": _SGLANG_LLAMA, "mla": _SGLANG_MLA},
            write=Write("draft config.json, eagle_config", SGLANG_LINE),
            version=VersionRule("sglang", "0.5.13+", ">=0.5.13"),
            aliases=("sglang-new", "sglang>=0.5.13", "sglang>=0.5.14"),
            max_tap_offset=-1,
            tap_reason="SGLang 0.5.23 captures only inside its decoder-layer loop (deepseek_v2.py "
            "DeepseekV2Model.forward: layers 0..L-1), so the final pre-norm state never arrives and the forward "
            "raises 'captured n-1 of n aux hidden states'; drop that tap or serve with vllm-eagle3",
        ),
        Engine(
            name="sglang-legacy",
            label="SGLang < 0.5.13 + embed patch",
            description="SGLang before PR #25454, i.e. <= 0.5.12.post1 (and its Llama path): id k is tap k+1 (always "
            "+1); -1 = embedding (with vllm_eagle3/model_patches/sglang_embed_tap.py); tap L not capturable",
            code_ref="sglang 0.5.12.post1 srt/models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture "
            "([val + 1 for val in layer_ids]), DeepseekV2Model.forward's capture loop (hidden_states + residual "
            "before layer i, residual None before layer 0: -1 needs the patch); model_executor/model_runner.py "
            "ModelRunner.__init__ reads the nested eagle_config list; parity-tested in "
            "tests/parity/test_sglang_legacy.py",
            to_taps=plus_one,
            to_ids=minus_one,
            min_id=-1,
            max_id_offset=-1,
            embed_id=-1,
            concat_order="ascending",
            list_readings=(ListReading("SGLang < 0.5.13 + embed patch (nested list)", (NESTED,)),),
            serving=True,
            write=Write("draft config.json, eagle_config", SGLANG_LINE),
            version=VersionRule("sglang", "legacy", "<0.5.13"),
            aliases=("sglang-old", "legacy-sglang"),
            max_tap_offset=-1,
            tap_reason="legacy SGLang (0.5.12.post1 deepseek_v2.py DeepseekV2Model.forward) captures only inside its "
            "decoder-layer loop (layers 0..L-1), so id L-1 is silently never captured (n-1 states arrive instead "
            "of n, no error); drop that tap or serve with vllm-eagle3",
            served_count=3,
            served_reason="SGLang 0.5.12.post1 sizes the EAGLE-3 draft-extend hidden-state buffer from the TARGET's "
            "config, not the draft's (srt/speculative/eagle_info.py EagleDraftExtendInput.hidden_size_for: "
            "num_aux_hidden_states or eagle_config ids there, else 3), i.e. 3 x hidden for a Kimi/DeepSeek target, "
            "so a head on another tap count meets a buffer of the wrong width in the draft-extend CUDA graph "
            "(eagle_draft_extend_cuda_graph_runner.py EAGLEDraftExtendCudaGraphRunner sizes it in __init__; "
            "replay skips the copy when the widths differ); SGLang 0.5.23 sizes it from the draft "
            "(speculative/eagle_utils.py get_draft_input_from_target_hidden_dim): write the ids for sglang "
            "(checked on 0.5.23) or serve with vllm-eagle3",
        ),
        Engine(
            name="specforge",
            label="SpecForge 0.2",
            description="SpecForge 0.2: id k = output of layer k = tap k+1; exactly 3 non-negative ids; the embedding "
            "cannot be written",
            code_ref="SpecForge specforge/algorithms/model_providers.py resolve_eagle_capture_layers",
            to_taps=plus_one,
            to_ids=minus_one,
            min_id=0,
            max_id_offset=-1,
            embed_id=None,
            concat_order="listed",
            list_readings=(ListReading("SpecForge 0.2 (nested list)", (NESTED,)),),
            write=Write("training config", "{ids}"),
            exact_count=3,
            count_reason="SpecForge's resolve_eagle_capture_layers (specforge/algorithms/model_providers.py) raises "
            "unless there are exactly three non-negative ids; train a head on other than three taps with TorchSpec "
            "or speculators",
        ),
        Engine(
            name="torchspec",
            label="TorchSpec",
            description="TorchSpec (lightseekorg): id k = output of layer k = tap k+1; ids 0..L-1, any number; the "
            "embedding cannot be written; exported kimi_k2 drafts are shifted to vLLM's convention",
            code_ref="TorchSpec torchspec/models/target/eagle3_target_model.py (a forward hook on layers[idx]'s "
            "output), tools/convert_to_hf.py _fixup_export_config (+1 on kimi_k2 export for vLLM)",
            to_taps=plus_one,
            to_ids=minus_one,
            min_id=0,
            max_id_offset=-1,
            embed_id=None,
            concat_order="listed",
            list_readings=(ListReading("TorchSpec (nested list)", (NESTED,)),),
        ),
    )
}
"""Every engine and version rule, in the order listings show them; consumers iterate it, never name a subset."""


def engine_for_version(package: str, version: str) -> Engine:
    """The entry whose version rule holds for ``package`` at ``version`` (e.g. SGLang 0.5.12.post1 -> legacy)."""
    found = [
        e
        for e in ENGINES.values()
        if e.version is not None and e.version.package == package and e.version.holds(version)
    ]
    if len(found) != 1:
        rules = [f"{e.name} ({e.version.flag})" for e in ENGINES.values() if e.version and e.version.package == package]
        raise CaptureSpecError(
            f"{package} {version}: {len(found)} engine entries hold for it (rules: {rules}); "
            "give each version range exactly one entry in vllm_eagle3/engines.py"
        )
    return found[0]


def version_flags(package: str) -> dict[str, Engine]:
    """``flag -> entry`` for the version rules of ``package`` (what ``inspect --sglang-version`` offers)."""
    return {e.version.flag: e for e in ENGINES.values() if e.version is not None and e.version.package == package}
