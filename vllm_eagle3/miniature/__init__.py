"""A miniature Kimi K2.5 and its EAGLE-3 head, trained on real Python source text.

Data flow (one module per step; data, tokenizer, target, the trainers, export and evaluate are CLIs with ``--help``)::

    data.py         Python sources -> train / held-out file split -> token stream
    tokenizer.py    byte-level BPE with Kimi's chat and media tokens
    target.py       the 61-layer DeepSeek-V3 (MLA + MoE) text model and its Kimi K2.5 wrapper config
    schedule.py     learning-rate schedules of both trainers (cosine; warm-up/stable/decay for resumed runs)
    step.py         the target's training step (no KV cache, dense MoE, torch.compile per layer) and a CLI timing it
    train_target.py trains the text model (or continues one, --init-from); writes the Kimi checkpoint (export.py)
    export.py       HF in-memory names <-> the original Kimi K2.5 checkpoint layout that vLLM and
                    transformers both load; tiny random vision tower; preprocessor config
    train_draft.py  distils the target's greedy next token into the head from taps
                    ``cat([embed, 3, 31])`` with EAGLE-3's training-time test (unrolled steps)
    evaluate.py     perplexity, teacher-forced top-1 and simulated acceptance (k = 1..5) -> eval.json

The head itself, what the target hands it and its simulated acceptance are ``vllm_eagle3/reference/`` (the wiring
doctor uses them too): a plain-PyTorch copy of vLLM's draft forward, ``llama_eagle3.py`` or, with ``arch="mla"``,
``deepseek_eagle3.py`` (EAGLE-3.1 ``fc_norm`` / ``norm_output``), in the SGLang/SpecForge export layout.

The shipped artifacts live in ``models/kimi-k25-mini`` and its heads ``models/kimi-k25-mini-eagle3*`` (Llama-style
default, ``-taps-3-31-59``, ``-4tap`` on four taps, ``-mla``).
"""
