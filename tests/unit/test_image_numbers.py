"""The image-prompt numbers the model card quotes are bench/images.json's (written by ``python -m
vllm_eagle3.tools.images``), not typed by hand: every cell of the card's image table must be the results file's value
rounded as printed. Reads files only; no engine."""

from __future__ import annotations

import json
import re

import pytest

from vllm_eagle3.tools import REPO

pytestmark = pytest.mark.unit

CARD = REPO / "models" / "kimi-k25-mini" / "MODEL_CARD.md"
RESULTS = REPO / "bench" / "images.json"
ROW = re.compile(r"^\| (image|text) prompts[^|]*\|(.*)\|\s*$")


def test_model_card_image_table_is_the_results_file():
    summary = json.loads(RESULTS.read_text())["summary"]
    rows = {
        m.group(1): [c.strip() for c in m.group(2).split("|")]
        for m in map(ROW.match, CARD.read_text().splitlines())
        if m
    }
    assert set(rows) == {"image", "text"}, (
        f"{CARD}: the image table (rows 'image prompts ...' and 'text prompts ...') is missing"
    )
    for group, cells in rows.items():
        s = summary[group]
        want = [
            f"{s['acceptance_length']:.2f}",
            f"{s['per_position'][0]:.2f}",
            f"{s['tokens_per_s_eagle3']:.2f}",
            f"{s['tokens_per_s_none']:.2f}",
            f"{s['speedup']:.2f}x",
            f"{s['greedy_identical']}/{s['requests']}",
        ]
        assert cells == want, (
            f"{CARD}, row {group!r}: {cells} but {RESULTS} says {want}: re-run "
            "`python -m vllm_eagle3.tools.images` and copy its numbers"
        )
