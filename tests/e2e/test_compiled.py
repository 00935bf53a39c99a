"""The compiled path (vLLM's default: torch.compile, no ``enforce_eager``), the one every GPU user runs, with the plugin
and the shipped pair: the taps the target captures are transformers' hidden states, and greedy EAGLE-3 output is the
target's greedy output.

Guards what only compilation can break: the plugin's embedding tap and spec-ordered aux list traced by Dynamo into
vLLM's graph (a tap read from the wrong graph output, a stale value of a buffer Inductor reuses, the aux list dropped
or reordered when the forward is captured), and EAGLE-3 verification through the compiled target with the default-on
MLA verify-as-decode patch. Every other engine test runs ``enforce_eager=True``. On vLLM-CPU the default compiled mode
is ``DYNAMO_TRACE_ONCE`` with Inductor (``platforms/cpu.py`` rewrites ``VLLM_COMPILE``; no CUDA graphs): the same
Dynamo capture of the plugin's forward as on GPU, not vLLM's GPU piecewise split + CUDA graphs, which cannot run here.

One engine start (offline ``LLM``, the serve config's options minus ``enforce-eager``: float32, k=3). Its compile cache
lives in the project's gitignored ``.cache/vllm`` (``VLLM_CACHE_ROOT``; Inductor's cache goes under it too). vLLM-CPU
0.32 cannot reload its own AOT artifact in ``DYNAMO_TRACE_ONCE`` mode (start-up log: "Compiling model again due to a
load failure ... 'function' object has no attribute 'finalize_loading'"), so every run re-traces with Dynamo; only
Inductor's code generation is cached. Start-up is several minutes (cold ~4.5 min on an idle 2-core box).

dtype: float32, as configs/serve_kimi_k25_mini.yaml serves. The checkpoint's own dtype is bfloat16 (what ``dtype=auto``
would pick), but the references — eval_prompts.json's continuations and the taps below — are float32 transformers,
and in bfloat16 greedy text can flip at near-ties (docs/bf16.md), so only float32 allows exact
equality. Dynamo tracing and Inductor code generation are the same code whatever the dtype.

Tolerances: ``embed`` bit-identical (an embedding lookup, no arithmetic). Taps 3 and 31: every element within
``ROW_RTOL = 1e-4`` of its position's largest |activation| in HF. The trained miniature carries massive activations
(max |hidden_states[3]| ~2000, ~700 in a typical position), so a fixed ``atol`` like the eager parity test's 1e-4 on
random weights (magnitudes ~1-10) is below one float32 ulp of those elements; Inductor fuses and re-associates the same
float32 sums (RMSNorm, GEMM blocking, MoE weighted sums), whose rounding scales with the row's magnitude. Measured
on the prompt: tap 3 2.8e-6 of the row scale (max abs 2.0e-3, row maxima up to ~2000), tap 31 8.2e-6 (max abs
8.6e-3): tens of float32 eps, compounded over 3 and 31 layers. A neighbouring tap (an off-by-one capture) is >= 40 away
in max abs, > 1e-2 of the row scale, which the test also asserts. Greedy tokens: exact (float32; a wrong tap or
attention moves logits by O(1)).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
COMPILE_CACHE = REPO / ".cache" / "vllm"
TAPS = (0, 3, 31)  # configs/kimi_k25_eagle3.yaml: [embed, 3, 31], in that order
NUM_PROMPTS = 4
MAX_TOKENS = 32
ROW_RTOL = 1e-4  # |compiled - HF| / (the position's max |HF activation|); see the module docstring


@pytest.fixture(scope="module")
def compiled() -> dict:
    from vllm import SamplingParams

    from vllm_eagle3.testing.engine import counter_totals, start_engine, stop_engine, worker_mla_verify_calls
    from vllm_eagle3.testing.taps import install_recorder, recorded_taps

    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"][:NUM_PROMPTS]
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    # No retry: the start that died at warm-up ("Cannot recover from stack overflow", 3 of 4 starts on an Intel
    # Xeon with AMX) was vLLM-CPU freeing a oneDNN handler with Tensor.item() mid-trace, fixed by the engine patch
    # vllm_eagle3/model_patches/vllm_cpu_onednn_release.py.
    engine = start_engine(
        TARGET,
        DRAFT,
        env={"EAGLE3_SPEC": str(SPEC), "VLLM_CACHE_ROOT": str(COMPILE_CACHE)},
        enforce_eager=False,
        max_model_len=512,
        disable_log_stats=False,
    )
    try:
        config = engine.llm.llm_engine.vllm_config
        engine.llm.apply_model(install_recorder)
        engine.llm.generate(
            [{"prompt_token_ids": items[0]["prompt_token_ids"]}],
            SamplingParams(max_tokens=1, temperature=0.0),
            use_tqdm=False,
        )
        records = engine.llm.apply_model(recorded_taps)[0]
        outs = engine.llm.generate(
            [{"prompt_token_ids": it["prompt_token_ids"]} for it in items], greedy, use_tqdm=False
        )
        result = {
            "records": records,
            "greedy": [list(o.outputs[0].token_ids) for o in outs],
            "want": [it["continuation_token_ids"][:MAX_TOKENS] for it in items],
            "prompt": items[0]["prompt_token_ids"],
            "metrics": counter_totals(engine.llm),
            "calls": engine.llm.collective_rpc(worker_mla_verify_calls),
            "mode": config.compilation_config.mode,
            "backend": config.compilation_config.backend,
            "dtype": config.model_config.dtype,
            "startup_s": engine.startup_s,
            "log": engine.log(),
        }
    finally:
        stop_engine(engine)
    print(f"compiled engine ready in {result['startup_s']:.0f} s (compile cache {COMPILE_CACHE})")
    return result


@pytest.fixture(scope="module")
def hf_states(compiled) -> tuple[torch.Tensor, ...]:
    from vllm_eagle3.miniature.export import load_text_model

    model = load_text_model(TARGET)
    with torch.no_grad():
        return model(input_ids=torch.tensor([compiled["prompt"]]), output_hidden_states=True).hidden_states


def test_engine_really_compiled(compiled):
    """The engine ran vLLM's default compiled mode (not eager) with Inductor, in float32. vLLM-CPU turns the default
    ``VLLM_COMPILE`` into ``DYNAMO_TRACE_ONCE`` + Inductor (``platforms/cpu.py``); GPU keeps ``VLLM_COMPILE``."""
    from vllm.config import CompilationMode

    assert compiled["mode"] in (CompilationMode.DYNAMO_TRACE_ONCE, CompilationMode.VLLM_COMPILE), compiled["mode"]
    assert compiled["backend"] == "inductor", compiled["backend"]
    assert compiled["dtype"] == torch.float32
    assert "capturing taps [embed, 3, 31]" in compiled["log"]
    assert "vllm_cpu_onednn_release" in compiled["log"], "the oneDNN release patch is not in force in the engine"


def test_compiled_taps_equal_transformers_hidden_states(compiled, hf_states):
    """The aux list the compiled target hands the draft for the prompt's prefill is [HF hs[0], hs[3], hs[31]]."""
    n = len(compiled["prompt"])
    prefill = [r for r in compiled["records"] if r and r[0].shape[0] == n]
    assert prefill, (
        f"no forward over the {n}-token prompt recorded; shapes "
        f"{[[tuple(t.shape) for t in r] for r in compiled['records']]}"
    )
    taps = prefill[0]
    assert len(taps) == len(TAPS)
    for got, tap in zip(taps, TAPS):
        want = hf_states[tap][0]
        assert got.shape == want.shape, f"tap {tap}: shape {tuple(got.shape)} != HF {tuple(want.shape)}"
        if tap == 0:
            assert torch.equal(got, want), (
                f"embed tap differs from HF hidden_states[0] by {(got - want).abs().max().item():.3g}"
            )
            continue
        scale = want.abs().amax(dim=-1, keepdim=True)  # [num_tokens, 1]: each position's largest activation
        err = ((got - want).abs() / scale).max().item()
        print(
            f"tap {tap}: max |compiled vLLM - transformers| / row max |HF| = {err:.3g} "
            f"(max abs {(got - want).abs().max().item():.3g}, row max |HF| up to {scale.max().item():.0f})"
        )
        assert err < ROW_RTOL, (
            f"tap {tap}: compiled vLLM differs from HF hidden_states[{tap}] by {err:.3g} of the "
            f"position's largest activation (allowed {ROW_RTOL})"
        )
        for other in (tap - 1, tap + 1):
            gap = ((got - hf_states[other][0]).abs() / scale).max().item()
            assert gap > 100 * ROW_RTOL, (
                f"tap {tap} is within {gap:.3g} of HF hidden_states[{other}]: the test "
                "cannot tell neighbouring taps apart"
            )


def test_compiled_greedy_speculative_equals_non_speculative(compiled):
    """EAGLE-3 greedy tokens from the compiled engine == the target's float32 non-speculative greedy continuation."""
    for i, (got, want) in enumerate(zip(compiled["greedy"], compiled["want"])):
        first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, (
            f"prompt {i}: compiled EAGLE-3 differs from the target's greedy tokens from position "
            f"{first}: {got[first : first + 5]} vs {want[first : first + 5]}"
        )


def test_compiled_engine_speculated(compiled, assert_speculation_accepted):
    """Drafts were proposed, verified on the decode kernel (the default MLA patch) and accepted."""
    assert_speculation_accepted(compiled["metrics"])
    assert all(c["verify"] > 0 for c in compiled["calls"]), compiled["calls"]
