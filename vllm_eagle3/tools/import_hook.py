"""Patch a module right after Python imports it (stdlib only): the one mechanism both ``emulate`` site folders use.

``patch_after_import({"torch.cpu": fn})`` puts a meta-path finder first on ``sys.meta_path``; when the named module is
imported, its own loader runs it and then ``fn(module)`` runs. A process that never imports the module pays nothing.
Installing it twice in one process is a no-op per name.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Callable


class _Patching(importlib.abc.Loader):
    def __init__(self, loader, patch: Callable) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.patches: dict[str, Callable] = {}

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patching(spec.loader, patch)
                return spec
        return None


_FINDER = _Finder()


def patch_after_import(patches: dict[str, Callable]) -> None:
    """Run ``patches[name](module)`` right after module ``name`` is imported (first import in this process)."""
    _FINDER.patches.update(patches)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
