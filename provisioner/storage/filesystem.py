"""The ``filesystem`` store: a local directory standing in for a bucket (the embedded default).

It needs no extra library, so a filesystem-only install (``make demo``) imports no cloud SDK.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import StorageMisconfigured


@dataclass(frozen=True)
class FilesystemStore:
    """A local directory standing in for a bucket (the embedded default)."""

    root: Path
    provider: str = "filesystem"

    def describe(self) -> str:
        return f"filesystem directory '{self.root}'"

    def check(self) -> None:
        if not self.root.is_dir():
            raise StorageMisconfigured(
                f"filesystem store: directory '{self.root}' does not exist; create it or set "
                "OBJECT_STORE_PATH"
            )
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise StorageMisconfigured(
                f"filesystem store: directory '{self.root}' is not readable; fix its permissions"
            )
