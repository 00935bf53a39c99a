"""`vllm-eagle3 doctor` finds the taps a draft was trained on, from data, on drafts with PLANTED wirings.

The bug guarded: the incident's draft was trained on cat([embed, tap 3, tap 31]) but served with taps 3/31/59 and
nobody could tell without days of reading engine source. Here the wiring is planted, so the right answer is known:

* a tiny random DeepSeek-V3 target (real MLA + MoE architecture, transformers, float32);
* an EAGLE-3 head in vLLM's layout (`build_eagle3_draft`), made to depend on specific taps *analytically*: its
  attention and MLP outputs are zeroed so the head computes ``lm_head(norm(fc(cat(taps))))``, and ``fc`` /
  ``lm_head`` are the rank-H factors of a ridge regression from the planted taps to the target's greedy next token
  on the sample text. Fed the planted taps it agrees with the target on most positions; fed any other wiring its
  features are wrong and agreement collapses (a draft trained by SGD behaves the same, but takes minutes on 2 cores);
* its config carries ids in some engine convention (or the wrong ids outright).

The doctor must name the planted wiring, mark the engine readings of the config as ok/WRONG, and print config lines
that give back the planted taps. With the shipped miniature (when present) it must name [embed, 3, 31] for the
incident's config and flag taps 3/31/59, in under 2 minutes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NUM_LAYERS = 8
MAX_TOKENS = 320
TEXT = (REPO / "vllm_eagle3" / "spec.py").read_text()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny DeepSeek-V3 whose greedy next token depends on context (initializer_range 0.1: with the default
    0.02 the greedy token is almost a function of the current token alone, and no wiring can be told apart)."""
    from vllm_eagle3.testing.tiny import build_deepseek_v3

    return build_deepseek_v3(tmp_path_factory.mktemp("dsv3") / "target", num_layers=NUM_LAYERS,
                             initializer_range=0.1)


@pytest.fixture(scope="module")
def target_run(target):
    from vllm_eagle3.tools import doctor

    tokens, _ = doctor.encode(target, TEXT, MAX_TOKENS)
    return doctor.run_target(doctor.load_target(target), tokens)


def plant_draft(folder: Path, target: Path, run, taps: tuple[int, ...], ids: list[int], ridge: float = 1e-3,
                nested: bool = True, top_level: bool = True) -> Path:
    """A head whose top-1 follows the target when (and only when) fed ``taps``; config ids ``ids`` verbatim."""
    import torch
    from safetensors.torch import load_file, save_file

    from vllm_eagle3.testing.tiny import build_eagle3_draft

    vocab, hidden = run.embed_weight.shape
    build_eagle3_draft(folder, target, aux_ids=ids, draft_vocab_size=vocab, nested_ids=nested,
                       top_level_ids=top_level)
    x = torch.cat([run.taps[k, :-1] for k in taps], -1).double()  # [T-1, n*H]: what vLLM feeds at prefill
    x = x / x.norm(dim=-1, keepdim=True)
    y = torch.nn.functional.one_hot(run.greedy[1:], vocab).double()  # [T-1, V]: the target's next greedy token
    w = torch.linalg.solve(x.T @ x + ridge * torch.eye(x.shape[1], dtype=x.dtype), x.T @ y)  # [n*H, V]
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    weights = load_file(str(folder / "model.safetensors"))
    weights["fc.weight"] = (u[:, :hidden] * s[:hidden].sqrt()).T.float().contiguous()  # [H, n*H]
    weights["lm_head.weight"] = (vh[:hidden].T * s[:hidden].sqrt()).float().contiguous()  # [V, H]
    weights["midlayer.self_attn.o_proj.weight"].zero_()  # the head reads only fc(taps): no token, no attention
    weights["midlayer.mlp.down_proj.weight"].zero_()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def diagnose(target, draft):
    from vllm_eagle3.tools import doctor

    return doctor.diagnose(target, draft, text=TEXT, max_tokens=MAX_TOKENS, progress=False)


def test_doctor_finds_specforge_wiring_and_flags_vllm_reading(tmp_path, target, target_run):
    """Planted taps 1/2/5 written as SpecForge ids [0, 1, 4]: read as vLLM ids they would be taps [embed, 1, 4]."""
    draft = plant_draft(tmp_path / "d", target, target_run, (1, 2, 5), [0, 1, 4])
    dx = diagnose(target, draft)
    assert dx.best.candidate.taps == (1, 2, 5), [(s.candidate.label, s.accuracy) for s in dx.scores[:5]]
    assert dx.confident and "trained on taps [1, 2, 5]" in dx.verdict
    assert dx.best.accuracy > 0.5 > dx.scores[1].accuracy
    assert "WRONG  vLLM 0.32 V2 runner (top-level list) captures [embed, 1, 4]" in dx.verdict
    assert "ok     SGLang < 0.5.14 + embed patch (nested list) captures [1, 2, 5]" in dx.verdict
    lines = "\n".join(dx.config_lines)
    assert '"eagle_aux_hidden_state_layer_ids": [1, 2, 5]' in lines and "SpecForge: [0, 1, 4]" in lines


def test_doctor_finds_embedding_wiring_the_incident_shape(tmp_path, target, target_run):
    """The incident on 8 layers: trained on [embed, 2, 4], config says SGLang-legacy [1, 3, 5] (= taps 2/4/6)."""
    draft = plant_draft(tmp_path / "d", target, target_run, (0, 2, 4), [1, 3, 5], top_level=False)
    dx = diagnose(target, draft)
    assert dx.best.candidate.taps == (0, 2, 4), [(s.candidate.label, s.accuracy) for s in dx.scores[:5]]
    assert dx.confident
    assert "WRONG  SGLang < 0.5.14 + embed patch (nested list) captures [2, 4, 6]" in dx.verdict
    lines = "\n".join(dx.config_lines)
    assert '"eagle_aux_hidden_state_layer_ids": [0, 2, 4]' in lines  # vLLM / speculators
    assert '"eagle_aux_hidden_state_layer_ids": [-1, 1, 3]' in lines  # SGLang legacy with the embed patch
    assert "SpecForge: not expressible" in lines


