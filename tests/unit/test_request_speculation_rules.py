"""The rules of speculation per request (vllm_eagle3/request_speculation.py) and the pure parts of their vLLM
wiring; served: tests/e2e/test_request_speculation.py.

Guards issue 47 item 2: the client's switch reads exactly the values it documents and refuses the rest with the fix
(vLLM's ``vllm_xargs`` schema turns JSON true/false into 1/0, so 1/0 must mean on/off); the back-off pauses after
``misses`` failed verify steps, doubles each failed probe's pause up to ``max_pause``, resumes at the first accepted
draft; :func:`drafting_steps` is the bound the e2e test holds the engine to; a bad value is the 400 vLLM answers
(``VLLMValidationError``) through vLLM's own ``SamplingParams.verify``.
"""

from __future__ import annotations

import pytest

from vllm_eagle3.request_speculation import (
    KEY,
    Backoff,
    DraftGate,
    SpeculationRequestError,
    drafting_steps,
    speculation_of,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "extra, want",
    [
        (None, True),
        ({}, True),
        ({"other": 1}, True),
        ({KEY: True}, True),
        ({KEY: False}, False),
        ({KEY: 1}, True),
        ({KEY: 0}, False),
        ({KEY: "off"}, False),
        ({KEY: "ON"}, True),
        ({KEY: "false"}, False),
    ],
)
def test_switch_values(extra, want):
    assert speculation_of(extra) is want


@pytest.mark.parametrize("value", [2, -1, 0.0, 1.0, "no", "", None, [0], {"on": 1}])
def test_switch_refuses_other_values_with_the_fix(value):
    with pytest.raises(SpeculationRequestError, match=r"must be true or false.*vllm_xargs"):
        speculation_of({KEY: value})


def run(gate: DraftGate, accepted_at) -> list[bool]:
    """Steps 1..n: whether each verified drafts; ``accepted_at(step)`` is what a verify step accepts."""
    out = []
    for step in range(1, len(accepted_at) + 1):
        allowed = gate.allow()
        out.append(allowed)
        if allowed:
            gate.observe(3, accepted_at[step - 1])
    return out


def test_backoff_pauses_then_probes_with_doubling_pauses_up_to_the_cap():
    gate = DraftGate(Backoff(misses=2, pause=3, max_pause=8))
    drafted = [i + 1 for i, a in enumerate(run(gate, [0] * 40)) if a]
    # steps 1-2 fail, pause 3 (3-5), probe 6, pause 6 (7-12), probe 13, pause 8 (cap; 14-21), probe 22, pause 8 ...
    assert drafted == [1, 2, 6, 13, 22, 31, 40]
    assert gate.dropped == 40 - len(drafted)


def test_an_accepted_draft_resets_misses_and_the_pause():
    gate = DraftGate(Backoff(misses=3, pause=2, max_pause=16))
    accepted = [0, 0, 1, 0, 0, 0] + [0] * 4 + [2] + [0] * 3
    drafted = run(gate, accepted)
    # misses 2 then an acceptance: no pause; then 3 misses (4-6) -> pause 2 (7-8), probe 9 fails -> pause 4 (10-13)
    assert drafted == [True] * 6 + [False, False, True] + [False] * 4 + [True]
    gate = DraftGate(Backoff(misses=1, pause=2, max_pause=16))
    run(gate, [0, 0, 0, 0, 0, 0])  # pauses 2, 4
    assert gate.next_pause == 8
    gate.paused = 0
    gate.observe(3, 1)  # a probe accepts: back to the first pause
    assert gate.next_pause == 2 and gate.misses == 0 and not gate.probing


def test_a_good_head_never_pauses():
    gate = DraftGate(Backoff())
    assert all(run(gate, [1, 0, 0, 0, 2, 0, 0, 0, 3] * 20)) and gate.dropped == 0


