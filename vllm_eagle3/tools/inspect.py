"""``vllm-eagle3 inspect``: what a target + EAGLE-3 draft resolve to, and every known trap in the pair, at once.

Data flow position: static, before any engine starts (files and safetensors headers only). It shows the spec
(``target forward -> taps -> concat -> draft fc``) that :func:`vllm_eagle3.resolve.resolve_capture` resolves, the
ids in every engine convention, what each engine would actually capture from this draft config, and WARNINGS for
the traps in ``docs/conventions.md``. ``resolve_capture`` stops at the first error (right for start-up); this
module collects them all (right for a diagnosis), reusing resolve's readers and conventions' converters.

Traps checked (each warning has a ``code`` the tests pin):
- ``nested-only``: ids only in ``eagle_config`` -> vLLM's V2 runner ignores them and uses its default taps;
- ``top-only``: ids only at top level -> SGLang reads only the nested list and uses its default taps;
- ``lists-differ`` / ``no-ids``: two different lists, or none (every engine silently uses its defaults);
- ``engine-reads``: an engine would capture other taps than the spec (e.g. SGLang < 0.5.13 reading [2, 30, 58]);
  SGLang is checked for ONE version rule of the engine table (``--sglang-version``; default: legacy when the ids
  are declared sglang-legacy, else 0.5.13+), because the same nested list means different taps before and after
  0.5.13 (PR #25454);
- ``d2t-missing`` / ``draft-vocab``: a reduced draft vocabulary without ``d2t`` (draft id i -> target id i);
- ``norm-before-fc`` / ``fc-norm`` / ``norm-exclusive``: config flags vs the weights (vLLM drops or defaults them);
- ``option-ignored`` / ``fan-in-engines`` / ``mla-arch`` / ``mla-model-type`` / ``mla-layers``: EAGLE-3.1 options
  and fan-in as vLLM 0.32 and SGLang 0.5.23 each read them (:func:`vllm_eagle3.checkpoint.draft_option_warnings`);
- ``fan-in`` / ``num-aux`` / ``aux-off``: the draft's ``fc`` vs the number of taps vLLM will size it for;
- ``order``: a non-ascending spec, which engines that sort cannot feed without this plugin;
- ``embed-crash``: tap 0 on vLLM's DeepSeek/Kimi path without the plugin (``Tensor + None``);
- ``--config-only``: a published head's config.json without weights (the weight checks are skipped, and said so);
  the report then says what vLLM 0.32, SGLang 0.5.23 and SGLang < 0.5.13 capture and what to write for each;
- ``spec-override`` / ``spec-assert`` / ``algorithm`` / ``tbo`` / ``draft-path``: SGLang speculative flags that
  override or contradict each other (e.g. ``--speculative-num-steps 1`` capping
  ``--speculative-num-draft-tokens 16`` to 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Mapping

from vllm_eagle3.conventions import (
    CONVENTIONS,
    engine_default_ids,
    engine_order,
    get_convention,
    ids_to_taps,
    taps_to_ids,
)
from vllm_eagle3.engines import ENGINES, NESTED, TOP, Engine, version_flags
from vllm_eagle3.checkpoint import IDS_KEY, DraftInfo, TargetInfo, draft_option_warnings, draft_readings
from vllm_eagle3.resolve import Resolution, ids_for_engines, resolve_capture
from vllm_eagle3.spec import CaptureSpec, CaptureSpecError, taps_label
from vllm_eagle3.tools.sglang_args import Finding, parse_sglang_args, sglang_findings


# ----------------------------------------------------------------------------------------------- draft checks


def _weights(draft: DraftInfo, stem: str) -> dict[str, list[int]]:
    """Shapes of the draft weights named ``stem*`` (with or without a ``model.`` prefix)."""
    return {k: v for k, v in draft.shapes.items() if k.startswith(stem) or k.startswith("model." + stem)}


def _blind_to(where: str) -> list[str]:
    """The serving engines' readings (engine table) that never look at the ``where`` list."""
    return [r.label for e in ENGINES.values() if e.serving for r in e.list_readings if where not in r.lists]


