"""`vllm-eagle3 convert` and `vllm-eagle3 inspect`: translation of draft configs and the trap detector.

Bugs guarded, each seen in the field (docs/conventions.md): a config whose ids mean other taps in another engine
(the incident: SGLang-legacy [2, 30, 58] = taps 3/31/59); ids only in the nested eagle_config (vLLM's V2 runner
silently uses its defaults) or only at top level (SGLang does); a reduced vocabulary without d2t; norm flags that
disagree with the weights (vLLM silently drops or defaults the norm); the incident's `--speculative-num-steps 1`
silently capping `--speculative-num-draft-tokens 16` at 2; and hostile input (not JSON, nested lists, missing
files) that must give one clear error and write nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_eagle3.testing.files import write_safetensors_zeros

from vllm_eagle3.tools import convert, inspect
from vllm_eagle3.conventions import ids_to_taps
from vllm_eagle3.spec import CaptureSpecError

pytestmark = pytest.mark.unit
H, L, V, DV = 128, 61, 4096, 1024
IDS = "eagle_aux_hidden_state_layer_ids"
INCIDENT_SGLANG_ARGS = (
    "python -m sglang.launch_server --model-path /models/kimi --speculative-algorithm EAGLE3 "
    "--speculative-draft-model-path /models/draft --speculative-num-steps 1 "
    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 16"
)


@pytest.fixture
def llama_target(tmp_path):
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": L, "hidden_size": H, "vocab_size": V})
    )
    return d


def make_draft(
    root: Path,
    top=(-1, 2, 30),
    nested=(-1, 2, 30),
    fan_in=3 * H,
    d2t=True,
    extra=None,
    extra_weights=None,
    name="draft",
) -> Path:
    d = root / name
    d.mkdir()
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": H,
        "draft_vocab_size": DV,
        "vocab_size": V,
        "eagle_config": {"use_aux_hidden_state": True},
        **(extra or {}),
    }
    if top is not None:
        cfg[IDS] = list(top)
    if nested is not None:
        cfg["eagle_config"][IDS] = list(nested)
    (d / "config.json").write_text(json.dumps(cfg))
    shapes = {"fc.weight": [H, fan_in], "lm_head.weight": [DV, H], **(extra_weights or {})}
    if d2t:
        shapes["d2t"] = [DV]
    write_safetensors_zeros(d / "model.safetensors", shapes)
    return d


# ------------------------------------------------------------------------------------------------ convert


def run_convert(*args: str) -> int:
    return convert.main(list(args))


def test_convert_incident_config_to_vllm_writes_both_lists(tmp_path, capsys):
    """The incident's SGLang-legacy [-1, 2, 30] is vLLM [0, 3, 31]: written top-level AND nested, with the count."""
    d = make_draft(tmp_path, top=None)
    out = tmp_path / "out.json"
    assert (
        run_convert(
            "--from", "sglang-legacy", "--to", "vllm", "--num-layers", str(L), str(d / "config.json"), "-o", str(out)
        )
        == 0
    )
    cfg = json.loads(out.read_text())
    assert cfg[IDS] == [0, 3, 31] and cfg["eagle_config"][IDS] == [0, 3, 31]
    assert cfg["num_aux_hidden_states"] == 3 and cfg["eagle_config"]["use_aux_hidden_state"] is True
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == DV
    assert "taps [embed, 3, 31]" in capsys.readouterr().err