def test_switch_off_never_drafts_and_no_backoff_always_drafts():
    assert not any(run(DraftGate(Backoff(), enabled=False), [3] * 10))
    assert all(run(DraftGate(None), [0] * 300))


def test_drafting_steps_is_the_bound():
    """The defaults: 7 verify steps with drafts in 127 steps (4 misses, probes at 13, 30, 63); at most one probe per
    max_pause + 1 steps in the long run; observations during a pause (an earlier step's) change nothing."""
    b = Backoff()
    assert drafting_steps(b, 127) == 7
    assert drafting_steps(b, 4) == 4
    assert drafting_steps(b, 10_000) <= b.misses + 5 + 10_000 // (b.max_pause + 1)
    gate = DraftGate(b)
    run(gate, [0] * 4)
    assert gate.paused == b.pause
    gate.observe(3, 0)
    assert gate.paused == b.pause and gate.next_pause == 2 * b.pause


@pytest.mark.parametrize(
    "value, want",
    [
        (None, None),  # off unless asked: on by default it cost 14 % at c = 1 (request_speculation.Backoff)
        (True, Backoff()),
        (False, None),
        ({"misses": 2}, Backoff(misses=2)),
        ({"pause": 4, "max_pause": 4}, Backoff(pause=4, max_pause=4)),
    ],
)
def test_backoff_config(value, want):
    assert Backoff.from_config(value) == want


@pytest.mark.parametrize(
    "value, match",
    [
        ({"misses": 0}, "misses and pause must be >= 1"),
        ({"pause": 8, "max_pause": 4}, "max_pause >= pause"),
        ({"wait": 3}, r"unknown key\(s\) \['wait'\]"),
        ({"misses": 2.5}, "whole numbers"),
        ("yes", "true, false or a mapping"),
    ],
)
def test_backoff_config_errors_name_the_fix(value, match):
    with pytest.raises(SpeculationRequestError, match=match):
        Backoff.from_config(value)


def test_the_plugin_mapping_takes_draft_backoff():
    from vllm_eagle3.request_speculation_vllm import backoff_of

    from types import SimpleNamespace

    config = SimpleNamespace(additional_config={"vllm_eagle3": {"draft_backoff": {"misses": 2}}})
    assert backoff_of(config) == Backoff(misses=2)
    assert backoff_of(SimpleNamespace(additional_config={})) is None  # absent: off
    assert backoff_of(SimpleNamespace(additional_config={"vllm_eagle3": {"draft_backoff": False}})) is None


def test_verified_counts_match_vllms_per_request_metrics():
    from types import SimpleNamespace

    from vllm_eagle3.request_speculation_vllm import verified_counts

    so = SimpleNamespace(
        scheduled_spec_decode_tokens={"a": [5, 6, 7], "b": [1, 2], "c": []}, num_invalid_spec_tokens={"b": 1}
    )
    mo = SimpleNamespace(sampled_token_ids=[[9], [5, 6, 4], [3], [1, 8]], req_ids=["c", "a", "x", "b"])
    assert verified_counts(so, mo) == [("a", 3, 2), ("b", 1, 1)]


def test_a_bad_value_is_vllms_validation_error_through_sampling_params_verify():
    """In a process where the plugin's wrapper is installed, vLLM's own ``SamplingParams.verify`` refuses a bad value
    with ``VLLMValidationError`` (vLLM's API server answers it 400), and accepts a good one."""
    pytest.importorskip("vllm")
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    from vllm_eagle3 import request_speculation_vllm

    request_speculation_vllm.install()
    assert getattr(SamplingParams.verify, "__wrapped__", None) is not None

    def check(extra):
        params = SamplingParams(max_tokens=4, extra_args=extra)
        request_speculation_vllm._verify_speculation_key(params)

    check({KEY: 0})
    check(None)
    with pytest.raises(VLLMValidationError, match="must be true or false") as info:
        check({KEY: "maybe"})
    assert info.value.parameter == "vllm_xargs"
