"""The online wiring check's parts without an engine: its settings, its candidates, its statistics (false alarms
bounded, the incident decided at the first look, a 10 % loss found), the bookkeeping of a request's rows across
prefill, verify and preemption, and the shortened first draft step it scores with.

The served check (a real `vllm-eagle3 serve` with the MLA fc_norm head on the incident's taps) is
tests/e2e/test_online_check.py.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from vllm_eagle3.checkpoint import DraftInfo
from vllm_eagle3.online.traces import RowSpan, Tracker
from vllm_eagle3.resolve import load_spec_file
from vllm_eagle3.spec import EMBED, CaptureSpecError
from vllm_eagle3.verdicts import COSTS, OK, PENDING, WRONG
from vllm_eagle3.wiring_check import CheckConfig, Judge, t_quantile
from vllm_eagle3.wirings import online_candidates

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
MLA = REPO / "models" / "kimi-k25-mini-eagle3-mla"
TARGET = REPO / "models" / "kimi-k25-mini"


# ----------------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"sample_evry": 2}, "unknown key(s) ['sample_evry']"),
        ({"budget": 0}, "check.budget = 0 is invalid"),
        ({"false_alarm": 0.5}, "check.false_alarm = 0.5 is invalid"),
        ({"min_requests": 2}, "check.min_requests = 2 is invalid"),
        ({"enabled": "yes"}, "check.enabled = 'yes' is invalid"),
    ],
)
def test_bad_settings_are_refused_with_the_key_and_the_rule(tmp_path, bad, words):
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"taps": ["embed", 3, 31], "check": bad}))
    with pytest.raises(CaptureSpecError) as exc:
        load_spec_file(spec)
    assert words in str(exc.value) and str(spec) in str(exc.value)


def test_settings_are_read_from_the_spec(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("taps: [embed, 3, 31]\ncheck: {enabled: false, sample_every: 2}\n")
    cfg = load_spec_file(spec).check
    assert cfg == CheckConfig(enabled=False, sample_every=2)


# ----------------------------------------------------------------------------------------------- candidates


def test_candidates_of_the_incident_include_the_trained_wiring():
    draft = DraftInfo.from_config({"eagle_aux_hidden_state_layer_ids": [2, 30, 58]})
    cands = online_candidates((3, 31, 59), draft, 61)
    assert cands[0].taps == (3, 31, 59) and cands[0].why == "configured"
    taps = [c.taps for c in cands]
    assert (EMBED, 3, 31) in taps  # the head's real wiring: the embedding swapped in
    assert (2, 30, 58) in taps  # the config ids read as vLLM reads them
    assert {(4, 31, 59), (3, 30, 59), (3, 31, 60)} <= set(taps)  # neighbours
    assert len(set(taps)) == len(taps) and len(taps) <= 16


def test_candidates_of_the_right_wiring_include_the_incident():
    cands = online_candidates((EMBED, 3, 31), DraftInfo.load(MLA, weights=False), 61)
    assert cands[0].taps == (EMBED, 3, 31)
    assert (3, 31, 59) in [c.taps for c in cands]


# ----------------------------------------------------------------------------------------------- statistics


def test_t_quantile_matches_tabulated_values():
    for p, df, want in ((0.001, 15, 3.733), (0.001, 30, 3.385), (1e-4, 20, 4.515), (0.05, 10, 1.812)):
        assert t_quantile(p, df) == pytest.approx(want, rel=0.01), (p, df)


def simulate(judge: Judge, p0s: list[float], requests: int, rng: random.Random) -> list[str]:
    """Requests of 20-120 anchors with a per-request difficulty shared by all wirings (paired, clustered data)."""
    kinds = []
    for _ in range(requests):
        n = rng.randint(20, 120)
        ease = rng.uniform(0.6, 1.25)
        shared = [rng.random() for _ in range(n)]
        matches = []
        for p in p0s:
            q = min(1.0, p * ease)
            # mostly the same anchors match for every wiring (the text's easy spots), plus noise of its own
            matches.append(sum(1 for u in shared if (u < q if rng.random() < 0.8 else rng.random() < q)))
        kinds.append(judge.add(n, matches).kind)
    return kinds


def test_false_alarms_stay_under_the_bound():
    """120 servers whose 8 wirings are truly equal, or one within the 2 % tolerance, judged after every one of 300
    requests at a lenient false_alarm of 0.05: at most ~6 may ever say costs/wrong (0 observed is typical)."""
    rng = random.Random(0)
    alarms = 0
    for server in range(120):
        p = [0.6] * 8 if server % 2 else [0.6] + [0.6 * 1.015] + [0.6] * 6
        kinds = simulate(Judge([(i,) for i in range(8)], CheckConfig(false_alarm=0.05)), p, 300, rng)
        alarms += any(k in (COSTS, WRONG) for k in kinds)
    assert alarms <= 0.05 * 120 + 3


def test_the_incident_is_flagged_at_the_first_look():
    """The served MLA fc_norm head's numbers (first-draft acceptance 0.13 with [3, 31, 59], 0.67 with [embed, 3,
    31]): flagged at the first look (12 requests), the better wiring named; wrong (< a quarter) once the interval
    is narrow enough to put 0.13 / 0.67 = 0.19 below 0.25."""
    judge = Judge([(3, 31, 59), (EMBED, 3, 31), (2, 30, 58)], CheckConfig())
    rng = random.Random(1)
    kinds = simulate(judge, [0.13, 0.67, 0.05], 12, rng)
    assert kinds[:11] == [PENDING] * 11 and kinds[11] in (COSTS, WRONG)
    v = judge.verdict
    assert v.flagged == 1 and v.best == 1 and v.loss > 0.7
    assert simulate(judge, [0.13, 0.67, 0.05], 200, rng)[-1] == WRONG


def test_a_ten_percent_loss_is_found_and_a_right_wiring_is_ok():
    rng = random.Random(2)
    costs = Judge([(0,), (1,), (2,)], CheckConfig())
    kinds = simulate(costs, [0.6, 0.667, 0.5], 1000, rng)
    assert COSTS in kinds, costs.verdict
    assert costs.verdict.flagged == 1 and 0.05 < costs.verdict.loss < 0.15
    right = Judge([(0,), (1,), (2,)], CheckConfig())
    kinds = simulate(right, [0.667, 0.6, 0.5], 400, rng)
    assert kinds[-1] == OK and not {COSTS, WRONG} & set(kinds)


# ----------------------------------------------------------------------------------------------- bookkeeping


def span(rid, first_row, valid, position, done=False, temperature=0.0, prompt_len=6):
    return RowSpan(rid, first_row, valid, position, prompt_len, temperature, done)


def rows(values: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    t = torch.tensor(values)
    return t, {3: t[:, None].float().expand(-1, 4).clone()}


def test_a_trace_keeps_exactly_the_confirmed_positions():
    """Prefill in two chunks, then verify steps accepting 2 of 3 and 0 of 3 drafts: the trace is the sequence."""
    tr = Tracker(sample_every=1, max_temperature=0.3, max_positions=64)
    assert tr.wants(span("a", 0, 4, 0), allow_new=True)
    assert tr.record(span("a", 0, 4, 0), *rows([10, 11, 12, 13])) is None
    assert tr.record(span("a", 0, 2, 4), *rows([14, 15])) is None  # prompt done: 6 tokens
    assert tr.record(span("a", 0, 3, 6), *rows([20, 21, 22])) is None  # last token + 2 accepted drafts
    assert tr.record(span("a", 0, 1, 9), *rows([23])) is None  # no draft accepted: the last token only
    (trace,) = tr.finish(["a"])
    tokens, taps = trace.materialize()
    assert tokens.tolist() == [10, 11, 12, 13, 14, 15, 20, 21, 22, 23]
    assert taps[3][:, 0].tolist() == tokens.float().tolist()
    assert trace.num_anchors() == 4  # anchors 4..7: their labels, positions 6..9, are the generated tokens


def test_preemption_cuts_back_and_a_gap_drops_the_trace():
    tr = Tracker(sample_every=1, max_temperature=0.3, max_positions=64)
    tr.wants(span("a", 0, 6, 0), True)
    tr.record(span("a", 0, 6, 0), *rows([1, 2, 3, 4, 5, 6]))
    tr.record(span("a", 0, 4, 2), *rows([3, 4, 5, 6]))  # recomputed from position 2 after preemption
    assert tr.traces["a"].length == 6
    tr.record(span("a", 0, 2, 9), *rows([7, 8]))  # positions 6..8 never seen
    assert "a" not in tr.traces and tr.dropped == 1


def test_sampling_follows_one_in_n_cool_requests_and_ends_at_the_limit():
    tr = Tracker(sample_every=2, max_temperature=0.3, max_positions=64, max_followed=8)
    followed = [tr.wants(span(f"r{i}", 0, 4, 0, temperature=0.7 if i % 3 == 0 else 0.0), True) for i in range(9)]
    assert tr.too_hot == 3 and followed == [False, True, False, False, True, False, False, True, False]
    assert not tr.wants(span("x", 0, 4, 0), allow_new=False)  # over budget: not followed, decided for good
    assert not tr.wants(span("x", 0, 4, 0), allow_new=True)
    assert tr.over_budget == 1 and tr.at_max_followed == 0
    done = tr.record(span("r1", 0, 4, 0, done=True), *rows([1, 2, 3, 4]))
    assert done is not None and "r1" not in tr.traces


def test_no_more_than_max_followed_at_once():
    tr = Tracker(sample_every=1, max_temperature=0.3, max_positions=64, max_followed=2)
    assert [tr.wants(span(r, 0, 4, 0), True) for r in "abc"] == [True, True, False]
    assert tr.at_max_followed == 1 and tr.over_budget == 0
    tr.finish(["a"])
    assert tr.wants(span("d", 0, 4, 0), True)


def test_the_budget_counts_the_requests_followed_now():
    """A new request is followed only if what was spent plus the mean cost of a scored request, for each request
    followed now and the new one, fits the budget: four requests started together cannot overshoot it fourfold."""
    from types import SimpleNamespace

    from vllm_eagle3.online import engine_hook

    cands = [SimpleNamespace(taps=(3, 31, 59), why="configured"), SimpleNamespace(taps=(EMBED, 3, 31), why="x")]
    plan = SimpleNamespace(config=CheckConfig(), candidates=cands, extra_taps=())
    checker = engine_hook.Checker(plan, None, 0, 3, 61, None)
    checker.engine_time = 100.0 - engine_hook.CREDIT_S  # budget 0.02: 2 s of check time in 100 s with the credit
    assert checker.within_budget()  # nothing scored yet: no estimate
    checker.spent, checker.scored = 1.0, 2  # 0.5 s a request
    checker.tracker.traces = {"a": None}
    assert checker.within_budget()  # 1 + 0.5 * 2 <= 2
    checker.tracker.traces = {"a": None, "b": None}
    assert not checker.within_budget()  # 1 + 0.5 * 3 > 2
    assert checker.status()["over_budget"] == 0
    assert checker.status()["cost"]["fraction_of_engine_time"] == round(1 / 70, 5)


def test_idle_time_does_not_earn_check_time(monkeypatch):
    """The engine's time is the time between steps, each gap counted up to IDLE_GAP_S: an hour without traffic adds
    IDLE_GAP_S, so a burst after it gets no more check time than a busy engine would. The checker reads a stand-in
    clock here, so the sums are exact whatever else the machine is doing."""
    from types import SimpleNamespace

    from vllm_eagle3.online import engine_hook

    now = [10_000.0]
    monkeypatch.setattr(engine_hook, "time", SimpleNamespace(monotonic=lambda: now[0], time=lambda: now[0]))
    cands = [SimpleNamespace(taps=(3, 31, 59), why="configured"), SimpleNamespace(taps=(EMBED, 3, 31), why="x")]
    checker = engine_hook.Checker(
        SimpleNamespace(config=CheckConfig(), candidates=cands, extra_taps=()), None, 0, 3, 61, None
    )
    checker.observe = lambda runner, args: None
    checker.last_step = now[0] - 3600.0
    checker.observe_safely(None, {})
    assert checker.engine_time == engine_hook.IDLE_GAP_S
    checker.last_step = now[0] - 0.25  # a busy engine's step
    checker.observe_safely(None, {})
    assert checker.engine_time == engine_hook.IDLE_GAP_S + 0.25


# ----------------------------------------------------------------------------------------------- scoring


def test_the_shortened_first_step_equals_the_full_one():
    """``query_from`` computes queries, MLP and logits from an anchor row on: the full step's numbers there, and its
    argmax (what the scorer uses) everywhere.

    Tolerance 1e-4 absolute on logits up to ~15: the same float32 products, but over 15 rows instead of 40, and
    oneDNN picks its GEMM blocking by the row count on CPUs with AMX tiles (bit-identical on AMD EPYC avx512; up to
    5.7e-6 apart on an AMX Xeon), which changes the order of the k-sums: a few ulps of a 14-magnitude sum
    of ~1000 products. A row offset or mask error moves logits by O(1)."""
    from vllm_eagle3.reference import Eagle3Draft

    head = Eagle3Draft.from_dir(MLA, TARGET)
    torch.manual_seed(0)
    aux = torch.randn(1, 40, 3 * head.config.target_hidden_size)
    nxt = torch.randint(0, head.config.vocab_size, (1, 40))
    full = head.unroll(aux, nxt, 1)[0][0]
    part = head.unroll(aux, nxt, 1, query_from=25)[0][0]
    torch.testing.assert_close(part, full[:, 25:], rtol=0, atol=1e-4)
    assert torch.equal(part.argmax(-1), full[:, 25:].argmax(-1))
    assert math.isfinite(float(part.sum()))


def test_candidates_scored_as_one_batch_match_one_at_a_time(monkeypatch):
    """The scorer batches candidates (groups bounded by GROUP_BYTES); one per group gives the same match counts, and a
    full-size head at 2048 positions is scored one candidate at a time."""
    from vllm_eagle3.online import scorer as scorer_mod
    from vllm_eagle3.online.traces import Trace
    from vllm_eagle3.reference.config import DraftConfig

    cands = [(0, 3, 31), (3, 31, 59), (2, 30, 58), (0, 31, 59), (4, 32, 60)]
    s = scorer_mod.Scorer(MLA, TARGET, cands)
    h = s.head.config.target_hidden_size
    torch.manual_seed(1)
    trace = Trace("r", prompt_len=14, start=0)
    trace.append(
        0,
        torch.randint(0, s.head.config.vocab_size, (50,)),
        {k: torch.randn(50, h, dtype=torch.bfloat16) for k in {k for c in cands for k in c}},
    )
    assert scorer_mod.group_size(s.head.config, 49, 37, len(cands)) == len(cands)
    batched = s.score(trace)
    monkeypatch.setattr(scorer_mod, "GROUP_BYTES", 1)
    assert batched == s.score(trace) and batched[0] == 36 and len(batched[1]) == len(cands)
    big = DraftConfig(
        vocab_size=163840,
        hidden_size=7168,
        target_hidden_size=7168,
        num_aux_hidden_states=3,
        draft_vocab_size=32000,
        num_attention_heads=64,
        num_key_value_heads=64,
        intermediate_size=18432,
    )
    monkeypatch.undo()
    assert scorer_mod.group_size(big, 2048, 2040, 11) == 1