def _they(names: list[str], verb: str) -> str:
    return f"{', '.join(names)} {verb}{'s' if len(names) == 1 else ''}"


def draft_findings(target: TargetInfo, draft: DraftInfo) -> list[Finding]:
    """Traps in the draft's config and weights (vLLM 0.32 ``llama_eagle3.py`` reads; SGLang reads the nested list)."""
    out: list[Finding] = []
    L, H = target.num_layers, target.hidden_size
    cfg, nested = draft.config, (draft.config.get("eagle_config") or {})
    top, nest = draft.top_ids, draft.nested_ids
    defaults = list(engine_default_ids(L))
    if top is None and nest is None:
        out.append(
            Finding(
                "no-ids",
                (
                    f"the draft config has no {IDS_KEY}: vLLM and SGLang silently capture their default taps "
                    f"{defaults} "
                    "(whatever the draft was trained on). Write the ids the draft was trained on "
                    "(`vllm-eagle3 doctor` measures them, `vllm-eagle3 convert` writes both lists)"
                ),
            )
        )
    elif top is None and _blind_to(NESTED):
        out.append(
            Finding(
                "nested-only",
                (
                    f"ids only in eagle_config.{IDS_KEY} = {list(nest)}: {_they(_blind_to(NESTED), 'read')} only the "
                    f"top-level list: the default taps {defaults} are captured silently. Copy the list to the top "
                    "level "
                    "(`vllm-eagle3 convert --from C --to C` writes both)"
                ),
            )
        )
    elif nest is None and _blind_to(TOP):
        out.append(
            Finding(
                "top-only",
                (
                    f"ids only at the top level ({list(top)}): {_they(_blind_to(TOP), 'read')} only "
                    f"eagle_config.{IDS_KEY}: "
                    f"the default taps {defaults} are captured silently (SGLang: models/deepseek_v2.py "
                    "set_eagle3_layers_to_capture). Copy the list into eagle_config in that engine's convention "
                    "(`vllm-eagle3 convert`)"
                ),
            )
        )
    elif tuple(top) != tuple(nest):
        out.append(
            Finding(
                "lists-differ",
                (
                    f"two different id lists: top-level {list(top)} (vLLM) and eagle_config {list(nest)} (SGLang); the "
                    "engines capture different taps. Keep one wiring, written in each engine's convention"
                ),
            )
        )
    # Vocabulary mapping.
    lm = (_weights(draft, "lm_head.weight") or {}).values()
    lm_rows = next(iter(lm))[0] if lm else None
    draft_vocab = cfg.get("draft_vocab_size")
    if draft.shapes:
        reduced = (draft_vocab is not None and draft_vocab != target.vocab_size) or (
            lm_rows is not None and lm_rows != target.vocab_size
        )
        if reduced and not draft.has("d2t"):
            out.append(
                Finding(
                    "d2t-missing",
                    (
                        f"the draft predicts a reduced vocabulary ({draft_vocab or lm_rows} of {target.vocab_size} "
                        "tokens) but "
                        "has no d2t tensor: vLLM maps draft token i to target token i (wrong tokens, near-zero "
                        "acceptance, no "
                        "error). Export d2t with the draft"
                    ),
                )
            )
        if draft_vocab is None and lm_rows is not None and lm_rows != target.vocab_size:
            out.append(
                Finding(
                    "draft-vocab",
                    (
                        f"lm_head has {lm_rows} rows but the config has no draft_vocab_size: vLLM then assumes the "
                        "full "
                        f'{target.vocab_size} and fails to load lm_head. Add "draft_vocab_size": {lm_rows}'
                    ),
                )
            )

    # Norms around fc: config flags as vLLM's draft class reads them (checkpoint.draft_readings) vs the weights.
    vllm = draft_readings(cfg)[0]
    nbf, fcn = vllm.options.get("norm_before_fc", False), vllm.options.get("fc_norm", False)
    if draft.shapes:
        input_norm = _weights(draft, "input_norm.")
        fc_norms = _weights(draft, "fc_norm.")
        if nbf and not input_norm:
            out.append(
                Finding(
                    "norm-before-fc",
                    (
                        "config says norm_before_fc but the weights have no input_norm.weight: vLLM then "
                        "normalises the "
                        "concatenated taps with an all-ones weight the draft never saw. Export input_norm with the "
                        "draft or "
                        "set norm_before_fc false if it was trained without it"
                    ),
                )
            )
        if input_norm and not nbf:
            out.append(
                Finding(
                    "norm-before-fc",
                    (
                        "the weights hold input_norm.weight but norm_before_fc is not set: vLLM silently drops the "
                        "norm and "
                        'feeds fc un-normalised taps. Set "norm_before_fc": true (in eagle_config or at top level)'
                    ),
                )
            )
        if fcn and not fc_norms:
            out.append(
                Finding(
                    "fc-norm",
                    (
                        "config says fc_norm but the weights have no fc_norm.{i}.weight: vLLM uses all-ones "
                        "per-tap norms the "
                        "draft never saw. Export them or set fc_norm false"
                    ),
                )
            )
        if fc_norms and not fcn:
            out.append(
                Finding(
                    "fc-norm",
                    (
                        f"the weights hold {len(fc_norms)} fc_norm tensors but fc_norm is not set in the config: "
                        "vLLM has no "
                        'module for them and refuses to load (or ignores them). Set "fc_norm": true'
                    ),
                )
            )
    # EAGLE-3.1 options and fan-in as each engine reads them (names the engine and version where they differ).
    out += [Finding(code, message) for code, message in draft_option_warnings(cfg)]

    # Fan-in: what vLLM sizes fc for vs the weights vs the ids.
    if isinstance(nested, Mapping) and nested.get("use_aux_hidden_state") is False:
        out.append(
            Finding(
                "aux-off",
                (
                    "eagle_config.use_aux_hidden_state is false: vLLM and SGLang then feed the draft the last "
                    "hidden state "
                    "and no taps (fc is skipped). Set it true for an EAGLE-3 head"
                ),
            )
        )
    fc_in = draft.fc_in_features
    ids = top if top is not None else nest
    if fc_in is not None and fc_in % H != 0:
        out.append(
            Finding(
                "fan-in",
                (
                    f"the draft's fc takes {fc_in} inputs, not a multiple of the target hidden size {H}: this draft "
                    "is for "
                    "another target"
                ),
            )
        )
    elif fc_in is not None:
        trained = fc_in // H
        if ids is not None and len(ids) != trained:
            out.append(
                Finding(
                    "fan-in",
                    (
                        f"the draft's fc takes {fc_in} = {trained} x {H} inputs but its ids {list(ids)} name "
                        f"{len(ids)} taps; "
                        f"list the {trained} taps it was trained on"
                    ),
                )
            )
        if vllm.num_taps != trained:
            out.append(
                Finding(
                    "num-aux",
                    (
                        f"{vllm.engine} sizes fc for {vllm.num_taps} taps (from {vllm.num_taps_from}) but fc.weight "
                        "has "
                        f'{trained} x {H} inputs: loading fails. Set "num_aux_hidden_states": {trained}'
                    ),
                )
            )
    elif draft.shapes:
        out.append(Finding("fan-in", f"the draft has no fc.weight: is {draft.path} an EAGLE-3 head?"))
    return out


