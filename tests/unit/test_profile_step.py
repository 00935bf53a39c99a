"""vllm_eagle3/tools/bench/profile_step.py without an engine: step classification, the per-step summary and its options.

The bugs it guards: a prefill or mixed step counted as a decode/verify step (its 64-token prompt would dominate the
"verify" median), an acceptance length read from vLLM's metrics registry (one per process: with several engines in
one process it is the last engine's, which made the Llama head read 1.00 in the first run), and a bad --heads value
starting three engines before failing.
"""

from __future__ import annotations

import types

import pytest

from vllm_eagle3.tools.bench import profile_step as P

pytestmark = pytest.mark.unit


def sched(tokens: dict, spec: dict | None = None, new=()):
    return types.SimpleNamespace(num_scheduled_tokens=tokens, scheduled_spec_decode_tokens=spec or {},
                                 scheduled_new_reqs=list(new), total_num_scheduled_tokens=sum(tokens.values()))


def test_step_kind():
    assert P._step_kind(sched({"a": 1, "b": 1})) == "decode"
    assert P._step_kind(sched({"a": 4, "b": 2}, {"a": [5, 6, 7], "b": [9]})) == "verify"  # fewer drafts for b
    assert P._step_kind(sched({"a": 4, "b": 64}, {"a": [5, 6, 7]})) == "prefill"  # b is a prompt: mixed step
    assert P._step_kind(sched({"a": 1}, new=["x"])) == "prefill"


def step(kind, total, start, emitted, reqs=2, **parts):
    return {"label": "x", "kind": kind, "tokens": 8, "reqs": reqs, "start": start, "end": start + total,
            "total": total, "emitted": emitted, **parts}


def test_summarize_medians_gap_and_tau():
    steps = [step("prefill", 5.0, 0.0, 2),
             step("verify", 1.0, 6.0, 5, forward=0.8, draft=0.1, modules={"moe": 0.2}),
             step("verify", 3.0, 7.5, 4, forward=2.5, draft=0.1, modules={"moe": 0.4}),
             step("verify", 2.0, 11.0, 6, forward=1.5, draft=0.2, modules={"moe": 0.3})]
    s = P.summarize(steps)
    assert s["n"] == 3 and s["kind"] == "verify" and s["total"] == 2.0 and s["forward"] == 1.5
    assert s["draft"] == 0.1 and s["other"] == pytest.approx(0.3)  # median of 0.1, 0.4, 0.3
    assert s["gap"] == pytest.approx(0.5)  # 7.5 - 7.0 and 11.0 - 10.5; the prefill -> verify gap is left out
    assert s["tau_steps"] == pytest.approx(15 / 6)  # tokens emitted per request per steady step
    assert s["modules"] == {"moe": 0.3}
    assert P.summarize([step("prefill", 1.0, 0.0, 1)]) == {}


@pytest.mark.parametrize("argv, message", [(["--heads", "none,eagle"], "unknown head"),
                                           (["--heads", "llama@9"], "unknown head"),
                                           (["--concurrency", "4,x"], "give integers"),
                                           (["--max-tokens", "2"], "--max-tokens >= 8")])
def test_bad_options_are_refused_before_any_engine(argv, message, capsys):
    with pytest.raises(SystemExit):
        P.parse_args(argv)
    assert message in capsys.readouterr().err


def test_options():
    args = P.parse_args(["--heads", "none, mla,llama@2", "--concurrency", "16,1"])
    assert args.heads == ["none", "mla", "llama@2"] and args.concurrency == [16, 1]