def test_convert_round_trip_and_in_place(tmp_path, target):
    """vllm -> sglang-legacy -> vllm gives back the same taps; --in-place rewrites only the id keys."""
    d = make_draft(tmp_path, top=(0, 3, 31), nested=(0, 3, 31), extra={"custom_key": {"x": 1}})
    cfg_path = d / "config.json"
    assert (
        run_convert("--from", "vllm", "--to", "sglang-legacy", "--target", str(target), str(cfg_path), "--in-place")
        == 0
    )
    mid = json.loads(cfg_path.read_text())
    assert mid[IDS] == [-1, 2, 30] and mid["eagle_config"][IDS] == [-1, 2, 30] and mid["custom_key"] == {"x": 1}
    assert ids_to_taps(mid[IDS], "sglang-legacy", L) == (0, 3, 31)
    assert (
        run_convert("--from", "sglang-legacy", "--to", "vllm", "--num-layers", str(L), str(cfg_path), "--in-place") == 0
    )
    assert json.loads(cfg_path.read_text())[IDS] == [0, 3, 31]
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")], "temporary file left behind"


def test_convert_specforge_refuses_embedding_and_writes_nothing(tmp_path, capsys):
    """SpecForge has no id for the embedding tap: refuse with the reason, no output file, input untouched."""
    d = make_draft(tmp_path, top=(0, 3, 31), nested=(0, 3, 31))
    before = (d / "config.json").read_bytes()
    out = tmp_path / "out.json"
    assert (
        run_convert(
            "--from", "vllm", "--to", "specforge", "--num-layers", str(L), str(d / "config.json"), "-o", str(out)
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "cannot write taps [embed, 3, 31] in the specforge convention" in err
    assert "cannot express the embedding tap" in err
    assert not out.exists()
    assert (
        run_convert("--from", "vllm", "--to", "specforge", "--num-layers", str(L), str(d / "config.json"), "--in-place")
        == 1
    )
    assert (d / "config.json").read_bytes() == before
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]


def test_convert_to_specforge_without_embed_works(tmp_path):
    """A draft on taps 3/31/59 (vLLM [3, 31, 59]) is SpecForge [2, 30, 58]."""
    d = make_draft(tmp_path, top=(3, 31, 59), nested=None)
    new, summary = convert.convert_config(json.loads((d / "config.json").read_text()), "vllm", "specforge", L)
    assert new[IDS] == [2, 30, 58] and new["eagle_config"][IDS] == [2, 30, 58]
    assert "taps [3, 31, 59]" in summary


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", r"is not valid JSON"),
        ("[1, 2, 3]", r"must hold a JSON object, got list"),
        (json.dumps({IDS: [[-1, 2, 30]]}), r"is a nested list"),
        (json.dumps({IDS: [-1, "2", 30]}), r"holds '2', which is not an integer"),
        (json.dumps({IDS: "-1,2,30"}), r"must be a list of ints"),
        (json.dumps({"eagle_config": [1, 2]}), r"eagle_config must be an object"),
        (json.dumps({"hidden_size": 128}), r"has no eagle_aux_hidden_state_layer_ids .* nothing to convert"),
        (json.dumps({IDS: [-1, 2, 30], "eagle_config": {IDS: [2, 30, 58]}}), r"two different id lists"),
        (json.dumps({IDS: [-1, 2, 30], "num_aux_hidden_states": 2}), r"num_aux_hidden_states = 2"),
        (json.dumps({IDS: [-1, 2, 99]}), r"id 99 is out of range for a 61-layer model"),
    ],
)
def test_convert_hostile_config_is_a_clear_error_and_writes_nothing(tmp_path, capsys, content, message):
    """Malformed configs: one error line naming the problem; neither the output nor the input is written."""
    src = tmp_path / "config.json"
    src.write_text(content)
    out = tmp_path / "out.json"
    assert run_convert("--from", "sglang-legacy", "--to", "vllm", "--num-layers", str(L), str(src), "-o", str(out)) == 1
    err = capsys.readouterr().err
    assert "vllm-eagle3 convert: error:" in err
    assert re.search(message, err), err
    assert not out.exists() and src.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from", "vllm", "--to", "sglang", "--num-layers", "61", "{tmp}/missing.json"], r"does not exist"),
        (["--from", "vllm", "--to", "sglang", "{cfg}"], r"layer count is needed"),
        (["--from", "tensorrt", "--to", "sglang", "--num-layers", "61", "{cfg}"], r"unknown id convention 'tensorrt'"),
        (["--from", "vllm", "--to", "sglang", "--num-layers", "0", "{cfg}"], r"positive integer"),
        (["--from", "vllm", "--to", "sglang", "--num-layers", "61", "--target", "{tmp}", "{cfg}"], r"not both"),
        (
            ["--from", "vllm", "--to", "sglang", "--target", "{tmp}/nowhere", "{cfg}"],
            r"target config .* does not exist",
        ),
        (
            ["--from", "vllm", "--to", "sglang", "--num-layers", "61", "{cfg}", "-o", "{tmp}/nodir/out.json"],
            r"output folder .* does not exist",
        ),
        (["--from", "vllm", "--to", "sglang", "--num-layers", "61", "{cfg}", "-o", "{tmp}"], r"is a folder"),
    ],
)
def test_convert_bad_arguments(tmp_path, capsys, args, message):
    """Missing files, missing layer count, unknown convention, unwritable output: clear errors, nothing written."""
    import re

    d = make_draft(tmp_path, top=(0, 3, 31), nested=(0, 3, 31))
    before = (d / "config.json").read_bytes()
    args = [a.format(tmp=tmp_path, cfg=d / "config.json") for a in args]
    assert run_convert(*args) == 1
    assert re.search(message, capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]
    assert (d / "config.json").read_bytes() == before