def _reading_label(name: str, index: int = 0) -> str:
    return ENGINES[name].list_readings[index].label


VLLM_V2, VLLM_V1 = _reading_label("vllm"), _reading_label("vllm", 1)
SGLANG_NEW, SGLANG_LEGACY = _reading_label("sglang"), _reading_label("sglang-legacy")
"""Report names of the readings tests and the doctor single out (from the engine table)."""


def sglang_versions() -> dict[str, Engine]:
    """``--sglang-version`` values -> the SGLang entry of the engine table each names (a version rule each)."""
    return version_flags("sglang")


def engine_reads(target: TargetInfo, draft: DraftInfo) -> dict[str, tuple[int, ...] | str]:
    """The taps each serving engine's readings (``list_readings``) would capture from this draft config as written
    (defaults where a reading finds no list)."""
    L = target.num_layers
    default = engine_default_ids(L)  # every engine's fallback, captured as taps (no shift applied)
    lists = {TOP: draft.top_ids, NESTED: draft.nested_ids}
    out: dict[str, tuple[int, ...] | str] = {}
    for engine in ENGINES.values():
        if not engine.serving:
            continue
        for reading in engine.list_readings:
            ids = next((lists[p] for p in reading.lists if lists[p] is not None), None)
            if ids is None:
                out[reading.label] = tuple(default)
                continue
            try:
                out[reading.label] = ids_to_taps(ids, engine.name, L)
            except CaptureSpecError as exc:
                out[reading.label] = f"fails: {exc}"
    return out


