"""A miniature Kimi K2.5 and its EAGLE-3 head, trained on real Python source text.

Data flow (each step is one module, each module a CLI with ``--help``)::

    data.py         Python sources -> train / held-out file split -> token stream
    tokenizer.py    byte-level BPE with Kimi's chat and media tokens
    target.py       the 61-layer DeepSeek-V3 (MLA + MoE) text model and its Kimi K2.5 wrapper config
    train_target.py trains the text model; writes the Kimi checkpoint (export.py)
    export.py       HF in-memory names <-> the original Kimi K2.5 checkpoint layout that vLLM and
                    transformers both load; tiny random vision tower; preprocessor config
    draft.py        the EAGLE-3 head, a plain-PyTorch copy of vLLM's ``llama_eagle3.py`` forward,
                    with the SGLang/SpecForge export layout (``midlayer.*``, ``fc``, ``d2t``, ``t2d``)
    train_draft.py  distils the target's greedy next token into the head from taps
                    ``cat([embed, 3, 31])`` with EAGLE-3's training-time test (unrolled steps)
    evaluate.py     perplexity, teacher-forced top-1 and simulated chain acceptance (k = 1..5)

The shipped artifacts live in ``models/kimi-k25-mini`` and ``models/kimi-k25-mini-eagle3``.
"""
