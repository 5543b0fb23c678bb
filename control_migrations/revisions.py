"""Another control revision's module, for a revision that reuses its text (a definition it
changes, a rule it moves): a revision's file name is no module name, so it is loaded by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

VERSIONS = Path(__file__).with_name("versions")


def load(name: str) -> ModuleType:
    """Revision ``name``'s module (its file ``versions/<name>.py``)."""
    spec = importlib.util.spec_from_file_location(
        f"control_revision_{name}", VERSIONS / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