def test_convert_ids_from_picks_one_list(tmp_path):
    d = make_draft(tmp_path, top=(0, 3, 31), nested=(2, 30, 58))
    cfg = json.loads((d / "config.json").read_text())
    with pytest.raises(CaptureSpecError, match="--ids-from"):
        convert.convert_config(cfg, "vllm", "sglang", L)
    new, _ = convert.convert_config(cfg, "vllm", "sglang", L, which="top")
    assert new[IDS] == new["eagle_config"][IDS] == [0, 3, 31]


def test_convert_prints_without_output(tmp_path, capsys):
    d = make_draft(tmp_path, top=(0, 3, 31), nested=None)
    assert run_convert("--from", "vllm", "--to", "sglang-legacy", "--num-layers", str(L), str(d / "config.json")) == 0
    assert json.loads(capsys.readouterr().out)["eagle_config"][IDS] == [-1, 2, 30]


# ------------------------------------------------------------------------------------------------ inspect


def codes(rep) -> set[str]:
    return set(rep.codes)


def test_inspect_incident(tmp_path, target):
    """The incident's config, spec and flags: every trap reported at once, not just the first."""
    d = make_draft(tmp_path, top=None, nested=(2, 30, 58), d2t=False, extra_weights={"input_norm.weight": [3 * H]})
    rep = inspect.inspect_pair(
        target,
        d,
        spec_path=Path(__file__).parents[2] / "configs" / "kimi_k25_eagle3.yaml",
        sglang_args=INCIDENT_SGLANG_ARGS,
    )
    assert {"nested-only", "d2t-missing", "norm-before-fc", "spec-override", "engine-reads", "embed-crash"} <= codes(
        rep
    )
    assert rep.errors and "ids only in eagle_config" in rep.errors[0]
    text = inspect.render(rep)
    assert "SGLang < 0.5.13 + embed patch (nested list)    [3, 31, 59]" in text
    assert "would capture taps [3, 31, 59], not the spec's [embed, 3, 31]" in text
    assert "replaced by --speculative-num-steps + 1 = 2" in text


def test_inspect_clean_pair_has_no_warnings(tmp_path, llama_target):
    """A correct config (both lists, vLLM convention, d2t, no norms) on a Llama target: nothing to report."""
    d = make_draft(tmp_path, top=(0, 3, 31), nested=(0, 3, 31), extra={"num_aux_hidden_states": 3})
    rep = inspect.inspect_pair(llama_target, d, convention="vllm")
    assert rep.errors == [] and rep.findings == [], inspect.render(rep)
    assert rep.spec.taps == (0, 3, 31)
    assert inspect.main(["--target", str(llama_target), "--draft", str(d), "--convention", "vllm", "--strict"]) == 0


