"""Where live k starts: the k per batch size measured on this kind of host for this draft, when the project has one.

Data flow position: read once per engine by :func:`vllm_eagle3.live_k_vllm.attach`, before the first step. A table
written in a serve config was measured on one machine (the shipped one on an Intel Xeon with AMX); on another kind of
host its k can be wrong by more than one, and live k then spends its first sweeps getting away from it. So
``configs/live_k_start.yaml`` keeps, per draft (the speculative model's folder name) and per host kind (CPU model and
widest vector ISA, as every results file names it: ``amd-epyc-avx512``), the table that kind of host was measured to
want, with what measured it. An engine on a listed host kind starts every bucket from that table and says so at
start-up, naming the measurement; any other host starts from the serve config's table and says that it was written in
the config, not measured on this host kind. Live k measures and moves from either start; a listed table also starts
each bucket settled (neighbour probes only) instead of sweeping every k (:class:`vllm_eagle3.live_k.LiveK`'s
``measured_start``). Off with ``live_k: {host_table: false}``.

The file, one entry per measured (draft, host kind)::

    kimi-k25-mini-eagle3:
      amd-epyc-avx512:
        table: [[1, 8, 5], [9, 4096, 3]]     # [first batch size, last, k], as num_speculative_tokens_per_batch_size
        measured: what measured it (results file, date, commit)
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

START_FILE = "configs/live_k_start.yaml"
ISA_FLAGS = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


class StartTableError(ValueError):
    """``configs/live_k_start.yaml`` cannot be used; the message names the entry and the fix."""


def host_kind(cpu: str, flags: Iterable[str], emulated: bool = False) -> tuple[str, str]:
    """A CPU model and its flags as a host kind (model + widest vector ISA) and its slug:
    ``("AMD EPYC, AVX-512", "amd-epyc-avx512")``. An emulated ISA says so (``vllm-eagle3 emulate``: not a host kind)."""
    flags = set(flags)
    isa = next((isa for flag, isa in ISA_FLAGS if flag in flags), "no AVX2") + (" emulated" if emulated else "")
    words = re.findall(r"[a-z0-9]+", re.sub(r"\((R|TM)\)", "", cpu).lower())[:2]
    return f"{cpu}, {isa}", "-".join(words + re.findall(r"[a-z0-9]+", isa.lower().replace("-", "")))


def this_host() -> tuple[str, str]:
    """This machine's host kind as the engine sees it (``/proc/cpuinfo``'s model name and flags; under ``vllm-eagle3
    emulate avx2`` the emulated flags, so such an engine never takes a real AVX2 host's table)."""
    from vllm_eagle3 import cpu_attention, envs

    return host_kind(cpu_attention.cpu_model(), cpu_attention.cpu_flags(), emulated=bool(envs.EAGLE3_EMULATED_ISA))


def start_file() -> Path:
    """``configs/live_k_start.yaml`` of ``$EAGLE3_HOME`` when set, else of the clone this package runs from (a wheel
    carries no configs/: then there is no file, and every host starts from its serve config's table)."""
    from vllm_eagle3 import envs

    root = Path(envs.EAGLE3_HOME).expanduser() if envs.EAGLE3_HOME else Path(__file__).resolve().parents[1]
    return root / START_FILE


@dataclasses.dataclass(frozen=True)
class Start:
    """The table one host kind was measured to want for one draft."""

    kind: str
    table: tuple[tuple[int, int, int], ...]
    measured: str


def read(path: Path) -> dict[str, Any]:
    """The file's mapping ({} when it does not exist: an install without the repository's configs/)."""
    import yaml

    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, Mapping):
        raise StartTableError(f"{path}: must map draft names to host kinds, got {type(data).__name__}")
    return dict(data)


def lookup(
    data: Mapping[str, Any], draft: str, slug: str, kind: str, max_k: int, where: str = START_FILE
) -> Start | None:
    """``data[draft][slug]`` as a :class:`Start`, None when not listed; an entry that cannot be a table is refused
    (:class:`StartTableError`: rows of [first, last, k], ascending without gaps from batch size 1, k >= 0). A k above
    the server's ``max_k`` (num_speculative_tokens) is capped to it: the table says what that host wanted with up to
    5 drafts, and a server that drafts at most 3 starts where the nearest k it can draft is."""
    entry = (data.get(draft) or {}).get(slug)
    if entry is None:
        return None
    name = f"{where}: {draft}.{slug}"
    if not isinstance(entry, Mapping) or not isinstance(entry.get("table"), list) or not entry.get("measured"):
        raise StartTableError(f"{name} needs 'table' ([[first, last, k], ...]) and 'measured' (what measured it)")
    rows, expect = [], 1
    for row in entry["table"]:
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(x, int) for x in row)):
            raise StartTableError(f"{name}: row {row!r} is not [first batch size, last, k]")
        first, last, k = row
        if first != expect or last < first or k < 0:
            raise StartTableError(
                f"{name}: row {row!r} must start at batch size {expect}, end at or after it, and have k >= 0; fix "
                f"the row or delete the entry"
            )
        rows.append((first, last, min(k, max_k)))
        expect = last + 1
    if not rows:
        raise StartTableError(f"{name}: the table is empty")
    return Start(kind, tuple(rows), str(entry["measured"]))
