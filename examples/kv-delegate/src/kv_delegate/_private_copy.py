"""A private copy of a backend package: its own module objects, so its own classes and its own
poison latch (docs/adding-a-backend.md, "A backend that delegates")."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def private_copy(package: str) -> ModuleType:
    """Import ``package`` afresh and hide the copy from ``sys.modules``, so that whoever imports
    ``package`` afterwards (or did before) gets the shared one, not this copy. The copy's modules
    keep their names: they import each other by name while this runs, then only through the
    references they hold."""
    mine = [name for name in sys.modules if name == package or name.startswith(f"{package}.")]
    shared = {name: sys.modules.pop(name) for name in mine}
    try:
        copy = importlib.import_module(package)
    finally:
        for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
            del sys.modules[name]
        sys.modules.update(shared)
    return copy
