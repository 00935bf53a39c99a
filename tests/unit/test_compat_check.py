"""``make compat``'s own logic, without a wheel: a body hash ignores layout, an unreviewed hash fails, the docs'
serve commands are read as bash would run them, and ``vllm-eagle3 serve`` argv becomes the vLLM argv it hands on.

Guards issue 46 item 5 (bodies of wrapped functions unchecked, DEPLOYMENT.md's commands never parsed): these are the
parts of the check that decide whether a changed body or a broken command can slip through. No download, no vLLM.
"""

from __future__ import annotations

import ast
import json

import pytest

from vllm_eagle3.tools import compat_check, compat_flags
from vllm_eagle3.tools.compat_source import body_hash
from vllm_eagle3.tools.compat_table import OVERRIDE, RELIED, WRAP, relied

pytestmark = pytest.mark.unit


def fn(src: str) -> ast.FunctionDef:
    return ast.parse(src).body[0]


def test_body_hash_is_of_the_code_not_its_layout():
    a = fn("def f(x):\n    '''Doc.'''\n    return x + 1  # why\n")
    b = fn("def f(x):\n    '''Other doc.'''\n\n    return (x +\n            1)\n")
    assert body_hash(a) == body_hash(b)
    assert body_hash(a) != body_hash(fn("def f(x):\n    return x + 2\n"))


def test_a_body_not_reviewed_in_the_table_fails():
    row = next(r for r in RELIED if r.use == WRAP and r.body)
    reviewed = next(iter(row.body))
    res = {
        "entries": [
            {"module": row.module, "name": row.name, "status": "ok", "body_sha": sha}
            for sha in (reviewed, "0123456789ab")
        ]
    }
    compat_check.judge_bodies(res)
    ok, changed = res["entries"]
    assert ok["status"] == "ok" and ok["body"] == f"reviewed: {row.body[reviewed]}"
    assert changed["status"] == "body not reviewed" and "--diff " + f"{row.module}:{row.name}" in changed["detail"]


def test_wrapped_and_overridden_rows_are_always_hashed():
    assert relied("m", "f", why="w", use=WRAP).hashed and relied("m", "f", why="w", use=OVERRIDE).hashed
    assert not relied("m", "f", why="w").hashed and relied("m", "f", why="w", body={}).hashed
    with pytest.raises(ValueError, match="12-hex hash"):
        relied("m", "f", why="w", use=WRAP, body={"abc": "read it"})
    with pytest.raises(ValueError, match="12-hex hash"):
        relied("m", "f", why="w", use=WRAP, body={"0123456789ab": " "})


def test_doc_commands_are_read_as_bash_runs_them():
    """``$SPEC`` set in one block expands in the next ones, continuation lines join, and each command's place is the
    line it starts on."""
    commands = compat_flags.doc_commands()
    lines = compat_flags.DOC.read_text().splitlines()
    for c in commands:
        line = lines[int(c["where"].split(":")[1]) - 1]
        assert line.lstrip("`").startswith(" ".join(c["argv"][:2])) or f"`{' '.join(c['argv'][:2])}" in line, c
    spec = [c for c in commands if "--additional-config" in c["argv"]]
    assert len(spec) >= 5
    for c in spec:
        given = json.loads(c["argv"][c["argv"].index("--additional-config") + 1])
        assert given["vllm_eagle3"]["capture_spec"]["taps"] == ["embed", 3, 31]


def test_vllm_eagle3_serve_argv_becomes_what_vllm_serve_receives():
    argv = [
        "vllm-eagle3",
        "serve",
        "moonshotai/Kimi-K2.5",
        "--capture-spec",
        "configs/kimi_k25_eagle3.yaml",
        "--tensor-parallel-size",
        "8",
    ]
    out = compat_flags.vllm_argv(argv)
    assert out[:2] == ["serve", "moonshotai/Kimi-K2.5"] and "--capture-spec" not in out
    extra = json.loads(out[out.index("--additional-config") + 1])
    assert extra["vllm_eagle3"]["capture_spec"]["taps"] == ["embed", 3, 31]
    assert compat_flags.vllm_argv(["vllm", "serve", "m", "--port", "1"]) == ["serve", "m", "--port", "1"]
