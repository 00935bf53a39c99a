"""The reference EAGLE-3 head in plain PyTorch, computing exactly what vLLM's draft classes compute.

Data flow position: the draft side, outside any engine: taps ``cat([tap 0, tap 3, tap 31])`` -> [fc_norm] -> fc ->
one decoder layer -> norm -> lm_head (draft vocab) -> d2t. Used by the miniature's trainer (``miniature/``), by the
wiring doctor (``tools/doctor/``) and by the parity tests; it imports neither.

- ``config.py``: ``DraftConfig`` (shape, architecture ``llama`` / ``mla``, EAGLE-3.1 options) and folder constants;
- ``attention.py``: RMSNorm, rotary embeddings, Llama and MLA attention;
- ``core.py``: ``Eagle3Draft`` (the head, its chained drafting, loading and saving a draft folder);
- ``teacher.py``: the target's taps and logits as the head is trained and scored on them;
- ``acceptance.py``: chains drafted as vLLM's proposer drafts them, scored as a server scores them.
"""

from .attention import DraftAttention, MLAAttention, RMSNorm, apply_rope, apply_rope_interleaved, rope_cos_sin
from .config import ARCHITECTURES, MODEL_TYPES, UNSUPPORTED_OPTIONS, WEIGHTS_FILE, DraftConfig
from .core import DraftLayer, DraftMLP, Eagle3Draft, load_target_embedding

__all__ = [
    "ARCHITECTURES",
    "MODEL_TYPES",
    "UNSUPPORTED_OPTIONS",
    "WEIGHTS_FILE",
    "DraftAttention",
    "DraftConfig",
    "DraftLayer",
    "DraftMLP",
    "Eagle3Draft",
    "MLAAttention",
    "RMSNorm",
    "apply_rope",
    "apply_rope_interleaved",
    "load_target_embedding",
    "rope_cos_sin",
]
