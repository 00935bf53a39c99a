"""The engine table (vllm_eagle3/engines.py) is the one place engine knowledge lives (no engine started).

Guards the bug of four tables: an engine added to the conventions but not to inspect's readings, its writers, the
doctor's config lines or the candidate wirings was silently left out of them. Here a made-up engine is added as ONE
entry, and every consumer shows it: ``vllm-eagle3 conventions`` (listing and conversions), ``inspect`` (what it
captures, what to write, how its draft class reads the config), ``convert --to`` it, and the candidate wirings.
"""

import json
from pathlib import Path

import pytest

from vllm_eagle3 import engines
from vllm_eagle3.checkpoint import DraftInfo, draft_readings
from vllm_eagle3.conventions import convert_ids, get_convention, ids_to_taps, taps_to_ids
from vllm_eagle3.engines import NESTED, TOP, DraftClass, Engine, ListReading, Write
from vllm_eagle3.spec import EMBED, CaptureSpecError

pytestmark = pytest.mark.unit
L = 61
HEADS = Path(__file__).parents[1] / "fixtures" / "published_heads"
KIMI = HEADS / "kimi-k2.5-target"
HEAD = HEADS / "lightseekorg-kimi-k2.5-eagle3-mla"  # eagle_config ids [2, 30, 58] in vLLM's convention, MLA head


def _plus_two(ids, num_layers):
    return tuple(i + 2 for i in ids)


def _minus_two(taps, num_layers):
    return tuple(t - 2 for t in taps)


READING = "Made-up 1.0 (top-level, else nested)"
MADE_UP = Engine(
    "madeup",
    "Made-up 1.0",
    "a made-up engine: id k is tap k+2; -2 = embedding",
    "nowhere.py L1-2",
    _plus_two,
    _minus_two,
    -2,
    -2,
    -2,
    "listed",
    (ListReading(READING, (TOP, NESTED)),),
    serving=True,
    draft_classes={
        "mla": DraftClass(
            "nowhere.py L3", (NESTED,), {"fc_norm": (TOP,)}, ("Eagle3DeepseekV2ForCausalLM",), "nowhere.py L4"
        )
    },
    write=Write("made-up.json", '"made_up_layers": {ids}'),
    aliases=("made-up",),
)


@pytest.fixture
def made_up(monkeypatch):
    """The made-up engine, registered in the table (one entry) for one test."""
    monkeypatch.setitem(engines.ENGINES, MADE_UP.name, MADE_UP)
    return MADE_UP


def test_conventions_list_and_convert_the_new_engine(made_up, capsys):
    """`vllm-eagle3 conventions` lists it and reads ids in it; conversions and aliases go through it."""
    from vllm_eagle3.tools.cli import conventions_main

    assert conventions_main(["--ids=-2,1,29"]) == 0
    out = capsys.readouterr().out
    assert "madeup         a made-up engine: id k is tap k+2" in out and "code: nowhere.py L1-2" in out
    assert "ids [-2, 1, 29] -> taps [embed, 3, 31]" in out
    assert get_convention("Made-Up") is made_up
    assert convert_ids([-1, 2, 30], "sglang-legacy", "madeup", L) == (-2, 1, 29)
    assert ids_to_taps([-2, 1, 29], "madeup", L) == (EMBED, 3, 31)
    with pytest.raises(CaptureSpecError, match=r"id 60 is out of range .* madeup convention \(valid: -2..59\)"):
        ids_to_taps([60], "madeup", L)


