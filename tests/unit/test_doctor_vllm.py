"""``vllm-eagle3 doctor --engine vllm``: the files it hands the engine, checked without starting one.

Guards: an engine that refuses the capture draft at start-up (a fan-in or spec/config disagreement is found only
after a minutes-long start on 2 cores), an ``fc`` whose configured columns are not the head's own (the engine's
draft would not be the head fed the configured wiring), and a captured superset that misses a candidate's tap
(the candidate would silently drop out of the comparison). The engine run itself: tests/e2e/test_doctor.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
FIRST = REPO / "models" / "kimi-k25-mini-eagle3"  # taps [embed, 3, 31]
SECOND = REPO / "models" / "kimi-k25-mini-eagle3-taps-3-31-59"  # taps [3, 31, 59]

pytestmark = pytest.mark.skipif(
    not all((d / "config.json").is_file() for d in (TARGET, FIRST, SECOND)),
    reason="the miniature and both heads are not built",
)


def test_capture_superset_covers_every_candidate_of_both_heads_and_both_wirings():
    from vllm_eagle3.checkpoint import DraftInfo, TargetInfo
    from vllm_eagle3.tools.doctor import engine_taps
    from vllm_eagle3.wirings import candidate_wirings

    L = TargetInfo.load(TARGET).num_layers
    for draft in (FIRST, SECOND):
        need, first = engine_taps(TARGET, draft, taps=["embed,3,31", "3,31,59"])
        assert first == (0, 3, 31)
        assert {0, 3, 31, 59} <= need and L not in need and all(0 <= t < L for t in need)
        cands = candidate_wirings(DraftInfo.load(draft), L, 3, {"a": (0, 3, 31), "b": (3, 31, 59)})
        assert all(set(c.taps) <= need for c in cands if L not in c.taps), [
            c.label for c in cands if not set(c.taps) <= need
        ]


def test_engine_refuses_to_score_the_final_pre_norm_tap():
    from vllm_eagle3.spec import CaptureSpecError
    from vllm_eagle3.tools.doctor import engine_taps

    with pytest.raises(CaptureSpecError, match="final pre-norm state.*--engine hf"):
        engine_taps(TARGET, SECOND, taps=["3,31,61"])


def test_capture_draft_is_the_head_fed_the_configured_wiring_and_passes_the_plugins_checks(tmp_path):
    from safetensors.torch import load_file

    from vllm_eagle3.checkpoint import DraftInfo
    from vllm_eagle3.resolve import ENV_SPEC, resolve_from_env
    from vllm_eagle3.spec import taps_label
    from vllm_eagle3.tools.doctor import engine_taps
    from vllm_eagle3.tools.doctor.engine import capture_draft

    need, configured = engine_taps(TARGET, FIRST, taps=["embed,3,31", "3,31,59"])
    superset = sorted(need)
    out = capture_draft(FIRST, tmp_path / "vehicle", superset, configured)
    d = DraftInfo.load(out)
    assert d.top_ids == tuple(superset) and d.config["num_aux_hidden_states"] == len(superset)
    assert d.trained_taps is None  # the trainer's record would contradict the superset spec
    old, new = load_file(str(FIRST / "model.safetensors")), load_file(str(out / "model.safetensors"))
    h = old["fc.weight"].shape[0]
    assert new["fc.weight"].shape == (h, len(superset) * h)
    for i, t in enumerate(configured):
        j = superset.index(t)
        assert torch.equal(new["fc.weight"][:, j * h : (j + 1) * h], old["fc.weight"][:, i * h : (i + 1) * h]), t
    others = [j for j, t in enumerate(superset) if t not in configured]
    assert all(not new["fc.weight"][:, j * h : (j + 1) * h].any() for j in others)
    assert all(torch.equal(old[k], new[k]) for k in old if k != "fc.weight")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"taps: {taps_label(superset)}\nnum_layers: 61\ndraft_ids_convention: vllm\n")
    res = resolve_from_env(str(TARGET), str(out), environ={ENV_SPEC: str(spec)})  # what every worker runs
    assert res.spec.taps == tuple(superset) and tuple(res.runner_ids) == tuple(superset)


def test_greedy_mode_refuses_a_window_without_anchors(capsys):
    """Guards: ``--mode greedy --window 32`` continued 32-token prompts by 0 tokens and crashed on a NaN verdict."""
    from vllm_eagle3.tools import doctor

    code = doctor.main(
        ["--target", str(TARGET), "--draft", str(FIRST), "--mode", "greedy", "--window", "32", "--engine", "vllm"]
    )
    err = capsys.readouterr().err
    assert code == 1 and "--mode greedy continues 32-token prompts" in err and "--window >= 53" in err, err
