"""Shared fixtures: tiny checkpoints (built once per session) and a real vLLM engine with its log captured.

Engines are expensive on the 2-core CI box (~30-90 s each even with ``enforce_eager``): test modules
start each engine once in a module-scoped fixture, one engine at a time, and close it before the next.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

# Every vLLM process inherits these (the engine core and workers are spawned from the test process).
for _k, _v in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # LLM.apply_model ships test-support functions (vllm_eagle3.testing.taps) to the worker and tensors back.
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}.items():
    os.environ.setdefault(_k, _v)

def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (the 10-minute soak) run only when selected: ``pytest -m slow``."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


TAP_LAYERS = 32  # >= 32 so taps 3 and 31 of the shipped head exist


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def dsv3_dir(tiny_root) -> Path:
    """A random 32-layer DeepSeek-V3 (MLA + MoE), float32."""
    from vllm_eagle3.testing.tiny import build_deepseek_v3

    return build_deepseek_v3(tiny_root / "dsv3", num_layers=TAP_LAYERS)


@pytest.fixture(scope="session")
def kimi_dir(tiny_root) -> Path:
    """A random Kimi K2.5 (32-layer DeepSeek-V3 text model + 1-layer vision tower), float32."""
    from vllm_eagle3.testing.tiny import build_kimi_k25

    return build_kimi_k25(tiny_root / "kimi", num_layers=TAP_LAYERS)


@pytest.fixture(scope="session")
def make_draft(tiny_root):
    """``make_draft(target_dir, ids)`` -> a Llama-style EAGLE-3 draft folder whose config carries ``ids``."""
    from vllm_eagle3.testing.tiny import build_eagle3_draft

    def make(target: Path, ids: list[int], **kw: Any) -> Path:
        name = f"draft_{Path(target).name}_{'_'.join(str(i) for i in ids)}"
        folder = tiny_root / name
        if not (folder / "config.json").exists():
            build_eagle3_draft(folder, target, ids, **kw)
        return folder

    return make


@pytest.fixture
def target(tmp_path):
    """A 61-layer Kimi K2.5 target folder holding only config.json (hidden 128, vocab 4096): enough for the static
    checks, which read configs and safetensors headers only."""
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"num_hidden_layers": 61, "hidden_size": 128, "vocab_size": 4096}}))
    return d


@pytest.fixture(scope="module")
def incident_files(tmp_path_factory) -> dict[str, Path]:
    """The shipped head's weights (and eval.json) with the incident's config: ids [2, 30, 58] read sglang-legacy =
    taps 3, 31, 59, no record of the trained taps, and a spec saying so: the incident's wiring, served."""
    from vllm_eagle3.tools.convert import rewired_copy

    repo = Path(__file__).resolve().parents[1]
    root = tmp_path_factory.mktemp("incident")
    # The incident's config carried no trainer record of the taps (the shipped head's `vllm_eagle3.taps`, which the
    # static check compares with the spec): rewired_copy drops it, so only served acceptance can tell.
    draft = rewired_copy(repo / "models" / "kimi-k25-mini-eagle3", root / "kimi-k25-mini-eagle3-incident", [2, 30, 58])
    spec = root / "incident_spec.yaml"
    spec.write_text("description: the incident's wiring (SGLang's default capture, no embedding)\n"
                    "taps: [3, 31, 59]\nnum_layers: 61\ndraft_ids_convention: sglang-legacy\n")
    return {"draft": draft, "spec": spec}


# A head fed what it was trained on vs one that accepts ~nothing (wrong taps, a broken verify): the benchmark measured
# acceptance length 1.02 for the incident wiring; the retrained shipped head's served walk is 2.37 at k=3 on the card's
# prompts (MODEL_CARD.md), lower on short requests that end mid-draft. 1.5 separates the two with room on both sides.
ACCEPTED_FLOOR = 1.5


def _speculation_accepted(metrics: dict) -> float:
    """Drafts were proposed and the head was accepted (acceptance length > :data:`ACCEPTED_FLOOR`); returns it."""
    drafts = metrics.get("vllm:spec_decode_num_drafts", 0)
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens", 0)
    length = 1 + accepted / max(1, drafts)
    print(f"drafts {drafts}, accepted tokens {accepted}, acceptance length {length:.3f}")
    assert drafts > 0 and length > ACCEPTED_FLOOR, (
        f"acceptance length {length:.3f} over {drafts} drafts <= {ACCEPTED_FLOOR}: the head is not being accepted "
        f"(wrong taps or a broken verify); metrics {metrics}")
    return length


@pytest.fixture
def assert_speculation_accepted():
    """``assert_speculation_accepted(metrics)``: the check above, for tests that read vLLM's spec-decode counters."""
    return _speculation_accepted