def test_doctor_keeps_a_non_ascending_order(tmp_path, target, target_run):
    """A head trained on cat([tap 5, tap 1, tap 2]): the order matters to fc, and engines that sort get it wrong."""
    draft = plant_draft(tmp_path / "d", target, target_run, (5, 1, 2), [5, 1, 2])
    dx = diagnose(target, draft)
    assert dx.best.candidate.taps == (5, 1, 2)
    assert dx.score_of((1, 2, 5)).accuracy < dx.best.accuracy - 0.2
    assert any("only the vllm-eagle3 capture spec keeps this order" in l for l in dx.config_lines)
    assert "WRONG  vLLM 0.32 V2 runner (top-level list) captures [5, 1, 2]" in dx.verdict
    assert "the right taps in the wrong order" in dx.verdict


def test_doctor_untrained_draft_is_inconclusive(tmp_path, target, target_run):
    """A random head agrees with nothing: the doctor must say so instead of naming a wiring (exit status 3)."""
    from vllm_eagle3.tools import doctor
    from vllm_eagle3.testing.tiny import build_eagle3_draft

    draft = build_eagle3_draft(tmp_path / "d", target, aux_ids=[2, 4, 5])
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert doctor.main(["--target", str(target), "--draft", str(draft), "--text", str(text), "--max-tokens",
                        str(MAX_TOKENS), "--no-progress", "--json", str(tmp_path / "out.json")]) == 3
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["confident"] is False and "inconclusive" in result["verdict"]


@pytest.mark.parametrize("breakage, message", [
    ("no-draft", r"draft .* does not exist"),
    ("not-json", r"draft config .* is not valid JSON"),
    ("wrong-fan-in", r"not a multiple of the target hidden size"),
    ("no-fc", r"has no fc.weight"),
    ("short-text", r"only \d+ tokens of text"),
    ("missing-weights", r"lacks weights"),
])
def test_doctor_hostile_input(tmp_path, target, breakage, message, capsys):
    """Broken drafts and too little text: exit 1 with one error line, no traceback."""
    import re

    from safetensors.torch import load_file, save_file

    from vllm_eagle3.tools import doctor
    from vllm_eagle3.testing.tiny import build_eagle3_draft

    draft = build_eagle3_draft(tmp_path / "d", target, aux_ids=[1, 2, 5])
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    weights = tmp_path / "d" / "model.safetensors"
    if breakage == "no-draft":
        draft = tmp_path / "nowhere"
    elif breakage == "not-json":
        (draft / "config.json").write_text("{")
    elif breakage in ("wrong-fan-in", "no-fc", "missing-weights"):
        w = load_file(str(weights))
        if breakage == "wrong-fan-in":
            w["fc.weight"] = w["fc.weight"][:, :-5].contiguous()
        elif breakage == "no-fc":
            del w["fc.weight"]
        else:
            del w["midlayer.self_attn.q_proj.weight"]
        save_file(w, str(weights))
    elif breakage == "short-text":
        text.write_text("x = 1\n")
    rc = doctor.main(["--target", str(target), "--draft", str(draft), "--text", str(text), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and re.search(message, err), err
    assert "Traceback" not in err


MINI_TARGET = REPO / "models" / "kimi-k25-mini"
MINI_DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"


@pytest.mark.skipif(not (MINI_TARGET / "config.json").exists() or not (MINI_DRAFT / "config.json").exists(),
                    reason="the shipped miniature (models/kimi-k25-mini, models/kimi-k25-mini-eagle3) is not built")
def test_doctor_on_the_miniature_with_the_incident_config(tmp_path):
    """Acceptance check of the issue: the miniature's head with the incident's config ([2, 30, 58] in eagle_config,
    SGLang-legacy), through the real command line on 2 cores: names [embed, 3, 31], flags taps 3/31/59, < 2 min."""
    draft = tmp_path / "draft"
    shutil.copytree(MINI_DRAFT, draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True}
    (draft / "config.json").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "vllm_eagle3.tools.cli", "doctor", "--target", str(MINI_TARGET),
                           "--draft", str(draft), "--json", str(tmp_path / "dx.json")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    elapsed = time.perf_counter() - t0
    # Exit 0 = the best wiring is separable from the runner-up. On the shipped miniature the +-1 neighbour
    # [embed, 2, 30] scores close to [embed, 3, 31] (measured 0.546 vs 0.585 at 384 tokens: adjacent layers carry
    # similar states), so the doctor may answer 3 (best not separable from its neighbour) - but it must still rank
    # [embed, 3, 31] first and flag the incident's reading as WRONG.
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    result = json.loads((tmp_path / "dx.json").read_text())
    assert result["best"]["taps"] == [0, 3, 31], proc.stdout
    assert ("trained on taps [embed, 3, 31]" in proc.stdout) or \
        (proc.returncode == 3 and "inconclusive: best [embed, 3, 31]" in proc.stdout), proc.stdout
    assert "WRONG  SGLang < 0.5.14 + embed patch (nested list) captures [3, 31, 59]" in proc.stdout
    assert "scoring wirings" in proc.stderr  # the progress bar
    assert elapsed < 120, f"doctor took {elapsed:.0f} s on the miniature"
