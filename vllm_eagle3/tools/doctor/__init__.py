"""``vllm-eagle3 doctor``: how much acceptance does the wiring I serve lose against the best one?

Data flow position: offline, on CPU, no engine. It runs the TARGET once on text it did not train on (transformers,
float32, ``output_hidden_states=True``: tap k = ``hidden_states[k]``, see :mod:`vllm_eagle3.spec`), screens every
candidate wiring on the draft's first step, drafts chains of up to 5 tokens for the configured wiring, the engines'
readings of the draft config and the best screened candidates exactly as vLLM's proposer does
(:mod:`vllm_eagle3.tools.doctor.measure`), and compares the configured wiring with the best one by acceptance length at
k = the served ``num_speculative_tokens`` and position-0 acceptance, paired on the same anchors, with paired
cluster-bootstrap intervals (:mod:`vllm_eagle3.tools.doctor.stats`, which states the method and the tolerances).

``--engine vllm`` runs the target in the served engine instead (:mod:`vllm_eagle3.tools.doctor.engine`): ONE offline
vLLM start with this plugin capturing every tap the candidates need, the engine's own taps and logits; the same
candidates, chains and statistics are scored on them (``--mode greedy``: the engine also writes the continuations).

Verdict per configured wiring (the words of :mod:`vllm_eagle3.verdicts`): ok (exit 0), costs x% (3), wrong (4),
undecided or pending with the text needed (5), no wiring works (6); 1 = bad input (one line naming the fix). Config
lines to adopt are printed only for a wiring that is significantly better than the configured one by more than the
tolerance.

    vllm-eagle3 doctor --target models/kimi-k25-mini --draft models/kimi-k25-mini-eagle3 \\
        --capture-spec configs/kimi_k25_eagle3.yaml

Modules: ``diagnose.py`` (the measurement), ``cli.py`` (the command and its report), ``wirings.py`` (candidates,
the target run, chains), ``stats.py`` (paired bootstrap, verdicts), ``engine.py`` (``--engine vllm``).
"""

from .cli import main, render
from .diagnose import (
    CHAINED,
    DEFAULT_K,
    MAX_TOKENS,
    PROMPT_LEN,
    WINDOW,
    Diagnosis,
    Measured,
    configured_wirings,
    diagnose,
    engine_taps,
    measure_hf,
    measure_vllm,
    text_tokens,
)
from .measure import encode

__all__ = [
    "CHAINED",
    "DEFAULT_K",
    "MAX_TOKENS",
    "PROMPT_LEN",
    "WINDOW",
    "Diagnosis",
    "Measured",
    "configured_wirings",
    "diagnose",
    "encode",
    "engine_taps",
    "main",
    "measure_hf",
    "measure_vllm",
    "render",
    "text_tokens",
]
