"""Draft-side parity: given the SAME aux input, vLLM's EAGLE-3 head, SGLang's ``llama_eagle3`` and the training
pipeline's head produce the same logits and the same top-k tokens.

The capture tests prove the three engines hand the draft the same taps; this module proves they then do the same
thing with them, on the shipped miniature pair (trained head, so top-k is meaningful, not a random near-tie):

1. vLLM (the plugin, spec ``[embed, 3, 31]``, float32) serves one held-out prompt; a probe in the worker
   (:mod:`vllm_eagle3.testing.draft_probe`) keeps the first draft step of the first proposal: the aux rows
   BEFORE ``fc`` (``cat`` of the taps), the token ids the draft read (the prompt shifted by one plus the sampled
   token), positions, and vLLM's own ``compute_logits`` at every row (target vocabulary, ``d2t``-mapped, -inf
   outside the draft vocabulary).
2. The training pipeline's head (:class:`vllm_eagle3.reference.Eagle3Draft`, the code the head was
   trained with) on exactly those inputs.
3. SGLang 0.5.23's own ``LlamaForCausalLMEagle3`` in its own venv (``sglang_harness/draft_runner.py``: a real
   draft ``ModelRunner``, one draft-extend forward with ``spec_info.hidden_states`` = the same aux rows).

Tolerance (float32 everywhere, the same bf16-stored weights upcast): ``atol = rtol = 1e-4`` on the finite logits
(:data:`ATOL`). One decoder layer separates ``fc`` from ``lm_head``; the engines differ only in float32
re-association (fused qkv / gate-up matmuls, SDPA vs explicit softmax, RMSNorm kernels), which moves logits of
magnitude ~10 by ~1e-5 (measured: 9.1e-6 training code vs vLLM, 8.6e-6 SGLang vs vLLM, logits in -11.7..8.0,
64 rows). The same -inf pattern is required exactly (same
draft vocabulary, same ``d2t``), the top-1 token at every row, and the top-5 set wherever the 5th and 6th logits
are further apart than the tolerance.

The MLA head (models/kimi-k25-mini-eagle3-mla, ``Eagle3DeepseekV2ForCausalLM``, ``fc_norm`` + ``norm_output``; issue 15
item 3) gets the same three-way comparison on its own vLLM run (one more engine start, the plugin's spec
``[embed, 3, 31]``): vLLM's ``deepseek_eagle3.py``, SGLang 0.5.23's ``kimi_k25_eagle3.py`` (its real code, through
``sglang_harness/mla_draft_runner.py``) and the training code (:class:`~vllm_eagle3.reference.Eagle3Draft` with
``arch="mla"``). Tolerance :data:`MLA_ATOL` (see there): the engines run MLA in its absorbed form (``w_kc`` folded
into the query, scores and values in the 512-wide latent space), the training code in its naive form (per-head keys
and values from ``kv_b_proj``): the same function, summed in another order.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from test_sglang_parity import SGLANG_PY, require_sglang_env

pytestmark = pytest.mark.parity

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent / "sglang_harness"
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
ATOL = RTOL = 1e-4
# vLLM's taps vs transformers', relative to the tap's largest value: the trained miniature's residual stream grows to
# ~600 by layer 31 (a random tiny model stays ~1-10), so float32 re-association (MLA absorbed vs naive, MoE kernels)
# leaves ~1.5e-5 of max |value| (measured: 0.0093 at values ~600); neighbouring taps are > 1e-2 away (asserted).
TAP_REL = 1e-4
TOP_K = 5
MLA_DRAFT = REPO / "models" / "kimi-k25-mini-eagle3-mla"
MLA_CLASS = "Eagle3DeepseekV2ForCausalLM"
# MLA head, float32 everywhere: absorbed (engines) vs naive (training code) MLA re-associates the q.k and p.v sums over
# 512 latent dims instead of 64 per-head dims, on top of the Llama head's kernel differences; logits are ~10.
# Measured on the prompt (64 rows): see the printed max abs diffs (commit message quotes the run).
MLA_ATOL = MLA_RTOL = 1e-4


def max_abs_finite(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = torch.isfinite(a)
    return (a[finite] - b[finite]).abs().max().item()


def assert_same_logits(
    name: str, got: torch.Tensor, want: torch.Tensor, atol: float = ATOL, rtol: float = RTOL
) -> None:
    """``got`` (engine ``name``) equals vLLM's logits ``want`` [T, V]: -inf pattern, values, top-1, top-k."""
    assert got.shape == want.shape, f"{name}: logits {tuple(got.shape)} vs vLLM {tuple(want.shape)}"
    finite_got, finite_want = torch.isfinite(got), torch.isfinite(want)
    assert torch.equal(finite_got, finite_want), (
        f"{name}: {int((finite_got != finite_want).sum())} logits finite in one engine and -inf in the other "
        "(a different draft vocabulary or d2t mapping)"
    )
    diff = max_abs_finite(got, want)
    print(
        f"{name} vs vLLM draft logits {tuple(got.shape)}: max abs diff {diff:.3g} "
        f"(logit range {want[finite_want].min().item():.1f}..{want[finite_want].max().item():.1f})"
    )
    assert torch.allclose(got[finite_want], want[finite_want], atol=atol, rtol=rtol), (
        f"{name} vs vLLM draft logits {tuple(got.shape)}: max abs diff {diff:.3g} > atol {atol} / rtol {rtol}"
    )
    top1_got, top1_want = got.argmax(-1), want.argmax(-1)
    rows = (top1_got != top1_want).nonzero().flatten().tolist()
    assert not rows, f"{name}: top-1 draft token differs from vLLM's at rows {rows}"
    vals, idx_want = want.topk(TOP_K + 1, dim=-1)
    idx_got = got.topk(TOP_K, dim=-1).indices
    separable = (vals[:, TOP_K - 1] - vals[:, TOP_K]) > 2 * atol
    for r in separable.nonzero().flatten().tolist():
        assert set(idx_got[r].tolist()) == set(idx_want[r, :TOP_K].tolist()), (
            f"{name}: top-{TOP_K} draft tokens at row {r} differ from vLLM's"
        )


