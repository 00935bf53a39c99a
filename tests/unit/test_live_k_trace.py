"""``vllm-eagle3 live-k-trace``'s parts that need no engine: the server it starts is the shipped serve config with only
the k table replaced, the sample reads the bucket that holds the concurrency, and a start k outside 0..max k is refused
before anything starts."""

from __future__ import annotations

import json

import pytest
import yaml

from vllm_eagle3.tools import REPO
from vllm_eagle3.tools.live_k_trace import SERVE_CONFIG, busiest, main, serve_args

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


def test_busiest_is_the_bucket_of_the_concurrency():
    live = {"table": [[1, 1, 5], [27, 38, 2], [39, 53, 3]]}
    assert busiest(live, 32) == [27, 38, 2]
    assert busiest(live, 64) == [39, 53, 3]  # not seen yet: the last bucket seen
    assert busiest({"table": []}, 4) is None


def test_a_start_k_outside_the_range_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--start-k", "6", "--max-k", "5"])
    assert exit_.value.code == 2 and "--start-k must be in 0..--max-k (5), got 6" in capsys.readouterr().err
