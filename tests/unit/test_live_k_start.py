"""Where live k starts (``vllm_eagle3.live_k_start``, ``live_k_vllm.start_of``): this host kind's measured table for
the draft when ``configs/live_k_start.yaml`` lists one, else the serve config's, and the start-up words say which."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from vllm_eagle3 import live_k_start, live_k_vllm
from vllm_eagle3.live_k import LiveKError, Settings
from vllm_eagle3.tools import REPO

pytestmark = pytest.mark.unit

TABLE = {"table": [[1, 8, 5], [9, 4096, 2]], "measured": "a test"}


@pytest.mark.parametrize(
    "cpu, flags, emulated, slug",
    [
        ("AMD EPYC", {"avx2", "avx512f", "avx512_bf16"}, False, "amd-epyc-avx512"),
        ("AMD EPYC", {"avx2"}, False, "amd-epyc-avx2"),
        ("AMD EPYC", {"avx2"}, True, "amd-epyc-avx2-emulated"),
        ("Intel(R) Xeon(R) Processor", {"avx2", "avx512f", "amx_tile"}, False, "intel-xeon-amx"),
    ],
)
def test_host_kinds_are_the_results_files(cpu, flags, emulated, slug):
    """The engine names its host kind as every results file does (bench's report calls the same function), so a
    table recorded from a benchmark is found by the engine that runs on that kind of host."""
    from vllm_eagle3.tools.bench.report_adaptive import host_kind

    assert live_k_start.host_kind(cpu, flags, emulated)[1] == slug
    assert host_kind({"cpu": cpu, "flags": " ".join(flags), "emulated": emulated})[1] == slug


def test_this_host_is_named_as_its_results_files_name_it():
    """The engine's host kind and a results file's machine block read the same CPU model and flags, so this host's
    benchmark, recorded into the start table, is the table its engine finds."""
    from vllm_eagle3.tools.bench.report_adaptive import host_kind
    from vllm_eagle3.tools.machine import machine_info

    assert live_k_start.this_host() == host_kind(machine_info())


def test_the_cpu_model_is_cpuinfos_model_name():
    info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\nflags\t: avx2\n"
    from vllm_eagle3 import cpu_attention

    assert cpu_attention.cpu_model(info) == "AMD EPYC 7B13 64-Core Processor"
    assert cpu_attention.cpu_model("processor\t: 0\n") == "?"


def test_the_shipped_file_holds_only_usable_tables():
    """Every entry of configs/live_k_start.yaml is a whole table for k up to the shipped 5, with what measured it; an
    emulated host kind is never listed (its cores are another kind's)."""
    assert live_k_start.start_file() == REPO / live_k_start.START_FILE  # this clone's, as the engine reads it
    data = live_k_start.read(live_k_start.start_file())
    assert data, "configs/live_k_start.yaml is missing or empty"
    for draft, kinds in data.items():
        assert (REPO / "models" / draft / "config.json").is_file(), draft
        for slug in kinds:
            assert "emulated" not in slug, slug
            start = live_k_start.lookup(data, draft, slug, slug, 5)
            assert start is not None and start.table[0][0] == 1 and start.measured


@pytest.mark.parametrize(
    "entry, needle",
    [
        ({"table": [[1, 8, 5]]}, "needs 'table' ([[first, last, k], ...]) and 'measured'"),
        ({"table": [[2, 8, 5]], "measured": "x"}, "must start at batch size 1"),
        ({"table": [[1, 8, 5], [10, 4096, 2]], "measured": "x"}, "row [10, 4096, 2] must start at batch size 9"),
        ({"table": [[1, 8, -1]], "measured": "x"}, "have k >= 0"),
        ({"table": [[1, 8]], "measured": "x"}, "is not [first batch size, last, k]"),
        ({"table": [], "measured": "x"}, "the table is empty"),
    ],
)
def test_a_broken_entry_is_refused_naming_it(entry, needle):
    with pytest.raises(live_k_start.StartTableError) as err:
        live_k_start.lookup({"d": {"kind": entry}}, "d", "kind", "Kind", 5)
    assert needle in str(err.value) and "configs/live_k_start.yaml: d.kind" in str(err.value)


def test_a_server_drafting_fewer_starts_at_the_nearest_k_it_can_draft():
    """A table measured with up to 5 drafts, served with num_speculative_tokens 3: k 5 starts as 3 (a real fresh-clone
    failure: the lifecycle test's 3-draft server refused to start on a listed host kind)."""
    start = live_k_start.lookup({"d": {"k": TABLE}}, "d", "k", "K", 3)
    assert start.table == ((1, 8, 3), (9, 4096, 2))


def test_an_unlisted_draft_or_host_kind_has_no_table():
    assert live_k_start.lookup({"d": {"k": TABLE}}, "other", "k", "K", 5) is None
    assert live_k_start.lookup({"d": {"k": TABLE}}, "d", "other", "K", 5) is None


def _config(draft: str = "/x/kimi-k25-mini-eagle3") -> SimpleNamespace:
    return SimpleNamespace(speculative_config=SimpleNamespace(model=draft))


@pytest.fixture
def on_host(tmp_path, monkeypatch):
    """A repository whose configs/live_k_start.yaml lists TABLE for kimi-k25-mini-eagle3 on "test-host"."""
    (tmp_path / "configs").mkdir()
    (tmp_path / live_k_start.START_FILE).write_text(yaml.safe_dump({"kimi-k25-mini-eagle3": {"test-host": TABLE}}))
    monkeypatch.setattr(live_k_start, "start_file", lambda: tmp_path / live_k_start.START_FILE)
    monkeypatch.setattr(live_k_start, "this_host", lambda: ("Test CPU, AVX2", "test-host"))
    return tmp_path


def test_a_listed_host_kind_starts_from_its_table_and_says_so(on_host):
    start, words, measured = live_k_vllm.start_of(_config(), Settings(), 5, [1] * 17, 17)
    assert start == [0] + [5] * 8 + [2] * 8  # vLLM's dense lookup: index = batch size, 0 unused
    assert measured  # so each bucket starts settled (tests/unit/test_live_k.py)
    assert live_k_vllm.start_of(_config(), Settings(), 3, None, 12)[0] == [0] + [3] * 8 + [2] * 3  # k 5 capped at 3
    assert words == "the table measured on Test CPU, AVX2 for kimi-k25-mini-eagle3, [[1, 8, 5], [9, 4096, 2]] (a test)"


def test_batch_sizes_past_the_last_row_take_its_k(on_host):
    short = {"table": [[1, 2, 4]], "measured": "x"}
    (on_host / live_k_start.START_FILE).write_text(yaml.safe_dump({"kimi-k25-mini-eagle3": {"test-host": short}}))
    assert live_k_vllm.start_of(_config(), Settings(), 5, None, 5)[0] == [0, 4, 4, 4, 4]


def test_another_host_or_draft_starts_from_the_config_and_says_it_was_not_measured_here(on_host, monkeypatch):
    start, words, measured = live_k_vllm.start_of(_config("/x/other-head"), Settings(), 5, [1] * 17, 17)
    assert start == [1] * 17 and not measured
    assert words == (
        "the configured num_speculative_tokens_per_batch_size (written in the config, not measured on this host "
        "kind: configs/live_k_start.yaml has no other-head on test-host)"
    )
    start, words, measured = live_k_vllm.start_of(_config(), Settings(host_table=False), 5, None, 4)
    assert start == [5, 5, 5, 5] and not measured and words == "k = 5 (written in the config; host_table off)"


def test_a_broken_file_refuses_to_start_naming_the_way_out(on_host):
    (on_host / live_k_start.START_FILE).write_text(
        yaml.safe_dump({"kimi-k25-mini-eagle3": {"test-host": {"table": [[2, 8, 3]], "measured": "x"}}})
    )
    with pytest.raises(LiveKError) as err:
        live_k_vllm.start_of(_config(), Settings(), 5, None, 4)
    assert "must start at batch size 1" in str(err.value) and "live_k: {host_table: false}" in str(err.value)