@pytest.fixture(scope="module")
def prompt(mini_prompt) -> list[int]:
    return mini_prompt


@pytest.fixture(scope="module")
def vllm_call(mini_vllm_draft_call) -> dict:
    """The first draft step of vLLM's first proposal for ``prompt`` (one engine per session: ``conftest.py``)."""
    assert mini_vllm_draft_call["draft_classes"] == ["Eagle3LlamaForCausalLM"], (
        f"vLLM's draft model class: {mini_vllm_draft_call['draft_classes']}"
    )
    return mini_vllm_draft_call


def test_vllm_draft_reads_the_trained_wiring(vllm_call, prompt):
    """What vLLM feeds its draft is the training wiring: aux = cat(transformers hidden_states[0], [3], [31]) and the
    tokens shifted by one (row i reads token i + 1; the last row reads the token the target just sampled)."""
    from vllm_eagle3.miniature import export
    from vllm_eagle3.resolve import load_spec_yaml

    spec = load_spec_yaml(SPEC)
    model = export.load_text_model(TARGET)
    with torch.no_grad():
        states = model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    hidden = states[0].shape[-1]
    got_taps = vllm_call["aux"].split(hidden, dim=-1)
    assert len(got_taps) == spec.num_taps, (
        f"vLLM's draft input has {len(got_taps)} slices of {hidden}, spec {spec.label()}"
    )
    from vllm_eagle3.testing.taps import assert_is_tap

    for tap, got in zip(spec.taps, got_taps):
        assert_is_tap(got, states, tap, rel=TAP_REL, where="vLLM's draft input")
    assert vllm_call["input_ids"].tolist() == prompt[1:] + [vllm_call["sampled"][0]]
    assert vllm_call["positions"].tolist() == list(range(len(prompt)))


