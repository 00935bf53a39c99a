"""A wheel built from the clone installs and works away from it: the static commands and ``serve --help``.

Guards issue 40: the README's install line named a package no index has; a wheel's ``tools.REPO`` pointed into
site-packages (so the commands needing the bundled miniature looked for ``models/`` there without saying so); the
patches installed as the generic top-level package ``model_patches``. Builds the wheel from a copy of the sources
(``pip wheel --no-deps``: the clone gets no build/ folder), installs it with ``--no-deps`` into a fresh venv outside
the repository whose dependencies come from this venv's site-packages through a ``.pth`` line (offline, seconds;
``.pth`` files there, such as the editable install's finder, are not run, so the clone cannot be imported), and runs
the console script from another folder; then into a second venv holding only pyproject's base dependencies, where the
base commands must run (issue 48). No engine starts.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
TARGET, DRAFT = REPO / "models" / "kimi-k25-mini", REPO / "models" / "kimi-k25-mini-eagle3"
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin folder, environment, a folder away from the clone) with the wheel installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "vllm_eagle3", src / "vllm_eagle3", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EAGLE3_HOME", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (tmp / "dist").glob("vllm_eagle3-*.whl")

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [*pip, "--python", str(py), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    away = tmp / "elsewhere"
    away.mkdir()
    return venv / "bin", env, away, wheel, Path(purelib)


def run(installed, *args: str) -> subprocess.CompletedProcess:
    bin_dir, env, away, _, _ = installed
    return subprocess.run(
        [str(bin_dir / "vllm-eagle3"), *args], cwd=away, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_wheel_is_what_gets_imported(installed):
    """Without this the other tests could pass on the clone (an editable install) rather than on the wheel."""
    bin_dir, env, away, wheel, purelib = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "vllm_eagle3/model_patches/vllm_plugin.py" in names and not any(
        n.startswith("model_patches/") for n in names
    ), names
    r = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import vllm_eagle3, vllm_eagle3.model_patches as p, "
            "vllm_eagle3.tools as t; print(vllm_eagle3.__file__); print(p.__file__); "
            "print(t.REPO); print(t.REPO_SOURCE)",
        ],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    package, patches, repo, source = r.stdout.splitlines()
    assert Path(package).is_relative_to(purelib) and Path(patches).is_relative_to(purelib), r.stdout
    assert Path(repo) == away and "installed from a wheel" in source, r.stdout


def test_static_commands_work_away_from_the_clone(installed):
    """conventions, resolve, inspect and convert given the bundled model's paths explicitly, and serve --help."""
    r = run(installed, "conventions", "--ids=-1,2,30")
    assert r.returncode == 0 and "sglang-legacy" in r.stdout and "taps [embed, 3, 31]" in r.stdout, r.stdout + r.stderr

    paths = ["--target", str(TARGET), "--draft", str(DRAFT), "--capture-spec", str(SPEC)]
    r = run(installed, "resolve", *paths)
    assert r.returncode == 0, r.stderr
    assert "capturing taps [embed, 3, 31]" in r.stdout and "vllm           [0, 3, 31]" in r.stdout, r.stdout

    r = run(installed, "inspect", *paths)
    assert r.returncode == 0, r.stderr
    assert "fc fan-in 384" in r.stdout and "resolved: vllm-eagle3: capturing taps [embed, 3, 31]" in r.stdout

    r = run(
        installed,
        "convert",
        "--from",
        "sglang-legacy",
        "--to",
        "vllm",
        "--num-layers",
        "61",
        str(DRAFT / "config.json"),
    )
    assert r.returncode == 0, r.stderr
    assert "taps [embed, 3, 31] -> vllm ids [0, 3, 31]" in r.stderr + r.stdout, r.stdout + r.stderr

    r = run(installed, "serve", "--help")
    assert r.returncode == 0 and "--capture-spec" in r.stdout, r.stdout + r.stderr

    r = run(installed, "--help")
    assert r.returncode == 0 and 'pip install ".[cpu]"' in r.stdout, r.stdout


def test_bundled_defaults_say_where_they_look(installed):
    """A wheel has no models/: demo refuses in one line naming the folder it looked in and EAGLE3_HOME."""
    bin_dir, env, away, _, _ = installed
    r = run(installed, "demo")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and str(away) in lines[0] and "EAGLE3_HOME" in lines[0], r.stderr

    r = subprocess.run(
        [str(bin_dir / "python"), "-c", "import vllm_eagle3.tools as t; print(t.REPO)"],
        cwd=away,
        env={**env, "EAGLE3_HOME": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.strip() == str(REPO), r.stdout + r.stderr


def base_distributions() -> list[importlib.metadata.Distribution]:
    """pyproject's base dependencies and what they require in turn (no extras), as installed here."""
    todo = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    found: dict[str, importlib.metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        if req.name.lower() in found or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        dist = found[req.name.lower()] = importlib.metadata.distribution(req.name)
        todo += [Requirement(r) for r in dist.requires or []]
    return list(found.values())


@pytest.fixture(scope="module")
def base_only(installed, tmp_path_factory):
    """The wheel installed with --no-deps into a venv holding nothing else but the declared base dependencies (their
    installed files copied from this venv: offline, and exactly what `pip install vllm-eagle3` would add)."""
    _, env, away, wheel, _ = installed
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for dist in base_distributions():
        for f in dist.files or []:
            src = Path(dist.locate_file(f))
            if ".." not in f.parts and "__pycache__" not in f.parts and src.is_file():
                (purelib / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, purelib / f)
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return venv / "bin", env, away


def test_base_install_runs_the_base_commands(base_only):
    """Issue 48: the base install declared transformers, safetensors, openai and tqdm, which the base commands never
    import. With only pyproject's base dependencies, resolve, inspect, convert and conventions run; the engine's
    packages are really absent there."""
    bin_dir, env, away = base_only
    listed = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import importlib.metadata as m; print(sorted(d.metadata['Name'].lower() for d in m.distributions()))",
        ],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.stdout.strip() == str(
        sorted(["vllm-eagle3"] + [d.metadata["Name"].lower() for d in base_distributions()])
    ), listed
    r = subprocess.run(
        [str(bin_dir / "python"), "-c", "import transformers"],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "No module named 'transformers'" in r.stderr, r.stderr
    paths = ["--target", str(TARGET), "--draft", str(DRAFT), "--capture-spec", str(SPEC)]
    for args, expected in [
        (["resolve", *paths], "vllm           [0, 3, 31]"),
        (["inspect", *paths], "fc fan-in 384"),
        (
            ["convert", "--from", "sglang-legacy", "--to", "vllm", "--num-layers", "61", str(DRAFT / "config.json")],
            "taps [embed, 3, 31] -> vllm ids [0, 3, 31]",
        ),
        (["conventions", "--ids=-1,2,30"], "taps [embed, 3, 31]"),
    ]:
        r = subprocess.run(
            [str(bin_dir / "vllm-eagle3"), *args], cwd=away, env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0 and expected in r.stdout + r.stderr, (args, r.stdout, r.stderr)
