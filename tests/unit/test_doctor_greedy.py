"""``vllm-eagle3 doctor --mode greedy`` (transformers) records the target's taps and logits while the target writes
its greedy continuation (:func:`vllm_eagle3.tools.doctor.measure.greedy_run`: one KV-cached decode of all prompts, one
torch thread) instead of decoding first and running a second forward over the sequences.

Guards: a recorded run that is not the target's forward over the sequences it wrote (a tap or logit row shifted by
the prefill/decode seam, tap L taken post-norm, a decode step fed the wrong token), sequences that are not the
run's own greedy tokens, and torch's thread count left changed for the rest of the process. The whole mode on the
shipped pair: tests/e2e/test_doctor.py::test_doctor_greedy_mode_on_the_shipped_head.

Tolerance: KV-cached decode and a full forward compute the same float32 function with the attention sums in
another order; on this random 4-layer model they agree to 1.6e-6 (taps, relative to each tap's largest value) and
8.1e-6 (logits up to ~4.4, absolute), so ``1e-4`` (relative on taps, absolute on logits) leaves room for other BLAS
builds while a shifted row or a wrong token (O(1) changes) cannot pass.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.unit

TOL = 1e-4


def test_greedy_run_is_the_forward_over_its_own_greedy_sequences(tmp_path):
    from vllm_eagle3.testing.tiny import build_deepseek_v3
    from vllm_eagle3.tools.doctor.measure import greedy_run, load_target, run_target

    model = load_target(build_deepseek_v3(tmp_path / "target", num_layers=4, initializer_range=0.1))
    vocab = model.config.vocab_size
    prompts = torch.randint(3, vocab, (3, 8), generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    run = greedy_run(model, prompts, 12)
    assert torch.get_num_threads() == threads
    assert run.input_ids.shape == (3, 20) and torch.equal(run.input_ids[:, :8], prompts)
    assert run.taps.shape[:3] == (5, 3, 20) and run.logits.shape == (3, 20, vocab)
    # Every written token is the argmax of the recorded row before it: the target's own greedy continuation.
    assert torch.equal(run.input_ids[:, 8:], run.logits[:, 7:-1].argmax(-1))
    ref = run_target(model, run.input_ids)
    for k in range(run.taps.shape[0]):
        rel = ((run.taps[k] - ref.taps[k]).abs().max() / ref.taps[k].abs().max()).item()
        assert rel < TOL, f"tap {k}: recorded while decoding vs one forward: relative difference {rel:.3g}"
    diff = (run.logits - ref.logits).abs().max().item()
    assert diff < TOL, f"logits recorded while decoding vs one forward: max abs difference {diff:.3g}"
    assert torch.equal(run.embed_weight, ref.embed_weight)
