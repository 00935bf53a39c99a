"""What ``vllm-eagle3 serve`` sets by itself on vLLM-CPU: a KV cache size when the user chose no memory setting.

Guards issue 13: the README's ``vllm-eagle3 serve ...`` refused to start outside ``make`` once the page cache held
~2.5 GB ("Available memory on node 0 (9.13/11.09 GiB) ... less than desired CPU memory utilization (0.92)"), because
vLLM-CPU without ``VLLM_CPU_KVCACHE_SPACE`` wants 92 % of the NUMA node free. A user's own choice is never overridden.
"""

import pytest

from vllm_eagle3.tools.serve.vllm_cpu import KV_ENV, KV_MAX_GIB, mem_available_gib, memory_setting

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
    with pytest.raises(
        ValueError,
        match=r"not enough memory to serve on vLLM-CPU: 2\.0 GiB available, ~3\.0 GiB "
        r"needed .* set VLLM_CPU_KVCACHE_SPACE=<GiB> / --gpu-memory-utilization",
    ):
        memory_setting(False, {}, [tmp_path], meminfo=meminfo(2.0))


def test_demo_compares_served_acceptance_with_the_served_walk(tmp_path):
    """Guards issue 11: the demo compared served acceptance with the every-anchor average (3.317), which the serving
    test itself calls the wrong baseline; the served walk is what a server measures."""
    import json

    from vllm_eagle3.tools.demo import model_card_line
    from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters

    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "eval.json").write_text(
        json.dumps(
            {
                "simulated_acceptance": {
                    "greedy": {"acceptance_length": {"3": 3.317}},
                    "served_walk": {"3": {"acceptance_length": 3.164}},
                }
            }
        )
    )
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"speculative-config:\n  model: {draft}\n")
    line = model_card_line(cfg, SpecDecodeCounters(100, 300, 200, (80, 65, 55)))
    assert "served walk, k=3" in line and "3.164" in line and "3.317" not in line and "3.000" in line


def test_demo_refuses_a_missing_image_before_starting_a_server(capsys, monkeypatch):
    """`vllm-eagle3 demo --image PATH` with no such file: exit 2 and one line naming the path and the fix, and no
    server started (it used to say so only after a ~1 min server start-up)."""
    from vllm_eagle3.tools import demo

    def no_server(*_args, **_kwargs):
        raise AssertionError("a server was started for a missing --image file")

    monkeypatch.setattr(demo, "VllmServer", no_server)
    assert demo.main(["--image", "/nonexistent/cat.png"]) == 2
    err = capsys.readouterr().err
    assert "--image /nonexistent/cat.png: no such file" in err and "--image alone" in err


def test_cli_hook_answers_only_the_missing_vllm_name(monkeypatch):
    """Guards issue 27.3: plain `vllm serve` on vllm-cpu died on importlib.metadata.version("vllm") before parsing
    anything. The start-up hook answers that one lookup with vllm-cpu's version (+cpu, as vLLM's own platform
    detection does); other names and installed distributions are untouched."""
    import importlib
    import importlib.metadata as md

    def fake(name):
        if name == "vllm-cpu":
            return "0.32.0"
        if name == "torch":
            return "2.13.0"
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", fake)
    import vllm_eagle3.vllm_cpu_version as hook

    importlib.reload(hook)  # installs over the fake
    assert md.version("vllm") == "0.32.0+cpu" and md.version("torch") == "2.13.0"
    with pytest.raises(md.PackageNotFoundError):
        md.version("no-such-dist")
    hook.install()  # idempotent: not wrapped twice
    assert md.version("vllm") == "0.32.0+cpu"


def test_fix_vllm_cli_writes_checks_and_removes_the_hook(tmp_path, monkeypatch, capsys):
    from vllm_eagle3.tools.serve import vllm_cpu

    monkeypatch.setattr(vllm_cpu, "pth_path", lambda: tmp_path / vllm_cpu.PTH_NAME)
    monkeypatch.setattr(vllm_cpu, "is_vllm_cpu", lambda: True)
    monkeypatch.setattr(vllm_cpu.md, "version", lambda name: "0.32.0")
    assert vllm_cpu.main(["--check"]) == 1
    assert vllm_cpu.main([]) == 0 and (tmp_path / vllm_cpu.PTH_NAME).read_text() == vllm_cpu.PTH_LINE
    assert vllm_cpu.main(["--check"]) == 0
    assert vllm_cpu.main(["--remove"]) == 0 and not (tmp_path / vllm_cpu.PTH_NAME).exists()
    monkeypatch.setattr(vllm_cpu, "is_vllm_cpu", lambda: False)
    assert vllm_cpu.main([]) == 0 and not (tmp_path / vllm_cpu.PTH_NAME).exists()
    assert "nothing to do" in capsys.readouterr().out


def test_demo_names_the_attention_backend_it_ran_on():
    """Issue 25: the demo prints the backend chosen (serve's choice line and vLLM's own), so an AMX host shows
    CPU_MLA for the float32 miniature and why."""
    from vllm_eagle3.tools.demo import attention_backend_line

    log = (
        "vllm-eagle3: vLLM-CPU attention: CPU_MLA for the target (float32 on a CPU with AMX tiles: ...)\n"
        "(EngineCore pid=3) INFO 12-02 10:00:00 [cpu.py:175] Using CPU_MLA backend.\n"
    )
    line = attention_backend_line(log)
    assert line.startswith("vllm-eagle3: vLLM-CPU attention: CPU_MLA for the target")
    assert line.endswith("(vLLM: CPU_MLA)")
    assert attention_backend_line("(Worker pid=4) Using AMX_MLA backend.\n") == "attention backend: AMX_MLA"