def engine_writes(spec: CaptureSpec, num_layers: int) -> dict[str, str]:
    """For each engine with a ``write``: the ids that make it capture ``spec``, where to write them, or why it
    cannot."""
    out = {}
    for engine in ENGINES.values():
        if engine.write is None:
            continue
        try:
            ids = taps_to_ids(spec.taps, engine.name, num_layers)
        except CaptureSpecError as exc:
            out[engine.label] = f"cannot: {exc}"
            continue
        order = engine_order(spec.taps, engine.name)
        note = (
            ""
            if order == spec.taps or engine.write.keeps_spec_order
            else f"; it concatenates {CaptureSpec(order).label()}, not the draft's order"
        )
        out[engine.label] = (
            f"{list(ids)} ({engine.name} ids, in {engine.write.where}; num_aux_hidden_states = {spec.num_taps}){note}"
        )
    return out


def spec_findings(
    target: TargetInfo, spec: CaptureSpec, reads: Mapping[str, Any], sglang_version: str = "0.5.13+"
) -> list[Finding]:
    """The spec vs what vLLM (both runners) and ONE SGLang version capture from the config as written."""
    out = []
    skip = {r.label for flag, e in sglang_versions().items() if flag != sglang_version for r in e.list_readings}
    for engine, taps in reads.items():
        if engine in skip:
            continue
        if isinstance(taps, str):
            out.append(Finding("engine-reads", f"{engine} {taps}"))
        elif sorted(taps) != sorted(spec.taps):
            out.append(
                Finding(
                    "engine-reads",
                    (
                        f"{engine} would capture taps {taps_label(taps)}, not the spec's {spec.label()}: the draft "
                        "gets the wrong hidden states and acceptance collapses without any error. Rewrite the "
                        "ids for that engine (`vllm-eagle3 convert`)"
                    ),
                )
            )
    if list(spec.taps) != sorted(spec.taps):
        out.append(
            Finding(
                "order",
                (
                    f"the spec {spec.label()} is not ascending: vLLM and SGLang concatenate in ascending tap order "
                    f"{CaptureSpec(engine_order(spec.taps, 'vllm')).label()}; only the vllm-eagle3 capture keeps "
                    "the draft's "
                    "order"
                ),
            )
        )
    if spec.has_embed and target.plugin_captures:
        out.append(
            Finding(
                "embed-crash",
                (
                    f"tap embed on {target.architecture}: stock vLLM 0.32/0.33 crashes at the first forward "
                    "('Tensor + None', deepseek_v2.py); serve with the vllm-eagle3 plugin, which captures the embedding"
                ),
            )
        )
    return out


# ----------------------------------------------------------------------------------------------- the report


@dataclasses.dataclass
class Report:
    target: TargetInfo | None = None
    draft: DraftInfo | None = None
    resolution: Resolution | None = None
    spec: CaptureSpec | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    reads: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]