@pytest.mark.parametrize(
    "draft_kw, code",
    [
        ({"top": (0, 3, 31), "nested": None}, "top-only"),
        ({"top": None, "nested": (0, 3, 31)}, "nested-only"),
        ({"top": (0, 3, 31), "nested": (1, 4, 32)}, "lists-differ"),
        ({"top": None, "nested": None}, "no-ids"),
        ({"d2t": False}, "d2t-missing"),
        ({"extra": {"norm_before_fc": True}}, "norm-before-fc"),
        ({"extra_weights": {"input_norm.weight": [3 * H]}}, "norm-before-fc"),
        ({"extra": {"fc_norm": True}}, "fc-norm"),
        ({"extra_weights": {f"fc_norm.{i}.weight": [H] for i in range(3)}}, "fc-norm"),
        ({"extra": {"fc_norm": True, "norm_before_fc": True}}, "norm-exclusive"),
        ({"fan_in": 2 * H}, "fan-in"),
        ({"fan_in": 2 * H + 7}, "fan-in"),
        ({"top": (0, 31), "nested": None, "fan_in": 2 * H}, "num-aux"),
        ({"extra": {"eagle_config": {"use_aux_hidden_state": False, IDS: [0, 3, 31]}}}, "aux-off"),
        ({"top": (1, 4, 32), "nested": (1, 4, 32)}, "engine-reads"),  # SGLang 0.5.13+ shifts a list starting with 1
        ({"top": (31, 3, 0), "nested": (31, 3, 0)}, "order"),
    ],
)
def test_inspect_each_trap(tmp_path, llama_target, draft_kw, code):
    """Each trap of docs/conventions.md produces its warning code (read as vLLM ids where a convention is needed)."""
    kw = {"top": (0, 3, 31), "nested": (0, 3, 31), **draft_kw}
    d = make_draft(tmp_path, **kw)
    rep = inspect.inspect_pair(llama_target, d, convention="vllm")
    assert code in codes(rep), inspect.render(rep)
    assert f"WARNING [{code}]" in inspect.render(rep)


def test_inspect_top_only_names_sglang_default(tmp_path, llama_target):
    d = make_draft(tmp_path, top=(0, 3, 31), nested=None)
    rep = inspect.inspect_pair(llama_target, d, convention="vllm")
    msg = next(f.message for f in rep.findings if f.code == "top-only")
    assert "SGLang 0.5.13+ (nested list), SGLang < 0.5.13 + embed patch (nested list) read only eagle_config" in msg
    assert "[2, 30, 58]" in msg and "vLLM" not in msg
    reads = rep.reads
    assert reads["SGLang 0.5.13+ (nested list)"] == (2, 30, 58)
    assert reads["vLLM 0.32 V2 runner (top-level list)"] == (0, 3, 31)


@pytest.mark.parametrize(
    "args, code, present",
    [
        (INCIDENT_SGLANG_ARGS, "spec-override", True),
        (
            "--speculative-algorithm EAGLE3 --speculative-num-steps=15 --speculative-eagle-topk=1 "
            "--speculative-num-draft-tokens=16",
            "spec-override",
            False,
        ),
        (
            "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 4 "
            "--speculative-num-draft-tokens 16",
            "spec-override",
            False,
        ),
        (
            "--speculative-algo EAGLE3 --speculative-num-steps 1 --speculative-num-draft-tokens 16",
            "spec-override",
            True,
        ),
        ("--speculative-algorithm EAGLE3 --speculative-num-draft-tokens 16", "spec-assert", True),
        ("--speculative-algorithm EAGLE --speculative-num-steps 3", "algorithm", True),
        ("--speculative-algorithm EAGLE3 --enable-two-batch-overlap", "tbo", True),
        ("--speculative-draft-model-path /elsewhere", "draft-path", True),
    ],
)
def test_inspect_sglang_flags(tmp_path, llama_target, args, code, present):
    """The incident's `--speculative-num-steps 1` caps `--speculative-num-draft-tokens 16` at 2 under topk 1."""
    d = make_draft(tmp_path, top=(0, 3, 31), nested=(0, 3, 31))
    rep = inspect.inspect_pair(llama_target, d, convention="vllm", sglang_args=args)
    assert (code in codes(rep)) is present, inspect.render(rep)


