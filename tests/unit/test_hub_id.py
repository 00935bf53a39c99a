"""The online wiring check served with hub ids (``--model moonshotai/Kimi-K2.5``, as docs/DEPLOYMENT.md writes it).

Guards issue 46 item 2: the check's scorer read the target's embedding from ``Path(model)``, so a hub id ended in
``KeyError: no embed_tokens weight in moonshotai/Kimi-K2.5`` and "could not start". Now a hub id is found where vLLM
downloaded it, the Hugging Face cache (``vllm_eagle3.model_files``, as vLLM's ``try_get_local_file`` does offline);
not there, the check is ``off`` with one line naming the fix and the engine serves on. No network: the cache is a
folder laid out as the hub lays it out (``models--org--name/refs/main``, ``snapshots/<commit>/``), its files linked to
the bundled miniature.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_eagle3.model_files import (
    FIX,
    ModelFilesNotFound,
    looks_like_hub_id,
    model_folder,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3-mla"
TARGET_ID, DRAFT_ID = "moonshotai/Kimi-K2.5", "lightseekorg/kimi-k2.5-eagle3-mla"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repos: dict[str, Path], ref: str = "main") -> Path:
    """A hub-layout cache under ``root``: each repo's files linked into ``snapshots/<COMMIT>``, ``refs/<ref>``."""
    for repo_id, src in repos.items():
        repo = root / ("models--" + repo_id.replace("/", "--"))
        snap = repo / "snapshots" / COMMIT
        snap.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / ref).write_text(COMMIT)
        for f in src.iterdir():
            (snap / f.name).symlink_to(f.resolve())
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The test's cache as huggingface_hub's default (what ``HF_HUB_CACHE`` sets when the process starts)."""
    from huggingface_hub import constants

    root = hub_cache(tmp_path / "hub", {TARGET_ID: TARGET, DRAFT_ID: DRAFT})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


def test_hub_id_resolves_to_the_cached_snapshot(cache):
    """A hub id is its cached snapshot folder (default revision main, or a commit); a folder is itself."""
    snap = cache / "models--moonshotai--Kimi-K2.5" / "snapshots" / COMMIT
    assert model_folder(TARGET_ID) == snap
    assert model_folder(TARGET_ID, revision=COMMIT) == snap
    assert model_folder(str(TARGET)) == TARGET and model_folder(TARGET) == TARGET
    assert looks_like_hub_id(TARGET_ID) and not looks_like_hub_id("./models/x") and not looks_like_hub_id("/data/x")


def test_not_in_the_cache_names_the_cache_and_the_fix(cache, tmp_path):
    """A hub id absent from the cache (or another revision, or a cache elsewhere), a missing folder: one message that
    says what was looked for, where, and the fix; a FileNotFoundError, not a KeyError."""
    cases = [
        ({"model": "moonshotai/Kimi-K2-Instruct"}, str(cache)),
        ({"model": TARGET_ID, "revision": "v2"}, "(revision v2)"),
        ({"model": TARGET_ID, "cache_dir": tmp_path / "elsewhere"}, str(tmp_path / "elsewhere")),
        ({"model": str(tmp_path / "no" / "such" / "folder")}, "is not a folder"),
    ]
    for kw, where in cases:
        with pytest.raises(ModelFilesNotFound) as info:
            model_folder(what="target", **kw)
        msg = str(info.value)
        assert isinstance(info.value, FileNotFoundError) and where in msg and msg.endswith(FIX), msg
        assert "\n" not in msg


def test_scorer_loads_hub_ids_from_the_cache(cache):
    """The scorer built from hub ids (as vLLM's config names them) holds the same head and target embedding as the
    one built from the bundled folders."""
    import torch

    from vllm_eagle3.online.scorer import Scorer

    cands = [(0, 3, 31), (3, 31, 59)]
    by_id, by_folder = Scorer(DRAFT_ID, TARGET_ID, cands), Scorer(DRAFT, TARGET, cands)
    a, b = by_id.head.state_dict(), by_folder.head.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert by_id.head.embed_tokens.weight.abs().sum() > 0


def test_hf_hub_cache_variable_is_honoured(tmp_path):
    """In a fresh process whose ``HF_HUB_CACHE`` points at the cache (as vLLM's would), the target's embedding loads
    by hub id; with ``HF_HOME`` pointing elsewhere the same id says where it looked and the fix."""
    root = hub_cache(tmp_path / "hub", {TARGET_ID: TARGET})
    code = (
        "from vllm_eagle3.model_files import model_folder, ModelFilesNotFound\n"
        "from vllm_eagle3.reference import load_target_embedding\n"
        "try:\n"
        f"    print(tuple(load_target_embedding(model_folder({TARGET_ID!r}, what='target')).shape))\n"
        "except ModelFilesNotFound as exc:\n"
        "    print('off:', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}

    def run(**e):
        return subprocess.run(
            [sys.executable, "-c", code],
            env={**env, **e, "HF_HUB_OFFLINE": "1"},
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            check=False,
        )

    found = run(HF_HUB_CACHE=str(root))
    assert found.returncode == 0 and found.stdout.startswith("("), found.stderr[-2000:]
    missing = run(HF_HOME=str(tmp_path / "home"))
    assert missing.returncode == 0, missing.stderr[-2000:]
    assert (
        missing.stdout.startswith("off: target moonshotai/Kimi-K2.5 is not a local folder")
        and str(tmp_path / "home" / "hub") in missing.stdout
        and FIX in missing.stdout
    ), missing.stdout


def test_engine_check_is_off_in_one_line_when_the_hub_id_is_not_cached(cache, caplog):
    """Inside the engine, a hub id that is not in the cache: the check starts as None with one WARNING, "off, it could
    not start", naming the cache and the fix; no KeyError, nothing raised into the engine."""
    from vllm_eagle3.online.plan import CheckPlan
    from vllm_eagle3.online import engine_hook
    from vllm_eagle3.spec import EMBED
    from vllm_eagle3.wiring_check import CheckConfig

    plan = CheckPlan(CheckConfig(), (SimpleNamespace(taps=(EMBED, 3, 31), why="configured", label="[embed, 3, 31]"),))
    lm = SimpleNamespace(check_plan=plan, capture_resolution=SimpleNamespace(target=SimpleNamespace(num_layers=61)))
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(model=DRAFT_ID, num_speculative_tokens=3),
        model_config=SimpleNamespace(model="moonshotai/Kimi-K2-Thinking"),
        parallel_config=SimpleNamespace(data_parallel_rank=0),
    )
    runner = SimpleNamespace(get_model=lambda: lm, vllm_config=cfg)
    with caplog.at_level(logging.WARNING):
        assert engine_hook._checker_for(runner) is None
    lines = [r.getMessage() for r in caplog.records if "wiring check" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0] == (
        f"vllm-eagle3 wiring check: off, it could not start: ModelFilesNotFound: target "
        f"moonshotai/Kimi-K2-Thinking is not a local folder and its config.json is not in the Hugging "
        f"Face cache {cache}; {FIX}"
    ), lines[0]