def inspect_pair(
    target: str | Path,
    draft: str | Path,
    spec_path: str | Path | None = None,
    convention: str | None = None,
    sglang_args: str | None = None,
    sglang_version: str | None = None,
    weights: bool = True,
) -> Report:
    """Collect everything: the resolution (or its error) and every warning. Never raises CaptureSpecError.

    ``sglang_version`` ("0.5.13+" or "legacy") picks the SGLang reading checked against the spec; by default
    "legacy" when the draft ids are declared sglang-legacy (``convention`` or the spec's ``draft_ids_convention``).
    ``weights=False`` inspects the draft's config.json alone (a published head without its weights).
    """
    rep = Report()
    try:
        rep.target = TargetInfo.load(target)
    except CaptureSpecError as exc:
        rep.errors.append(f"target: {exc}")
    try:
        rep.draft = DraftInfo.load(draft, weights=weights)
    except CaptureSpecError as exc:
        rep.errors.append(f"draft: {exc}")
    if sglang_args:
        try:
            rep.findings += sglang_findings(parse_sglang_args(sglang_args), Path(draft))
        except CaptureSpecError as exc:
            rep.errors.append(str(exc))
    if rep.target is None or rep.draft is None:
        return rep
    try:
        rep.findings = draft_findings(rep.target, rep.draft) + rep.findings
    except CaptureSpecError as exc:
        rep.errors.append(f"draft: {exc}")
        return rep
    rep.reads = engine_reads(rep.target, rep.draft)
    try:
        rep.resolution = resolve_capture(target, rep.draft, spec_path=spec_path, convention=convention)
        rep.spec = rep.resolution.spec
    except CaptureSpecError as exc:
        rep.errors.append(f"resolve: {exc}")
        rep.spec = _fallback_spec(rep, spec_path, convention)
    if rep.spec is not None:
        version = sglang_version or _declared_sglang_version(spec_path, convention)
        rep.findings += spec_findings(rep.target, rep.spec, rep.reads, version)
    return rep


def _declared_sglang_version(spec_path, convention) -> str:
    from vllm_eagle3.resolve import load_spec_file

    declared = convention
    if declared is None and spec_path is not None:
        try:
            declared = load_spec_file(spec_path).draft_ids_convention
        except CaptureSpecError:
            declared = None
    try:
        engine = get_convention(declared) if declared is not None else None
    except CaptureSpecError:
        engine = None
    if engine is not None and engine.version is not None and engine.version.package == "sglang":
        return engine.version.flag
    return ENGINES["sglang"].version.flag


def _fallback_spec(rep: Report, spec_path, convention) -> CaptureSpec | None:
    """When resolution failed: the spec from the YAML, or the one id list present read under the given convention,
    so the per-engine comparison still runs."""
    from vllm_eagle3.resolve import load_spec_file

    try:
        if spec_path is not None:
            return load_spec_file(spec_path).spec
        ids = rep.draft.top_ids if rep.draft.top_ids is not None else rep.draft.nested_ids
        if convention is not None and ids is not None:
            return CaptureSpec(
                ids_to_taps(ids, convention, rep.target.num_layers),
                source=f"draft ids {list(ids)} read as {get_convention(convention).name}",
            )
    except CaptureSpecError:
        return None
    return None


def _fmt(v) -> str:
    return taps_label(v) if isinstance(v, tuple) else str(v)