def test_training_head_equals_vllm_head(vllm_call):
    """The code the head was trained with computes, on vLLM's inputs, vLLM's logits."""
    from vllm_eagle3.reference import Eagle3Draft

    draft = Eagle3Draft.from_dir(DRAFT, target_dir=TARGET).eval()
    with torch.no_grad():
        logits = draft(vllm_call["aux"], input_ids=vllm_call["input_ids"], positions=vllm_call["positions"])
    assert_same_logits("training pipeline (Eagle3Draft)", logits, vllm_call["logits"])


def run_sglang_draft(runner: str, draft: Path, vllm_call: dict, tmp_path: Path) -> dict:
    """SGLang's own draft class for ``draft`` (``sglang_harness/<runner>``) on vLLM's recorded inputs: its record."""
    require_sglang_env()
    inputs, out = tmp_path / "draft_inputs.pt", tmp_path / "sglang_draft.pt"
    torch.save({k: vllm_call[k] for k in ("input_ids", "positions", "aux")}, inputs)
    cmd = [
        str(SGLANG_PY),
        str(HARNESS / runner),
        "--draft",
        str(draft),
        "--target",
        str(TARGET),
        "--inputs",
        str(inputs),
        "--out",
        str(out),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHONPATH"))}
    env.update(SGLANG_USE_CPU_ENGINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0 and out.exists(), (
        f"SGLang draft runner failed (exit {proc.returncode}): "
        f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    record = torch.load(out, weights_only=False)
    assert record["error"] is None, f"{record['error']}\n{record.get('traceback', '')}"
    assert record["sglang_version"] == "0.5.23", record["sglang_version"]
    assert not record["stub_calls"], f"a stubbed sgl_kernel function was called: {record['stub_calls']}"
    return record


def sglang_logits_in_target_vocab(record: dict, draft: Path, vllm_call: dict) -> torch.Tensor:
    """SGLang's draft-vocab logits [T, Vd] scattered into the target vocabulary through the d2t it loaded."""
    from safetensors.torch import load_file

    d2t = load_file(str(draft / "model.safetensors"))["d2t"].long()
    assert torch.equal(record["d2t"].long().cpu(), d2t), "SGLang loaded another d2t than the checkpoint's"
    assert record["draft_input_ids"].tolist() == vllm_call["input_ids"].tolist(), (
        "SGLang's draft read other token ids than vLLM's"
    )
    mapped = torch.full_like(vllm_call["logits"], float("-inf"))
    mapped[:, torch.arange(d2t.numel()) + d2t] = record["logits"].float()
    return mapped


def test_sglang_llama_eagle3_equals_vllm_head(vllm_call, tmp_path):
    """SGLang's own LlamaForCausalLMEagle3 (draft ModelRunner, draft-extend forward) on vLLM's inputs gives vLLM's
    logits, mapped to the target vocabulary through the d2t table SGLang loaded."""
    record = run_sglang_draft("draft_runner.py", DRAFT, vllm_call, tmp_path)
    assert record["model_class"] == "LlamaForCausalLMEagle3", record["model_class"]
    draft_logits = record["logits"]  # [T, draft_vocab], SGLang's lm_head output
    assert_same_logits(
        "SGLang llama_eagle3", sglang_logits_in_target_vocab(record, DRAFT, vllm_call), vllm_call["logits"]
    )
    last = record.get("last_token_logits_sglang")
    if last is not None:  # SGLang's own LogitsProcessor output for the last row equals the hook-computed row
        assert torch.allclose(
            last.float().reshape(-1)[: draft_logits.shape[1]], draft_logits[-1].float(), atol=ATOL, rtol=RTOL
        )


# ------------------------------------------------------------------------------------------------- the MLA head


@pytest.fixture(scope="module")
def mla_vllm_call(prompt, vllm_call, first_draft_call) -> dict:
    """The first draft step of vLLM's first proposal for ``prompt`` with the MLA head (its own engine, started after
    the session's Llama-head engine is gone: ``vllm_call`` is requested first)."""
    call = first_draft_call(TARGET, MLA_DRAFT, SPEC, prompt)
    assert call["draft_classes"] == [MLA_CLASS], f"vLLM's draft model class: {call['draft_classes']}"
    return call


def test_vllm_feeds_the_mla_head_what_it_feeds_the_llama_head(mla_vllm_call, vllm_call):
    """Same spec, same prompt: the MLA head's draft input (aux rows, token ids, positions) is the Llama head's
    (the capture does not depend on the draft class), so the comparisons below start from the trained wiring."""
    assert torch.equal(mla_vllm_call["aux"], vllm_call["aux"]), "the MLA head got other aux rows than the Llama head"
    assert torch.equal(mla_vllm_call["input_ids"], vllm_call["input_ids"])
    assert torch.equal(mla_vllm_call["positions"], vllm_call["positions"])


def test_training_mla_head_equals_vllm_head(mla_vllm_call):
    """The code the MLA head was trained with (naive MLA, fc_norm) computes, on vLLM's inputs, vLLM's logits."""
    from vllm_eagle3.reference import Eagle3Draft

    draft = Eagle3Draft.from_dir(MLA_DRAFT, target_dir=TARGET).eval()
    assert draft.config.arch == "mla" and draft.config.fc_norm and draft.config.norm_output, draft.config
    with torch.no_grad():
        logits = draft(mla_vllm_call["aux"], input_ids=mla_vllm_call["input_ids"], positions=mla_vllm_call["positions"])
    assert_same_logits("training pipeline (Eagle3Draft, mla)", logits, mla_vllm_call["logits"], MLA_ATOL, MLA_RTOL)


def test_sglang_kimi_mla_eagle3_equals_vllm_head(mla_vllm_call, tmp_path):
    """SGLang 0.5.23's own Kimi K2.5 MLA draft (``kimi_k25_eagle3.py``) on vLLM's inputs gives vLLM's logits, and its
    aux output (what it feeds the next draft step) is the POST-norm state, as ``norm_output`` says and as the
    training code feeds it back."""
    from vllm_eagle3.reference import Eagle3Draft

    record = run_sglang_draft("mla_draft_runner.py", MLA_DRAFT, mla_vllm_call, tmp_path)
    assert record["model_class"] == MLA_CLASS and record["model_module"].endswith("kimi_k25_eagle3"), (
        record["model_class"],
        record["model_module"],
    )
    assert_same_logits(
        "SGLang kimi_k25_eagle3",
        sglang_logits_in_target_vocab(record, MLA_DRAFT, mla_vllm_call),
        mla_vllm_call["logits"],
        MLA_ATOL,
        MLA_RTOL,
    )
    assert torch.equal(record["hidden_pre_norm_aux"], record["hidden_post_norm"]), (
        "SGLang's MLA draft feeds back another state than its post-norm output despite norm_output"
    )
    draft = Eagle3Draft.from_dir(MLA_DRAFT, target_dir=TARGET).eval()
    with torch.no_grad():
        ((_, fed_back),) = draft.unroll(
            mla_vllm_call["aux"][None],
            mla_vllm_call["input_ids"][None],
            steps=1,
            positions=mla_vllm_call["positions"][None],
        )
    diff = (fed_back[0] - record["hidden_pre_norm_aux"]).abs().max().item()
    print(f"fed-back state, training code vs SGLang: max abs diff {diff:.3g}")
    assert torch.allclose(fed_back[0], record["hidden_pre_norm_aux"], atol=MLA_ATOL, rtol=MLA_RTOL), diff