def test_inspect_shows_what_the_new_engine_reads_and_what_to_write(made_up):
    """inspect: its reading of the config (nested [2, 30, 58] read as madeup = taps 4/32/60) is compared with the spec
    and flagged; its write line and its draft class's fan-in are in the report."""
    from vllm_eagle3.tools import inspect

    rep = inspect.inspect_pair(KIMI, HEAD, convention="vllm", weights=False)
    assert rep.spec.taps == (2, 30, 58)
    assert rep.reads[READING] == (4, 32, 60)
    flagged = [f.message for f in rep.findings if f.code == "engine-reads" and f.message.startswith(READING)]
    assert flagged and "would capture taps [4, 32, 60]" in flagged[0]
    assert inspect.engine_writes(rep.spec, L)["Made-up 1.0"].startswith("[0, 28, 56] (madeup ids, in made-up.json")
    text = inspect.render(rep)
    assert "Made-up 1.0 reads: fc for 3 taps (from the eagle_config list); options none" in text
    assert "mla-arch" not in rep.codes  # it loads the head's architecture
    assert "madeup         taps [4, 32, 60]" in text  # the draft's ids read in each convention
    reading = {r.engine: r for r in draft_readings(json.loads((HEAD / "config.json").read_text()))}
    assert reading["Made-up 1.0"].source == "Made-up 1.0 nowhere.py L3"


def test_convert_to_the_new_engine(made_up, tmp_path, capsys):
    """`vllm-eagle3 convert --to madeup` writes its ids in both lists."""
    from vllm_eagle3.tools import convert

    out = tmp_path / "config.json"
    assert (
        convert.main(
            [str(HEAD / "config.json"), "--from", "vllm", "--to", "madeup", "--num-layers", str(L), "-o", str(out)]
        )
        == 0
    )
    cfg = json.loads(out.read_text())
    assert (
        cfg["eagle_aux_hidden_state_layer_ids"]
        == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        == [0, 28, 56]
    )
    assert "-> madeup ids [0, 28, 56]" in capsys.readouterr().err


def test_candidate_wirings_and_config_lines_include_the_new_engine(made_up):
    """The doctor and the online check score the new engine's reading of the config; the doctor prints its line."""
    from vllm_eagle3.wirings import candidate_wirings, config_lines, online_candidates

    draft = DraftInfo.from_config(json.loads((HEAD / "config.json").read_text()))
    why = {c.taps: c.why for c in candidate_wirings(draft, L, 3, exhaustive=False)}
    assert why[(4, 32, 60)] == "eagle_config ids [2, 30, 58] read as madeup"
    assert (4, 32, 60) in {c.taps for c in online_candidates((2, 30, 58), draft, L)}
    assert 'Made-up 1.0 (made-up.json): "made_up_layers": [0, 28, 56]' in config_lines((2, 30, 58), L)


def test_the_made_up_engine_is_gone_after_the_test():
    """The fixture registers it for one test only; the shipped table holds the seven engines and version rules."""
    assert list(engines.ENGINES) == ["vllm", "speculators", "hf", "sglang", "sglang-legacy", "specforge", "torchspec"]
    with pytest.raises(CaptureSpecError, match="unknown id convention 'madeup'"):
        get_convention("madeup")


@pytest.mark.parametrize(
    "version, name",
    [
        ("0.5.12.post1", "sglang-legacy"),
        ("0.5.12", "sglang-legacy"),
        ("0.5.13", "sglang"),
        ("0.5.23", "sglang"),
        ("0.6.0rc1", "sglang"),
    ],
)
def test_sglang_version_rule(version, name):
    """The SGLang parity harness and inspect's --sglang-version read the version boundary (0.5.13, PR #25454) from
    the table: a release on the wrong side would be checked against the other id rule."""
    assert engines.engine_for_version("sglang", version).name == name


def test_table_entries_are_complete():
    """Every serving engine says what to write for it; names, aliases and reading labels are unique (a duplicate
    would make one entry shadow another in the reports)."""
    es = list(engines.ENGINES.values())
    assert all(e.write is not None for e in es if e.serving)
    keys = [k for e in es for k in (e.name, *e.aliases)]
    assert len(keys) == len(set(keys))
    labels = [r.label for e in es for r in e.list_readings]
    assert len(labels) == len(set(labels))
    assert taps_to_ids((EMBED, 3, 31), "vllm", L) == (0, 3, 31)
    with pytest.raises(ValueError, match="concat_order must be"):
        Engine("x", "X", "d", "c", _plus_two, _minus_two, 0, 0, None, "sorted", (ListReading("X", (TOP,)),))
