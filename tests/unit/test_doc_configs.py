"""Every ``configs/...`` file the docs and the README name is shipped, and the GPU serve config carries the same
capture spec as the capture-spec file.

Guards issue 46 item 5: docs/DEPLOYMENT.md told operators to run ``vllm serve --config kimi_k25_tp8.yaml``, a file
the repository did not have. Reads files only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_eagle3.resolve import read_spec_mapping, spec_file_from_mapping
from vllm_eagle3.tools.serve.args import additional_config

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
NAMED = re.compile(r"(?<![\w/.-])configs/[\w./-]*[\w]")


def named_configs() -> dict[str, list[str]]:
    """``configs/...`` path -> the ``page:line`` places that name it."""
    out: dict[str, list[str]] = {}
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for path in NAMED.findall(line):
                out.setdefault(path, []).append(f"{page.relative_to(REPO)}:{n}")
    return out


def test_every_config_the_docs_name_is_shipped():
    named = named_configs()
    assert "configs/kimi_k25_tp8.yaml" in named and "configs/serve_kimi_k25_mini.yaml" in named
    missing = {p: at for p, at in named.items() if not (REPO / p).exists()}
    assert not missing, f"named in the docs but not in the repository: {missing}"


def test_tp8_serve_config_carries_the_shipped_capture_spec():
    """configs/kimi_k25_tp8.yaml's ``additional-config`` holds the spec of configs/kimi_k25_eagle3.yaml."""
    mine = additional_config(["--config", str(REPO / "configs" / "kimi_k25_tp8.yaml")])["vllm_eagle3"]["capture_spec"]
    shipped = read_spec_mapping(REPO / "configs" / "kimi_k25_eagle3.yaml")
    a, b = spec_file_from_mapping(mine, "tp8"), spec_file_from_mapping(shipped, "shipped")
    assert (a.spec.taps, a.num_layers, a.draft_ids_convention) == (b.spec.taps, b.num_layers, b.draft_ids_convention)