def render(rep: Report) -> str:
    lines = []
    if rep.target:
        t = rep.target
        lines.append(f"target: {t.architecture}, {t.num_layers} layers, hidden {t.hidden_size}, vocab {t.vocab_size}")
    if rep.draft:
        d = rep.draft
        fc = d.fc_in_features
        lines.append(
            f"draft:  {d.path}: top-level ids {list(d.top_ids) if d.top_ids is not None else None}, "
            f"eagle_config ids {list(d.nested_ids) if d.nested_ids is not None else None}, "
            + (
                f"fc fan-in {fc}, d2t {'yes' if d.has('d2t') else 'no'}"
                if d.shapes
                else "config only (weights not read: fc fan-in, d2t and norm tensors unchecked)"
            )
        )
        lines.append(
            f"        {(d.config.get('architectures') or ['?'])[0]}, model_type {d.config.get('model_type')}, "
            f"vocab {d.config.get('vocab_size')}, draft vocab {d.config.get('draft_vocab_size')}"
        )
        for r in draft_readings(d.config) if not any(e.startswith("draft:") for e in rep.errors) else ():
            on = [k for k, v in r.options.items() if v]
            lines.append(
                f"        {r.engine} reads: fc for {r.num_taps} taps (from {r.num_taps_from}); options "
                f"{', '.join(on) if on else 'none'}"
            )
    if rep.resolution:
        lines.append("resolved: " + rep.resolution.log_line())
    if rep.spec is not None and rep.target is not None:
        lines.append(f"spec {rep.spec.label()} written in each convention:")
        for conv, ids in ids_for_engines(rep.spec, rep.target.num_layers).items():
            lines.append(f"  {conv:<14} {list(ids) if isinstance(ids, tuple) else ids}")
    if rep.draft is not None and rep.target is not None:
        ids = rep.draft.top_ids if rep.draft.top_ids is not None else rep.draft.nested_ids
        if ids is not None:
            lines.append(f"the draft config's ids {list(ids)} read in each convention:")
            for conv in CONVENTIONS:
                try:
                    meaning = taps_label(ids_to_taps(ids, conv, rep.target.num_layers))
                except CaptureSpecError as exc:
                    meaning = f"invalid ({exc})"
                lines.append(f"  {conv:<14} taps {meaning}")
    if rep.reads:
        lines.append("what each engine captures from this config as written:")
        for engine, taps in rep.reads.items():
            lines.append(f"  {engine:<46} {_fmt(taps)}")
    if rep.spec is not None and rep.target is not None:
        lines.append(f"what to write so that each engine captures {rep.spec.label()}:")
        for engine, text in engine_writes(rep.spec, rep.target.num_layers).items():
            lines.append(f"  {engine:<30} {text}")
    for f in rep.findings:
        lines.append(f"WARNING [{f.code}]: {f.message}")
    for e in rep.errors:
        lines.append(f"ERROR: {e}")
    n_w, n_e = len(rep.findings), len(rep.errors)
    lines.append(f"{n_e} error(s), {n_w} warning(s)" if n_e or n_w else "no errors, no warnings")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 inspect",
        description="Resolved capture spec of a target + EAGLE-3 draft, the ids in every engine convention, what "
        "each engine would capture, and warnings for every known trap (static: config files and "
        "safetensors headers only). Exit status: 1 on errors; with --strict also on warnings.",
    )
    p.add_argument("--target", required=True, help="target model folder (config.json)")
    p.add_argument("--draft", required=True, help="EAGLE-3 draft folder (config.json + safetensors)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--capture-spec", default=None, help="capture-spec YAML (taps: [embed, 3, 31])")
    g.add_argument(
        "--convention", default=None, help=f"convention of the draft config's ids ({', '.join(CONVENTIONS)})"
    )
    p.add_argument(
        "--sglang-args",
        default=None,
        help="an SGLang launch command line (string, or @FILE) whose speculative flags are checked",
    )
    p.add_argument(
        "--sglang-version",
        choices=tuple(sglang_versions()),
        default=None,
        help="which SGLang reading of the nested ids to check (default: legacy if the ids are declared "
        "sglang-legacy, else 0.5.13+)",
    )
    p.add_argument(
        "--config-only",
        action="store_true",
        help="read the draft's config.json alone (a published head without its weights); the fan-in, d2t "
        "and norm-tensor checks that need the safetensors headers are skipped, and the report says so",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when there are warnings")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rep = inspect_pair(
        args.target,
        args.draft,
        args.capture_spec,
        args.convention,
        args.sglang_args,
        args.sglang_version,
        weights=not args.config_only,
    )
    print(render(rep))
    if rep.errors or (args.strict and rep.findings):
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
