"""Run SGLang 0.5.23's own MLA EAGLE-3 draft (``kimi_k25_eagle3.py`` ``Eagle3DeepseekV2ForCausalLM``) for one
draft-extend forward; save its logits. Same driver, arguments and output as ``draft_runner.py`` (read its docstring),
with the two differences an MLA draft needs on SGLang's CPU path:

1. ``shims.route_torch_native_to_mla()``: the draft layer's ``DeepseekV2AttentionMLA`` (``deepseek_v2.py``) picks its
   forward through DeepSeek's ``AttentionBackendRegistry``, which has no ``torch_native`` entry; the shim registers
   SGLang's own MLA dispatch for it (the target-side harness does the same, ``runner.py``).
2. The draft's config is given a YaRN rope with factor 1.0 (``runner.YARN_IDENTITY``), in a copy of the draft folder
   (config rewritten, weights linked): SGLang's CPU RoPE implements DeepSeek-YaRN only ("Only deepseek_yarn is
   supported for CPU for now"), and YaRN with factor 1.0 is plain RoPE (no frequency interpolated, mscale 1, the
   attention scale unchanged). The comparison with vLLM and the training code, which run the shipped config's plain
   rope, is what proves it changes nothing.
3. ``torch.cuda.synchronize`` is a no-op when torch has no CUDA: SGLang's ``set_embed`` (``kimi_k25_eagle3.py``,
   after sharing the target's embedding with the draft) calls it unconditionally, which raises "Torch not compiled
   with CUDA enabled" on CPU; there is nothing to wait for there. (``torch.cuda.empty_cache`` is already a no-op.)

Executed with ``.venv-sglang/bin/python``; never imported by the main test venv.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def yarn_identity_copy(draft: Path, out: Path) -> Path:
    """``draft`` with its rope replaced by YaRN factor 1.0 (same theta); weights symlinked, not copied."""
    import runner

    cfg = json.loads((draft / "config.json").read_text())
    params = cfg.get("rope_parameters") or {}
    if params.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise SystemExit(
            f"{draft}: rope {params or cfg.get('rope_scaling')} is not plain RoPE; this harness only "
            "rewrites plain RoPE into its YaRN factor-1 equivalent"
        )
    yarn = dict(
        runner.YARN_IDENTITY,
        rope_theta=params.get("rope_theta", cfg.get("rope_theta", 10000.0)),
        original_max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
    )
    cfg["rope_parameters"] = yarn
    cfg["rope_scaling"] = yarn
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in draft.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f.resolve())
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, str(HERE))
    import shims

    install = shims.install

    def install_with_mla_route() -> None:
        install()
        shims.route_torch_native_to_mla()
        import torch

        if not torch.cuda.is_available():
            torch.cuda.synchronize = lambda *args, **kwargs: None

    shims.install = install_with_mla_route
    import draft_runner

    i = argv.index("--draft") + 1
    with tempfile.TemporaryDirectory(prefix="mla-draft-") as tmp:
        argv[i] = str(yarn_identity_copy(Path(argv[i]).resolve(), Path(tmp) / Path(argv[i]).name))
        return draft_runner.main(argv)


if __name__ == "__main__":
    sys.exit(main())
