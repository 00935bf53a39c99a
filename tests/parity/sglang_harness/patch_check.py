"""Exercise ``vllm_eagle3/model_patches/sglang_embed_tap.py`` against the installed SGLang (run with
``.venv-sglang/bin/python``).

Where this sits: support for ``tests/parity/test_sglang_patch.py``. The patch's effect on a real model's capture
(-1 -> the embedding, +1 everywhere) is checked tensor for tensor by ``test_sglang_parity.py``; this script checks
the patch's own contract on SGLang's real class: version guard, idempotence, the record, and that it
replaces exactly ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` (which DeepseekV3ForCausalLM and KimiK25's
language model inherit), plus ``DeepseekV2Model.forward`` on the versions whose capture loop cannot hold index 0
(``EMBED_FORWARD_VERSIONS``, 0.5.12.post1) and nothing else. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    sys.path.insert(0, str(HERE))
    import shims

    shims.install()
    sys.path.insert(0, str(REPO))
    import sglang
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV2Model, DeepseekV3ForCausalLM

    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import sglang_embed_tap as patch

    out: dict = {"sglang_version": sglang.__version__}
    original = DeepseekV2ForCausalLM.set_eagle3_layers_to_capture
    original_forward = DeepseekV2Model.forward
    out["applied_before"] = dict(patch.APPLIED)

    real_version = sglang.__version__
    sglang.__version__ = "0.5.22"
    try:
        patch.apply()
        out["guard_error"] = None
    except model_patches.PatchVersionError as exc:
        out["guard_error"] = str(exc)
    finally:
        sglang.__version__ = real_version
    out["patched_after_refusal"] = (
        DeepseekV2ForCausalLM.set_eagle3_layers_to_capture is not original
        or DeepseekV2Model.forward is not original_forward
    )

    first = patch.apply()
    replaced = DeepseekV2ForCausalLM.set_eagle3_layers_to_capture
    forward = DeepseekV2Model.forward
    second = patch.apply()
    out.update(
        record=first,
        idempotent=second == first and DeepseekV2ForCausalLM.set_eagle3_layers_to_capture is replaced,
        replaced_method=replaced is not original,
        forward_wrapped=forward is not original_forward,
        forward_idempotent=DeepseekV2Model.forward is forward,
        v3_inherits=DeepseekV3ForCausalLM.set_eagle3_layers_to_capture is replaced,
        applied=sorted(patch.APPLIED),
        details=patch.APPLIED.get(patch.PATCH_NAME),
        applied_patches=model_patches.applied_patches(),
        replacement_qualname=replaced.__qualname__,
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