def test_sglang_args_from_file_with_continuations(tmp_path):
    f = tmp_path / "launch.sh"
    f.write_text(
        "# launch\npython -m sglang.launch_server \\\n  --speculative-num-steps 1 \\\n"
        "  --speculative-eagle-topk 1 \\\n  --speculative-num-draft-tokens 16  # the incident\n"
    )
    for text in (f"@{f}", str(f)):
        parsed = inspect.parse_sglang_args(text)
        assert parsed == {"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 16}
    with pytest.raises(CaptureSpecError, match="not an integer"):
        inspect.parse_sglang_args("--speculative-num-steps one")
    with pytest.raises(CaptureSpecError, match="quotes"):
        inspect.parse_sglang_args("--speculative-algorithm 'EAGLE3")
    with pytest.raises(CaptureSpecError, match="does not exist"):
        inspect.parse_sglang_args(f"@{tmp_path / 'nope.sh'}")


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("notjson", r"draft: draft config .* is not valid JSON"),
        ("nested", r"draft: .* is a nested list"),
        ("nodraft", r"draft: draft .* does not exist"),
        ("notarget", r"target: target config .* does not exist"),
        ("badheader", r"draft: .* is not a safetensors file"),
    ],
)
def test_inspect_hostile_input_is_reported_not_raised(tmp_path, target, capsys, breakage, message):
    """Broken files become ERROR lines and exit status 1, never a traceback."""
    d = make_draft(tmp_path)
    tgt = target
    if breakage == "notjson":
        (d / "config.json").write_text("{oops")
    elif breakage == "nested":
        (d / "config.json").write_text(json.dumps({IDS: [[0, 3, 31]]}))
    elif breakage == "nodraft":
        d = tmp_path / "nowhere"
    elif breakage == "notarget":
        tgt = tmp_path / "nowhere"
    elif breakage == "badheader":
        (d / "model.safetensors").write_bytes(b"\xff" * 8 + b"garbage")
    assert inspect.main(["--target", str(tgt), "--draft", str(d), "--convention", "sglang-legacy"]) == 1
    out = capsys.readouterr().out
    assert re.search("ERROR: " + message, out), out


def test_inspect_cli_strict_and_codes(tmp_path, llama_target, capsys):
    d = make_draft(tmp_path, top=None, nested=(0, 3, 31))
    rc = inspect.main(["--target", str(llama_target), "--draft", str(d), "--convention", "vllm", "--strict"])
    out = capsys.readouterr().out
    assert rc == 1 and "WARNING [nested-only]" in out and "ERROR: resolve:" in out


def test_doctor_without_a_tokenizer_is_an_error_not_bytes(tmp_path):
    """Guards issue 11: the doctor silently scored wirings on UTF-8 bytes when the target's tokenizer failed."""
    from vllm_eagle3.tools import doctor

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CaptureSpecError, match=r"cannot load the tokenizer of .* put tokenizer.json"):
        doctor.encode(tmp_path, "def f(x):\n    return x\n", 64)


# ------------------------------------------------------------------- published heads (issue 15), config only

HEADS = Path(__file__).parents[1] / "fixtures" / "published_heads"
KIMI = HEADS / "kimi-k2.5-target"
V2, V1 = inspect.VLLM_V2, inspect.VLLM_V1
SG, LEG = inspect.SGLANG_NEW, inspect.SGLANG_LEGACY

