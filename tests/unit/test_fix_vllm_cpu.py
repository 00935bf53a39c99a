"""``vllm-eagle3 fix-vllm-cpu``, the install's second step on vLLM-CPU: it removes exactly the CUDA-linked
torchvision/torchaudio/torchcodec next to a CPU torch, then installs the ``vllm`` CLI hook.

Guards issue 48: a CPU install took four steps to remember (pip install, ``pip uninstall -y torchvision torchaudio
torchcodec``, ``fix-vllm-cli``), one of them in prose only. Stand-in distributions (files on disk); no engine, no pip.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess

import pytest

from vllm_eagle3.tools import fix_vllm_cpu
from vllm_eagle3.tools.serve import vllm_cpu

pytestmark = pytest.mark.unit


class FakeDist:
    def __init__(self, root, version, files: dict[str, bytes]):
        self.root, self.version = root, version
        for name, data in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        self.files = [md.PackagePath(name) for name in files]

    def locate_file(self, f):
        return self.root / f


@pytest.fixture()
def dists(tmp_path, monkeypatch):
    """torch (CPU), a CUDA-linked torchvision, a torchaudio built for the CPU, no torchcodec."""
    found = {
        "torch": FakeDist(tmp_path / "t", "2.13.0+cpu", {"torch/lib/libtorch_cpu.so": b"\x7fELF cpu"}),
        "torchvision": FakeDist(tmp_path / "v", "0.28.0", {"torchvision/_C.so": b"\x7fELF NEEDED libc10_cuda.so"}),
        "torchaudio": FakeDist(tmp_path / "a", "2.11.0+cpu", {"torchaudio/lib/_torchaudio.so": b"\x7fELF libc10.so"}),
    }

    def distribution(name):
        if name not in found:
            raise md.PackageNotFoundError(name)
        return found[name]

    monkeypatch.setattr(md, "distribution", distribution)  # the module both tools read it from
    return found


def test_only_cuda_linked_companions_of_a_cpu_torch_are_named(dists):
    assert fix_vllm_cpu.cuda_linked_companions() == ["torchvision==0.28.0"]
    dists["torch"] = FakeDist(dists["torch"].root, "2.13.0", {"torch/lib/libc10_cuda.so": b"\x7fELF"})
    assert fix_vllm_cpu.cuda_linked_companions() == [], "a CUDA torch keeps its CUDA companions"


def test_fix_removes_them_then_installs_the_cli_hook(dists, monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(vllm_cpu, "is_vllm_cpu", lambda: True)
    monkeypatch.setattr(vllm_cpu, "pth_path", lambda: tmp_path / vllm_cpu.PTH_NAME)
    monkeypatch.setattr(md, "version", lambda name: {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}[name])
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))

    assert fix_vllm_cpu.main(["--check"]) == 1
    assert "torchvision==0.28.0" in capsys.readouterr().out and not calls
    assert fix_vllm_cpu.main([]) == 0
    assert calls == [[fix_vllm_cpu.sys.executable, "-m", "pip", "uninstall", "-y", "torchvision"]]
    assert (tmp_path / vllm_cpu.PTH_NAME).read_text() == vllm_cpu.PTH_LINE
    assert capsys.readouterr().out.splitlines()[-1].startswith("vllm-eagle3: vllm-cpu 0.32.0 ready")
    del dists["torchvision"]  # what pip did
    assert fix_vllm_cpu.main(["--check"]) == 0 and "nothing to fix" in capsys.readouterr().out


def test_nothing_happens_on_a_gpu_install(monkeypatch, capsys):
    monkeypatch.setattr(vllm_cpu, "is_vllm_cpu", lambda: False)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ran a command on a GPU install"))
    assert fix_vllm_cpu.main([]) == 0 and "nothing to do" in capsys.readouterr().out
