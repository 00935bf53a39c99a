"""The miniature's training code runs on CPU at toy scale, learns, and writes checkpoints that reload.

Bugs guarded:
* a target checkpoint that only our loader reads (transformers' own ``save_pretrained`` writes Kimi K2.5
  weights under names neither vLLM nor transformers maps back) -> transformers must load the exported
  folder with no missing/unexpected weights and give the same logits;
* a draft trained on shifted-by-two tokens or on the wrong taps (the incident's class of bug) -> the
  exported head must reload and reproduce its training-time step-1 logits through the vLLM-shaped
  ``forward`` (tokens shifted by ONE, taps in spec order);
* ``labels`` pre-shifted for transformers' causal-LM loss (trains a skip-one objective) -> loss must fall;
* self-distillation data from a KV-cached greedy decoder that drifts from the target's real greedy tokens (a
  cache/position bug) -> the cached decoder must give exactly the tokens of full re-computation;
* a training-speed MoE (every expert on every token) that is not transformers' routed MoE -> a model trained
  with it would compute something else once vLLM serves it: logits and gradients must match;
* a training mix whose rows do not follow ``stdlib_weight`` or a warm-up/stable/decay schedule that does not
  end where a resumed run starts -> measured directly.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from vllm_eagle3.miniature import export, train_draft, train_target  # noqa: E402
from vllm_eagle3.reference import Eagle3Draft  # noqa: E402
from vllm_eagle3.resolve import load_spec_yaml  # noqa: E402

NUM_LAYERS = 3  # toy target: taps embed, 1, 2 play the role of embed, 3, 31 (legacy SGLang ids reach tap L - 1 only)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Train a toy target and draft once on a small folder of real Python sources."""
    root = tmp_path_factory.mktemp("mini")
    src = root / "src"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", src)
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "email", src / "email")
    spec = root / "spec.yaml"
    spec.write_text(f"taps: [embed, 1, 2]\nnum_layers: {NUM_LAYERS}\ndraft_ids_convention: sglang-legacy\n")
    target, draft = root / "target", root / "draft"
    common = ["--roots", str(src), "--heldout-fraction", "0.1", "--device", "cpu", "--seq-len", "32", "--warmup", "2"]
    train_target.main(
        [
            "--out",
            str(target),
            "--num-layers",
            str(NUM_LAYERS),
            "--vocab-size",
            "512",
            "--max-steps",
            "30",
            "--batch",
            "8",
            "--lr",
            "3e-3",
            "--max-chars",
            "400000",
            "--tokenizer-chars",
            "400000",
            "--eval-every",
            "1000",
            "--eval-windows",
            "4",
            *common,
        ]
    )
    train_draft.main(
        [
            "--target",
            str(target),
            "--out",
            str(draft),
            "--spec",
            str(spec),
            "--draft-vocab-size",
            "256",
            "--max-steps",
            "30",
            "--batch",
            "8",
            "--lr",
            "3e-3",
            "--ttt-steps",
            "3",
            "--max-chars",
            "400000",
            "--intermediate-size",
            "64",
            "--greedy-prompts",
            "8",
            "--greedy-prompt-len",
            "8",
            "--greedy-batch",
            "4",
            "--vocab-greedy-weight",
            "0.5",
            *common,
        ]
    )
    return target, draft, spec


def test_target_loss_falls_and_transformers_reloads(toy):
    """Loss falls; the Kimi-layout export loads in transformers' Kimi_K25 class with identical logits."""
    target, _, _ = toy
    log = json.loads((target / "train_log.json").read_text())
    assert log["train"][-1]["loss"] < log["train"][0]["loss"] - 0.5
    cfg = json.loads((target / "config.json").read_text())
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert cfg["media_placeholder_token_id"] == cfg["image_token_id"]
    assert cfg["text_config"]["kv_lora_rank"] + cfg["text_config"]["qk_rope_head_dim"] == 576
    assert "media_proc_cfg" in json.loads((target / "preprocessor_config.json").read_text())
    assert export.check_with_transformers(target) < 1e-4