# head folder, the convention its ids are written in (README.md there), what each engine captures from the config
# as shipped, and the ids to write for vLLM 0.32 / SGLang 0.5.23 / SGLang < 0.5.13 so that it captures the trained taps
PUBLISHED = [
    (
        "lightseekorg-kimi-k2.5-eagle3-mla",
        "vllm",
        (2, 30, 58),
        {V2: (2, 30, 58), V1: (2, 30, 58), SG: (2, 30, 58), LEG: (3, 31, 59)},
        ([2, 30, 58], [2, 30, 58], [1, 29, 57]),
    ),
    (
        "lightseekorg-kimi-k2.5-eagle3-mla-torchspec",
        "torchspec",
        (2, 30, 58),
        {V2: (2, 30, 58), V1: (1, 29, 57), SG: (2, 30, 58), LEG: (2, 30, 58)},
        ([2, 30, 58], [2, 30, 58], [1, 29, 57]),
    ),
    (
        "lightseekorg-kimi-k2.7-coder-eagle3.1-mla",
        "torchspec",
        (2, 30, 58),
        {V2: (2, 30, 58), V1: (1, 29, 57), SG: (2, 30, 58), LEG: (2, 30, 58)},
        ([2, 30, 58], [2, 30, 58], [1, 29, 57]),
    ),
    (
        "AQ-MedAI-Kimi-K25-eagle3",
        "specforge",
        (3, 31, 59),
        {V2: (2, 30, 58), V1: (2, 30, 58), SG: (2, 30, 58), LEG: (3, 31, 59)},
        ([3, 31, 59], [3, 31, 59], [2, 30, 58]),
    ),
]


