"""Small file builders for tests that need a draft folder without real weights (static checks read headers only)."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def write_safetensors_zeros(path: Path, shapes: dict[str, list[int]]) -> None:
    """A valid safetensors file whose header declares ``shapes`` (F32) and whose data are zeros."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 4
        for s in shape:
            n *= s
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    Path(path).write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