def test_draft_loss_falls_and_export_reloads(toy):
    """Draft loss falls; the SGLang-layout head reloads and its vLLM-shaped forward equals the trained step 1."""
    target, draft_dir, spec_path = toy
    log = json.loads((draft_dir / "train_log.json").read_text())
    assert log["train"][-1]["loss"] < log["train"][0]["loss"]
    assert log["greedy_sequences"] == 8  # half of every batch came from the target's own greedy continuations
    assert 0.0 < log["draft_vocab_greedy_coverage"] <= 1.0  # the vocabulary was chosen with the greedy tokens
    cfg = json.loads((draft_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [-1, 0, 1]  # taps (0, 1, 2) in SGLang-legacy ids
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 0, 1]
    from safetensors import safe_open

    with safe_open(str(draft_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_slice("fc.weight").get_shape() == [cfg["hidden_size"], 3 * cfg["target_hidden_size"]]
        assert f.get_slice("midlayer.self_attn.q_proj.weight").get_shape()[1] == 2 * cfg["hidden_size"]
    assert {"d2t", "t2d", "norm.weight", "lm_head.weight"} <= names
    assert not any("embed_tokens" in n for n in names)

    spec = load_spec_yaml(spec_path)
    model = export.load_text_model(target)
    draft = Eagle3Draft.from_dir(draft_dir, target_dir=target)
    ids = torch.randint(20, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        taps, _ = train_draft.target_outputs(model, ids, spec)
        step1, _ = draft.unroll(taps, train_draft.shifted(ids), steps=1)[0]
        served = draft(taps[0], input_ids=torch.cat([ids[0, 1:], ids[0, :1]]))  # row i reads token i + 1
    # Rows 0..T-2 see the same shifted tokens; the last row differs only in its (arbitrary) next token.
    assert torch.allclose(draft.to_target_logits(step1)[0, :-1], served[:-1], atol=1e-5)
    outside = ~draft.t2d
    assert torch.isinf(served[:, outside]).all()


@pytest.fixture(scope="module")
def toy_mla(toy, tmp_path_factory):
    """An MLA head (``--arch mla --fc-norm --norm-output``) trained by the same code on the toy target and spec."""
    target, _, spec = toy
    root = tmp_path_factory.mktemp("mla")
    draft = root / "draft-mla"
    train_draft.main(
        [
            "--target",
            str(target),
            "--out",
            str(draft),
            "--spec",
            str(spec),
            "--draft-vocab-size",
            "256",
            "--max-steps",
            "30",
            "--batch",
            "8",
            "--lr",
            "3e-3",
            "--ttt-steps",
            "3",
            "--max-chars",
            "400000",
            "--intermediate-size",
            "64",
            "--arch",
            "mla",
            "--fc-norm",
            "--norm-output",
            "--num-heads",
            "2",
            "--q-lora-rank",
            "32",
            "--roots",
            str(Path(spec).parent / "src"),
            "--heldout-fraction",
            "0.1",
            "--device",
            "cpu",
            "--seq-len",
            "32",
            "--warmup",
            "2",
        ]
    )
    return target, draft, spec


def test_mla_draft_trains_and_exports_the_vllm_sglang_layout(toy_mla):
    """The MLA head (issue 15) trains through the one code path and exports what vLLM's Eagle3DeepseekV2ForCausalLM
    and SGLang's kimi_k25_eagle3.py load: their weight names, 2H-wide MLA down projections, one fc_norm per tap,
    the EAGLE-3.1 flags at the top level (where both engines read them, so no option warning); reloaded, its
    vLLM-shaped forward equals the trained step 1."""
    from vllm_eagle3.checkpoint import draft_option_warnings, draft_readings

    target, draft_dir, spec_path = toy_mla
    log = json.loads((draft_dir / "train_log.json").read_text())
    assert log["train"][-1]["loss"] < log["train"][0]["loss"]
    cfg = json.loads((draft_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and cfg["model_type"] == "deepseek_v2"
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576  # vLLM-CPU's MLA kernel
    assert draft_option_warnings(cfg) == []
    assert [(r.num_taps, dict(r.options)) for r in draft_readings(cfg)] == [
        (3, {"fc_norm": True, "norm_output": True, "norm_before_residual": False}),
        (3, {"fc_norm": True, "norm_output": True}),
    ]
    from safetensors import safe_open

    h = cfg["hidden_size"]
    with safe_open(str(draft_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        shape = lambda n: f.get_slice(n).get_shape()  # noqa: E731
        assert shape("fc.weight") == [h, 3 * h]
        assert shape("midlayer.self_attn.q_a_proj.weight") == [cfg["q_lora_rank"], 2 * h]
        assert shape("midlayer.self_attn.kv_a_proj_with_mqa.weight") == [576, 2 * h]
        assert shape("midlayer.self_attn.kv_b_proj.weight") == [2 * (64 + 64), 512]
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= names
    assert {
        "midlayer.self_attn.q_a_layernorm.weight",
        "midlayer.self_attn.kv_a_layernorm.weight",
        "midlayer.self_attn.o_proj.weight",
        "midlayer.hidden_norm.weight",
        "d2t",
        "t2d",
    } <= names
    assert not any("embed_tokens" in n or n.endswith(".q_proj.weight") for n in names)

    spec = load_spec_yaml(spec_path)
    model = export.load_text_model(target)
    draft = Eagle3Draft.from_dir(draft_dir, target_dir=target)
    assert draft.config.arch == "mla"
    ids = torch.randint(20, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        taps, _ = train_draft.target_outputs(model, ids, spec)
        step1, _ = draft.unroll(taps, train_draft.shifted(ids), steps=1)[0]
        served = draft(taps[0], input_ids=torch.cat([ids[0, 1:], ids[0, :1]]))
    assert torch.allclose(draft.to_target_logits(step1)[0, :-1], served[:-1], atol=1e-5)


def test_norm_output_feeds_the_post_norm_state_to_the_next_step(toy_mla):
    """``norm_output`` (EAGLE-3.1) changes only what later draft steps read: step 1 is the same function, the state
    fed back is the final norm's OUTPUT (unit RMS before the norm weight) instead of its input, and step 2 differs.
    Guards training with one feed-back and serving with the other (the engines read the flag from the config)."""
    import dataclasses

    target, draft_dir, spec_path = toy_mla
    spec = load_spec_yaml(spec_path)
    model = export.load_text_model(target)
    post = Eagle3Draft.from_dir(draft_dir, target_dir=target)
    pre = Eagle3Draft(dataclasses.replace(post.config, norm_output=False))
    pre.load_state_dict(post.state_dict())
    ids = torch.randint(20, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        taps, _ = train_draft.target_outputs(model, ids, spec)
        (l1, fed), (l2, _) = post.unroll(taps, train_draft.shifted(ids), steps=2)
        (m1, fed_pre), (m2, _) = pre.unroll(taps, train_draft.shifted(ids), steps=2)
    assert torch.equal(l1, m1)
    rms = (fed / post.norm.weight).pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3), "the fed-back state is not the post-norm output"
    assert not torch.allclose(fed, fed_pre) and not torch.allclose(l2, m2)


def test_draft_config_refuses_options_the_code_does_not_implement():
    """A head with an EAGLE-3.1 option the training/evaluation code does not compute is refused with its name, not
    evaluated as another network."""
    from vllm_eagle3.reference import DraftConfig

    cfg = json.loads(
        (Path(__file__).resolve().parents[2] / "models" / "kimi-k25-mini-eagle3-mla" / "config.json").read_text()
    )
    assert DraftConfig.from_hf_config(cfg).arch == "mla"
    for opt in ("norm_before_residual", "norm_before_fc"):
        with pytest.raises(ValueError, match=opt):
            DraftConfig.from_hf_config({**cfg, opt: True})
    with pytest.raises(ValueError, match="q_lora_rank"):
        DraftConfig.from_hf_config({**cfg, "q_lora_rank": None})
    with pytest.raises(ValueError, match="not an EAGLE-3 head"):
        DraftConfig.from_hf_config({**cfg, "architectures": ["DeepseekV3ForCausalLM"]})


def test_cached_greedy_decoding_equals_full_recomputation(toy):
    """The self-distillation data (KV-cached greedy decoding) is token-for-token the target's greedy output."""
    from vllm_eagle3.miniature.evaluate import greedy_continue

    target, _, _ = toy
    model = export.load_text_model(target)
    prompts = torch.randint(20, model.config.vocab_size, (3, 6), generator=torch.Generator().manual_seed(1))
    cached = greedy_continue(model, prompts, 10, batch=2, use_cache=True)
    full = greedy_continue(model, prompts, 10, batch=2, use_cache=False)
    assert cached.shape == (3, 16)
    assert torch.equal(cached[:, :6], prompts)
    assert torch.equal(cached, full)


def test_served_walk_visits_anchors_like_a_server():
    """The served-walk simulation advances by accepted + 1 tokens per draft, as vLLM's verify step does."""
    from vllm_eagle3.reference.acceptance import served_walk, walk_summary

    t, f = True, False
    match = torch.tensor([[t, t, f], [f, f, f], [f, f, f], [t, f, f], [t, t, t], [t, t, t]])
    # anchor 0: accepts 2 -> next anchor 3; anchor 3: accepts 1 -> next anchor 5; anchor 5: accepts 3 -> end
    assert served_walk(match, 3) == (3, 6)
    # k = 1: anchor 0 (1) -> 2 (0) -> 3 (1) -> 5 (1) -> end
    assert served_walk(match, 1) == (4, 3)
    summary = walk_summary(torch.stack([match, ~match]), [3])["3"]
    # second sequence (~match): anchor 0: 0 -> 1: accepts 3 -> 5: 0 -> end
    assert summary["per_sequence"] == [[3, 6], [3, 3]]
    assert summary["acceptance_length"] == 1 + 9 / 6


def test_dense_experts_is_the_routed_moe():
    """``use_dense_experts`` computes transformers' routed MoE exactly (forward and gradients)."""
    from vllm_eagle3.miniature.target import TargetShape, new_text_model, text_config_dict, use_dense_experts

    model = new_text_model(text_config_dict(TargetShape(num_layers=3, vocab_size=512), bos_id=0, eos_id=1, pad_id=2))
    ids = torch.randint(13, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    ref = model(input_ids=ids, labels=ids)
    ref.loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    assert use_dense_experts(model) == 2  # layers 1 and 2 are MoE, layer 0 dense
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert torch.allclose(out.logits, ref.logits, atol=1e-5)
    assert ref_grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, p in model.named_parameters():
        if n in ref_grads:
            assert torch.allclose(p.grad, ref_grads[n], atol=1e-6, rtol=1e-4), n


def test_training_mix_rows_and_wsd_schedule():
    """Rows come from the stdlib stream with probability ``stdlib_weight``; ``wsd`` holds lr, then decays to the end."""
    from vllm_eagle3.miniature import data
    from vllm_eagle3.miniature.schedule import lr_at

    mix = data.TrainingMix(torch.zeros(5000, dtype=torch.int32), torch.ones(5000, dtype=torch.int32), 0.25)
    rows = mix.windows(4000, 16, torch.Generator().manual_seed(0))
    share = float((rows[:, 0] == 0).float().mean())
    assert abs(share - 0.25) < 0.03
    only_other = data.TrainingMix(torch.zeros(0, dtype=torch.int32), torch.ones(100, dtype=torch.int32), 0.9)
    assert bool((only_other.windows(8, 16, torch.Generator()) == 1).all())
    assert not data.looks_like_code("x = [" + ", ".join(map(str, range(3000))) + "]\n")
    assert data.looks_like_code("def f(x):\n    return x + 1\n")
    kw = dict(lr=1.0, warmup=10, min_ratio=0.1, schedule="wsd", decay_fraction=0.25)
    assert lr_at(0.0, 0, **kw) == 0.1  # warm-up
    assert lr_at(0.5, 100, **kw) == 1.0 and lr_at(0.75, 100, **kw) == 1.0  # stable until the decay starts
    assert abs(lr_at(1.0, 200, **kw) - 0.1) < 1e-9
    assert lr_at(0.9, 200, **{**kw, "decay_fraction": 0.0}) == 1.0  # no decay: a resumable run ends at full lr


def test_init_from_continues_the_given_weights(toy, tmp_path):
    """``--init-from`` (continue a shipped target with a fresh optimizer) must start from that folder's weights, not
    from a fresh init: with lr 0 one step writes back exactly the weights it read (bf16 files both ways)."""
    target, _, _ = toy
    out = tmp_path / "cont"
    src = tmp_path / "src"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", src)
    train_target.main(
        [
            "--out",
            str(out),
            "--init-from",
            str(target),
            "--tokenizer-from",
            str(target),
            "--num-layers",
            str(NUM_LAYERS),
            "--vocab-size",
            "512",
            "--max-steps",
            "1",
            "--batch",
            "2",
            "--lr",
            "0",
            "--warmup",
            "0",
            "--eval-every",
            "1000",
            "--eval-windows",
            "2",
            "--roots",
            str(src),
            "--heldout-fraction",
            "0.1",
            "--device",
            "cpu",
            "--seq-len",
            "32",
            "--max-chars",
            "100000",
        ]
    )
    a, b = export.read_kimi_state(target), export.read_kimi_state(out)
    text = [k for k in a if k.startswith("language_model.")]
    assert text and all(torch.equal(a[k], b[k]) for k in text)


def test_fast_step_is_the_plain_step():
    """step.train_step (no KV cache during training) computes the same loss as transformers' default call, and the
    step CLI times a configuration on CPU (compile mode none)."""
    from dataclasses import replace

    from vllm_eagle3.miniature import step
    from vllm_eagle3.miniature.target import TargetShape, new_text_model, text_config_dict

    shape = replace(TargetShape(), num_layers=2, vocab_size=512)
    model = new_text_model(text_config_dict(shape, bos_id=0, eos_id=1, pad_id=2)).train()
    step.prepare_for_training(model, "none", "dense")
    ids = torch.randint(13, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids, labels=ids).loss
    opt = step.new_optimizer(model, 0.0, 0.0, torch.device("cpu"))
    assert torch.allclose(step.train_step(model, opt, ids, amp=False), ref, atol=1e-6)
    r = step.time_config(2, 16, "none", 1, 1, 2, torch.device("cpu"))
    assert r["tok_per_s"] > 0 and r["compile"] == "none"


def test_naive_mla_equals_the_absorbed_form_the_engines_run():
    """The training code runs MLA naively (per-head keys/values from ``kv_b_proj``); vLLM's and SGLang's MLA backends
    run the absorbed form (``W_kc`` folded into the query, scores and values in the kv_lora_rank-wide latent space,
    ``W_vc`` applied after). Same function: on the shipped MLA head's weights, float64 everywhere except the softmax,
    which the training code takes in float32 as vLLM does: the outputs (magnitude ~10) agree to 1e-5 (measured 9.3e-7,
    float32 softmax rounding); a wrong formula (rope on the wrong dims, a swapped k/v slice of kv_b_proj) is O(1).
    A mismatch in the engine parity test is then the engines', not the formula's."""
    from vllm_eagle3.reference.attention import apply_rope_interleaved, rope_cos_sin

    head = Path(__file__).resolve().parents[2] / "models" / "kimi-k25-mini-eagle3-mla"
    attn = Eagle3Draft.from_dir(head).double().midlayer.self_attn
    c = attn.c
    h, nope, rope, dv, r = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    t = 9
    x = torch.randn(1, t, c.attn_input_size, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    pos = torch.arange(t)[None]
    q, k, v = attn.qkv(x, pos)
    naive = attn.attend(q, k, v, [])  # [1, T, H]

    kv_c, k_pe = attn.kv_a_proj_with_mqa(x).split([r, rope], dim=-1)
    latent = attn.kv_a_layernorm(kv_c)[0]  # [T, r]: what the engines cache (with k_pe)
    w = attn.kv_b_proj.weight.view(h, nope + dv, r)
    w_kc, w_vc = w[:, :nope], w[:, nope:]  # [h, nope, r], [h, dv, r]
    q_nope, q_pe = q[0].split([nope, rope], dim=-1)  # [h, T, .] (q_pe already rotated)
    cos, sin = rope_cos_sin(pos, rope, c.rope_theta, x.dtype)
    k_pe = apply_rope_interleaved(k_pe[:, None], cos, sin)[0, 0]  # [T, rope]
    q_lat = torch.einsum("htn,hnr->htr", q_nope, w_kc)
    scores = (torch.einsum("htr,sr->hts", q_lat, latent) + torch.einsum("htd,sd->hts", q_pe, k_pe)) * attn.scale
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    out_lat = torch.einsum("hts,sr->htr", scores.softmax(-1), latent)
    out = torch.einsum("htr,hvr->thv", out_lat, w_vc).reshape(1, t, h * dv)
    absorbed = attn.o_proj(out)
    assert torch.allclose(naive, absorbed, atol=1e-5, rtol=0), (naive - absorbed).abs().max()


def test_draft_vocab_blends_text_and_greedy_frequencies():
    """Weight 0 picks the text's most frequent ids; weight 1 the greedy tokens'; coverages are exact fractions."""
    text = torch.tensor([0, 0, 0, 1, 1, 2])  # text: 0 > 1 > 2
    greedy = torch.tensor([3, 3, 3, 2])  # the target mostly writes 3, which text never has
    ids, text_cov, greedy_cov = train_draft.choose_draft_vocab(text, 5, 2)
    assert ids.tolist() == [0, 1] and text_cov == 5 / 6 and greedy_cov != greedy_cov  # NaN: no greedy tokens given
    ids, text_cov, greedy_cov = train_draft.choose_draft_vocab(text, 5, 2, greedy, 1.0)
    assert ids.tolist() == [2, 3] and text_cov == 1 / 6 and greedy_cov == 1.0
    ids, _, greedy_cov = train_draft.choose_draft_vocab(text, 5, 2, greedy, 0.5)
    assert ids.tolist() == [0, 3] and greedy_cov == 0.75  # 0: 0.25, 3: 0.375 beat 1: 1/6 and 2: 1/12 + 1/8
    with pytest.raises(ValueError, match="needs the greedy tokens"):
        train_draft.choose_draft_vocab(text, 5, 2, None, 0.5)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--vocab-greedy-weight", "1.5", "--greedy-prompts", "4"], "--vocab-greedy-weight must lie in [0, 1]"),
        (["--vocab-greedy-weight", "0.5"], "--vocab-greedy-weight needs --greedy-prompts"),
    ],
)
def test_vocab_greedy_weight_bad_input_is_refused_before_any_work(tmp_path, capsys, extra, message):
    """A weight outside [0, 1], or one with no greedy tokens to weigh, is a one-line usage error (exit 2) that names
    the flag and the fix, before the target is loaded (the target path does not even exist here)."""
    with pytest.raises(SystemExit) as exc:
        train_draft.main(
            ["--target", str(tmp_path / "none"), "--out", str(tmp_path / "out"), "--max-steps", "1", *extra]
        )
    assert exc.value.code == 2 and message in capsys.readouterr().err