@pytest.mark.parametrize("head, conv, taps, reads, writes", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_inspect_published_head(head, conv, taps, reads, writes, capsys):
    """Each public Kimi K2.5 head's config: what vLLM 0.32 (both runners), SGLang 0.5.23 and SGLang < 0.5.13 capture
    from it as shipped, and what to write for each. Guards PR #25454's case (the exported lightseekorg head read by
    old SGLang = taps [3, 31, 59]) and vLLM #43671's (a list in another trainer's convention, one layer off)."""
    rep = inspect.inspect_pair(KIMI, HEADS / head, convention=conv, weights=False)
    assert rep.spec.taps == taps and rep.reads == reads, inspect.render(rep)
    wrong = {e for e, t in reads.items() if sorted(t) != sorted(taps)}
    flagged = {f.message.split(" would capture")[0] for f in rep.findings if f.code == "engine-reads"}
    assert flagged == wrong - ({LEG} if conv != "sglang-legacy" else {SG}), inspect.render(rep)
    assert "nested-only" in rep.codes  # every published head ships the nested list only: vLLM's V2 runner ignores it
    assert rep.errors and "ids only in eagle_config" in rep.errors[0]  # which the plugin refuses before start-up
    expected = inspect.engine_writes(rep.spec, 61)
    for engine, ids in zip(("vLLM 0.32", "SGLang 0.5.23", "SGLang < 0.5.13 + embed patch"), writes):
        assert expected[engine].startswith(f"{ids} ("), expected
    assert (
        inspect.main(["--config-only", "--target", str(KIMI), "--draft", str(HEADS / head), "--convention", conv]) == 1
    )
    out = capsys.readouterr().out
    assert "config only (weights not read" in out and "what to write so that each engine captures " in out


def test_published_eagle31_head_options_read_by_both_engines():
    """lightseekorg's EAGLE-3.1 MLA head (fc_norm + norm_output, top level): vLLM 0.32 deepseek_eagle3.py and SGLang
    0.5.23 kimi_k25_eagle3.py both read both flags, so no option warning; the report lists them per engine."""
    rep = inspect.inspect_pair(
        KIMI, HEADS / "lightseekorg-kimi-k2.7-coder-eagle3.1-mla", convention="torchspec", weights=False
    )
    assert not {"option-ignored", "fan-in-engines", "mla-arch", "mla-model-type"} & set(rep.codes)
    text = inspect.render(rep)
    assert "vLLM 0.32 reads: fc for 3 taps (from the eagle_config list); options fc_norm, norm_output" in text
    assert "SGLang 0.5.23 reads: fc for 3 taps (from the eagle_config list); options fc_norm, norm_output" in text


def test_convert_published_heads_to_every_engine(tmp_path):
    """The lightseekorg training list [1, 29, 57] (TorchSpec) written for each engine, both lists, num_aux = 3."""
    cfg = json.loads((HEADS / "lightseekorg-kimi-k2.5-eagle3-mla-torchspec" / "config.json").read_text())
    for dst, ids in (
        ("vllm", [2, 30, 58]),
        ("sglang", [2, 30, 58]),
        ("sglang-legacy", [1, 29, 57]),
        ("specforge", [1, 29, 57]),
    ):
        new, summary = convert.convert_config(cfg, "torchspec", dst, L)
        assert new[IDS] == new["eagle_config"][IDS] == ids and new["num_aux_hidden_states"] == 3, summary
        assert new["eagle_config"]["use_input_layernorm_in_first_layer"] is True  # everything else kept


def test_inspect_option_warning_names_engine(tmp_path, llama_target):
    """An EAGLE-3.1 option one engine would ignore is a WARNING naming that engine and version."""
    d = make_draft(
        tmp_path, top=(0, 3, 31), nested=(0, 3, 31), extra={"num_aux_hidden_states": 3, "norm_before_residual": True}
    )
    rep = inspect.inspect_pair(llama_target, d, convention="vllm")
    msg = next(f.message for f in rep.findings if f.code == "option-ignored")
    assert "norm_before_residual" in msg and "SGLang 0.5.23 never reads it" in msg


# ------------------------------------------------------------------------------------------ four taps

FOUR_CFG = {
    IDS: [0, 3, 31, 59],
    "eagle_config": {IDS: [0, 3, 31, 59]},
    "num_aux_hidden_states": 4,
    "architectures": ["Eagle3DeepseekV2ForCausalLM"],
    "model_type": "kimi_k2",
    "kv_lora_rank": 512,
}


@pytest.mark.parametrize(
    "dst, ids", [("vllm", [0, 3, 31, 59]), ("speculators", [0, 3, 31, 59]), ("sglang", [0, 3, 31, 59])]
)
def test_convert_four_taps_where_expressible(dst, ids):
    """vLLM 0.32 sizes fc from num_aux_hidden_states / the nested list (llama_eagle3.py LlamaModel.__init__); SGLang
    0.5.23 takes any number of ids: DeepseekV2ForCausalLM.set_eagle3_layers_to_capture keeps the list, the capture
    packer is sized len(list), the Llama draft's fc from num_aux_hidden_states or the nested list (llama_eagle3.py
    LlamaModel.__init__) and the draft-extend buffers from the draft's config (speculative/eagle_utils.py
    get_draft_input_from_target_hidden_dim)."""
    new, summary = convert.convert_config(FOUR_CFG, "vllm", dst, L)
    assert new[IDS] == new["eagle_config"][IDS] == ids and new["num_aux_hidden_states"] == 4, summary


@pytest.mark.parametrize(
    "cfg, dst, reasons",
    [
        (
            FOUR_CFG,
            "specforge",
            [
                r"specforge cannot express the embedding tap",
                r"specforge requires exactly 3 ids, got 4 \(SpecForge's resolve_eagle_capture_layers "
                r"\(specforge/algorithms/model_providers.py\) raises",
            ],
        ),
        (
            {**FOUR_CFG, IDS: [3, 31, 59, 60], "eagle_config": {IDS: [3, 31, 59, 60]}},
            "specforge",
            [r"specforge requires exactly 3 ids, got 4"],
        ),
        (FOUR_CFG, "torchspec", [r"torchspec cannot express the embedding tap"]),
        (
            {**FOUR_CFG, IDS: [0, 3, 31, 61], "eagle_config": {IDS: [0, 3, 31, 61]}},
            "sglang",
            [r"sglang cannot capture tap 61 .*deepseek_v2.py DeepseekV2Model.forward"],
        ),
        # SGLang 0.5.12.post1 captures and loads four, but sizes its draft-extend buffer from the TARGET's config
        # (3 x H).
        (
            FOUR_CFG,
            "sglang-legacy",
            [
                r"sglang-legacy ids can name 4 taps, but that engine serves 3 only \(SGLang "
                r"0.5.12.post1 .*eagle_info.py EagleDraftExtendInput.hidden_size_for.*write the ids for sglang"
            ],
        ),
    ],
)
def test_convert_refuses_four_taps_with_the_engines_reason(tmp_path, capsys, cfg, dst, reasons):
    src = tmp_path / "config.json"
    src.write_text(json.dumps(cfg))
    out = tmp_path / "out.json"
    assert convert.main([str(src), "--from", "vllm", "--to", dst, "--num-layers", "61", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("vllm-eagle3 convert: error: cannot write taps")
    for r in reasons:
        assert re.search(r, err), err
    assert not out.exists()


REPO = Path(__file__).resolve().parents[2]
SGLANG_SRT = {
    venv: REPO / venv / "lib" / "python3.11" / "site-packages" / "sglang" / "srt"
    for venv in (".venv-sglang", ".venv-sglang-legacy")
}


def cited_lines(venv: str, rel: str, first: int, last: int) -> str:
    path = SGLANG_SRT[venv] / rel
    if not path.is_file():
        pytest.skip(f"{path} is not installed (scripts/setup_sglang_env.sh)")
    return "".join(path.read_text().splitlines(keepends=True)[first - 1 : last])


def test_legacy_sglang_four_tap_refusal_cites_the_installed_code():
    """The sglang-legacy refusal's reason, pinned on the installed wheels' lines it cites (read, not run: SGLang's
    speculative loop needs CUDA): 0.5.12.post1 widens the draft-extend hidden states with num_aux read from the
    TARGET's config (default 3), 0.5.23 reads the draft runner's config."""
    legacy = cited_lines(".venv-sglang-legacy", "speculative/eagle_info.py", 877, 901)
    assert "def hidden_size_for" in legacy and "target_cfg = worker.target_worker.model_runner.model_config" in legacy
    assert "hf_config = target_cfg.hf_config" in legacy and "num_aux = len(layer_ids) if layer_ids else 3" in legacy
    graph = cited_lines(".venv-sglang-legacy", "speculative/eagle_draft_extend_cuda_graph_runner.py", 135, 135)
    assert "EagleDraftExtendInput.hidden_size_for(self.eagle_worker)" in graph
    skip = cited_lines(".venv-sglang-legacy", "speculative/eagle_draft_extend_cuda_graph_runner.py", 470, 476)
    assert "== buffers.hidden_states.shape[1]" in skip and "copy_(" in skip
    current = cited_lines(".venv-sglang", "speculative/eagle_utils.py", 237, 276)
    assert "def get_draft_input_from_target_hidden_dim(model_runner" in current
    assert "hf_config = model_config.hf_config" in current and "return target_hidden * num_aux" in current


def test_convert_warns_about_options_an_engine_ignores(tmp_path, capsys):
    src = tmp_path / "config.json"
    src.write_text(json.dumps({**FOUR_CFG, "norm_before_residual": True}))
    assert (
        convert.main(
            [str(src), "--from", "vllm", "--to", "sglang", "--num-layers", "61", "-o", str(tmp_path / "o.json")]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "vllm-eagle3 convert: warning: draft option norm_before_residual is set" in err
    assert "SGLang 0.5.23 never reads it (SGLang 0.5.23 kimi_k25_eagle3.py" in err
