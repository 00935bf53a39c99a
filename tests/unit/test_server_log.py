"""Reading a failed ``vllm serve`` start-up log: the phase reached and the exceptions that caused it.

CI shows only the end of a failing run's output, and vLLM's API server ends its log with a generic "Engine core
initialization failed. See root cause above." -- the cause sits in the engine core's lines far above. These tests
pin that the digest put at the end of :class:`ServerStartError` names the real exception.
"""

import pytest

from vllm_eagle3.tools.serve.process import VllmServer, root_cause, startup_phase, with_intel_openmp

pytestmark = pytest.mark.unit

# verbatim log lines: not wrapped
ENGINE_CORE_FAILURE = """\
(APIServer pid=7) INFO 11-30 14:00:01 [utils.py:1] Resolved architecture: KimiK25ForConditionalGeneration
(EngineCore pid=12) INFO 11-30 14:00:09 [gpu_model_runner.py:1] Starting to load model /m...
(EngineCore pid=12) ERROR 11-30 14:00:10 [core.py:1] EngineCore failed to start.
(EngineCore pid=12) Traceback (most recent call last):
(EngineCore pid=12)   File "/x/core.py", line 3, in run_engine_core
(EngineCore pid=12)     raise ValueError("kv_lora_rank 256 unsupported")
(EngineCore pid=12) ValueError: kv_lora_rank 256 unsupported
(APIServer pid=7) Traceback (most recent call last):
(APIServer pid=7)   File "/x/utils.py", line 1431, in wait_for_engine_startup
(APIServer pid=7) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""  # noqa: E501


def test_root_cause_names_the_engine_core_exception_not_the_wrapper():
    cause = root_cause(ENGINE_CORE_FAILURE)
    assert cause == "(EngineCore pid=12) ValueError: kv_lora_rank 256 unsupported"


def test_root_cause_keeps_module_qualified_exceptions_in_order_without_repeats():
    log = "torch.OutOfMemoryError: CPU out of memory\nKeyError: 'x'\ntorch.OutOfMemoryError: CPU out of memory\n"
    assert root_cause(log).splitlines() == ["torch.OutOfMemoryError: CPU out of memory", "KeyError: 'x'"]
    assert root_cause("INFO all fine\nWARNING ulimit low\n") == ""


def test_failure_digest_comes_last_with_phase_and_cause(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text(ENGINE_CORE_FAILURE)
    server = VllmServer(["/m"], port=1, log_path=log)
    digest = server.failure_digest()
    assert startup_phase(ENGINE_CORE_FAILURE) == "loading the target's weights"
    assert digest.splitlines() == [
        "start-up phase reached: loading the target's weights",
        "exceptions in the log:",
        "(EngineCore pid=12) ValueError: kv_lora_rank 256 unsupported",
    ]


def test_intel_openmp_is_added_only_when_no_openmp_runtime_is_preloaded(tmp_path):
    """The CI failure this guards: after an in-process engine, os.environ carries vLLM's tcmalloc + libgomp
    preload; adding libiomp5 on top made every later ``vllm serve`` die on vLLM's one-runtime assertion."""
    iomp = "/venv/lib/libiomp5.so"
    vllm_set = "/venv/vllm/libs/libtcmalloc_minimal.so.4:/venv/torch.libs/libgomp-a34b3233.so.1"
    assert with_intel_openmp(vllm_set, iomp) == vllm_set
    assert with_intel_openmp("", iomp) == iomp
    assert with_intel_openmp("/x/libfoo.so", iomp) == f"{iomp}:/x/libfoo.so"
    assert with_intel_openmp(iomp, iomp) == iomp
    assert with_intel_openmp("", None) == ""
    env = VllmServer(["/m"], port=1, env={"LD_PRELOAD": vllm_set}, log_path=tmp_path / "s.log").env
    assert "libiomp" not in env["LD_PRELOAD"] and "libgomp" in env["LD_PRELOAD"]
