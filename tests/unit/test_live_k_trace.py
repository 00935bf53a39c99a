"""``vllm-eagle3 live-k-trace``'s parts that need no engine: the server it starts is the shipped serve config with only
the k table replaced, the sample reads the bucket that holds the concurrency, and a start k outside 0..max k is refused
before anything starts."""

from __future__ import annotations

import json

import pytest
import yaml

from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.live_k_trace import SERVE_CONFIG, busiest, main, serve_args, steady, step_summary

pytestmark = pytest.mark.unit


def test_serve_args_replace_only_the_table():
    args = serve_args(5, 5)
    assert args[:2] == ["--config", SERVE_CONFIG]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    shipped = yaml.safe_load((REPO / SERVE_CONFIG).read_text())["speculative-config"]
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4096, 5]]
    assert {k: v for k, v in spec.items() if k != "num_speculative_tokens_per_batch_size"} == {
        k: v for k, v in shipped.items() if k != "num_speculative_tokens_per_batch_size"
    }
    assert json.loads(serve_args(1, 3)[3])["num_speculative_tokens"] == 3


@pytest.mark.parametrize(
    "live_k, served",
    [
        (True, {"host_table": False}),
        (False, False),
        ({"hold": 8}, {"host_table": False, "hold": 8}),
        ({"host_table": True}, {"host_table": True}),
    ],
)
def test_serve_args_replace_live_k_and_keep_the_capture_spec(live_k, served):
    """The trace starts from --start-k, not from this host kind's table, unless told otherwise."""
    args = serve_args(5, 5, live_k)
    extra = json.loads(args[args.index("--additional-config") + 1])["vllm_eagle3"]
    shipped = yaml.safe_load((REPO / SERVE_CONFIG).read_text())["additional-config"]["vllm_eagle3"]
    assert extra["live_k"] == served and extra["capture_spec"] == shipped["capture_spec"]
    assert {k for k in extra if k != "live_k"} == {k for k in shipped if k != "live_k"}


def test_step_summary_reads_the_bucket_of_the_concurrency(tmp_path):
    """Only cost samples of the bucket holding the concurrency count; the spread is of log seconds per request."""
    rows = [
        dict(t=0, batch=32, k=2, sample=True, prefill=False, s=0.32),
        dict(t=1, batch=32, k=2, sample=True, prefill=False, s=0.32 * 1.2),
        dict(t=2, batch=31, k=2, sample=False, prefill=True, s=9.0),  # a prompt step: no sample
        dict(t=3, batch=4, k=5, sample=True, prefill=False, s=0.1),  # another bucket
        dict(t=4, batch=30, k=3, sample=True, prefill=False, s=0.3),
    ]
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = step_summary(path, 32)
    assert out["steps"] == 5 and out["prompt_steps"] == 1
    two, three = out["bucket_cost_samples"]["2"], out["bucket_cost_samples"]["3"]
    assert two["samples"] == 2 and two["sd_log_cost"] == pytest.approx(0.1289, abs=1e-4)  # log(1.2) / sqrt(2)
    assert three == {"samples": 1, "median_s_per_request": 0.01, "sd_log_cost": None}
    assert "5" not in out["bucket_cost_samples"] and step_summary(tmp_path / "none.jsonl", 32) is None


def test_busiest_is_the_bucket_of_the_concurrency():
    live = {"table": [[1, 1, 5], [27, 38, 2], [39, 53, 3]]}
    assert busiest(live, 32) == [27, 38, 2]
    assert busiest(live, 64) == [39, 53, 3]  # not seen yet: the last bucket seen
    assert busiest({"table": []}, 4) is None


def test_a_start_k_outside_the_range_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--start-k", "6", "--max-k", "5"])
    assert exit_.value.code == 2 and "--start-k must be in 0..--max-k (5), got 6" in capsys.readouterr().err


def test_steady_leaves_out_the_ramp_and_the_tail():
    """Only samples with all ``concurrency`` requests in flight count, and the first of them (part ramp)."""
    done = [0, 0, 4, 10, 20, 30, 40, 50, 60, 64, 64]
    rate = [5.0, 50.0, 999.0, 100.0, 110.0, 90.0, 100.0, 100.0, 70.0, 20.0, 1.0]
    samples = [{"requests_done": d, "tokens_per_s": r} for d, r in zip(done, rate)]
    out = steady(samples, requests=64, concurrency=8)  # full load while 0 < done <= 56: 4 (ramp), 10 .. 50
    assert out["samples"] == 5 and out["tokens_per_s"] == 100.0
    assert out["ci95"][0] < 100.0 < out["ci95"][1]
    assert steady(samples[:4], requests=64, concurrency=8) is None  # too few to say
