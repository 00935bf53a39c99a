"""The model card's measured numbers come from the files its runs wrote, not from memory.

Guards issue 11 (numbers copied by hand into the card): every number with three decimals in
models/kimi-k25-mini/MODEL_CARD.md must be, rounded, a value of the shipped heads' eval.json or of the training
logs. The few that no shipped file holds are listed here with where they come from; a new hand-typed number fails.
"""

import json
import re

import pytest

from vllm_eagle3.tools import REPO

pytestmark = pytest.mark.unit

CARD = REPO / "models" / "kimi-k25-mini" / "MODEL_CARD.md"
SOURCES = (
    "models/kimi-k25-mini-eagle3/eval.json",
    "models/kimi-k25-mini-eagle3/eval_replaced_head.json",
    "models/kimi-k25-mini-eagle3/candidates.json",
    "models/kimi-k25-mini/train_log.json",
    "models/kimi-k25-mini-eagle3/train_log.json",
    "models/kimi-k25-mini-eagle3-taps-3-31-59/eval.json",
    "models/kimi-k25-mini-eagle3-taps-3-31-59/train_log.json",
    "models/kimi-k25-mini-eagle3-mla/eval.json",
    "models/kimi-k25-mini-eagle3-mla/train_log.json",
    "models/kimi-k25-mini-eagle3-4tap/eval.json",
    "models/kimi-k25-mini-eagle3-4tap/train_log.json",
)
NOT_IN_A_SHIPPED_FILE = {
    "3.317": "the first target's head (k=3 acceptance length), replaced with the target; "
    "eval.json in git history (9e974a8)",
    "5.144": "the first target run's final held-out loss; models/kimi-k25-mini/train_log.json in git history (13edffe)",
}


def _values(x, out):
    if isinstance(x, dict):
        for v in x.values():
            _values(v, out)
    elif isinstance(x, list):
        for v in x:
            _values(v, out)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        out.append(float(x))
    return out


@pytest.mark.skipif(not CARD.exists(), reason="no model card")
def test_every_three_decimal_number_of_the_card_is_in_its_files():
    values = []
    for f in SOURCES:
        _values(json.loads((REPO / f).read_text()), values)
    typed = []
    for n in re.findall(r"(?<![\w.])(\d+\.\d{3})(?!\d)", CARD.read_text()):
        x = float(n)
        if n not in NOT_IN_A_SHIPPED_FILE and not any(abs(round(v, 3) - x) < 1e-9 for v in values):
            typed.append(n)
    assert not typed, (
        f"MODEL_CARD.md quotes {sorted(set(typed))}, found in none of {SOURCES}: copy numbers from "
        "the run's files (or name the source in NOT_IN_A_SHIPPED_FILE)"
    )


# Issue 15's heads: each acceptance row of the card must be THAT head's eval.json (the test above only checks that a
# number exists in some file, so a row copied from the other head would pass it).
HEAD_ROWS = {
    "default `[embed, 3, 31]`": "models/kimi-k25-mini-eagle3/eval.json",
    "first default head `[embed, 3, 31]` (replaced)": "models/kimi-k25-mini-eagle3/eval_replaced_head.json",
    "MLA `[embed, 3, 31]`": "models/kimi-k25-mini-eagle3-mla/eval.json",
    "4-tap `[embed, 3, 31, 59]`": "models/kimi-k25-mini-eagle3-4tap/eval.json",
}


def _row(label: str, setting: str) -> list[float]:
    prefix = f"| {label}, {setting}"
    rows = [ln for ln in CARD.read_text().splitlines() if ln.startswith(prefix)]
    assert len(rows) == 1, f"MODEL_CARD.md: expected one row starting {prefix!r}, found {len(rows)}"
    return [float(x) for x in re.findall(r"(?<![\w.])(\d+\.\d{3})(?!\d)", rows[0])]


@pytest.mark.skipif(not CARD.exists(), reason="no model card")
@pytest.mark.parametrize("label", sorted(HEAD_ROWS))
def test_new_heads_rows_are_their_own_eval_json(label):
    sim = json.loads((REPO / HEAD_ROWS[label]).read_text())["simulated_acceptance"]
    for setting, key in (("**greedy**", "greedy"), ("text", "text")):
        want = [round(x, 3) for x in sim[key]["per_position_acceptance"]]
        want += [round(sim[key]["acceptance_length"][str(k)], 3) for k in range(1, 6)]
        assert _row(label, setting) == want, f"{label} {setting} row is not {HEAD_ROWS[label]}'s {key} numbers"
    walk = [round(sim["served_walk"][str(k)]["acceptance_length"], 3) for k in range(1, 6)]
    assert _row(label, "64 prompts") == walk, f"{label} served-walk row is not {HEAD_ROWS[label]}'s served_walk"
