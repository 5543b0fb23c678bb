"""Object-store readiness checks behind one small interface; the only importer of cloud SDKs.

The provisioner never writes to object storage: each store answers one question, "is the
tenant's bucket/container there and readable with these credentials?", and raises
:class:`StorageMisconfigured` (permanent: fail the job now) or :class:`StorageUnavailable`
(transient: let the queue's backoff retry) otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from provisioner.errors import ConfigurationError, StorageMisconfigured
from provisioner.settings import OBJECT_STORE_PROVIDERS, Settings


class ObjectStore(Protocol):
    """A read-only readiness check of one bucket, container or directory."""

    provider: str

    def describe(self) -> str:
        """A secret-free name for messages, e.g. ``s3 bucket 'tenants'``."""
        ...

    def check(self) -> None:
        """Return if the store is ready; raise StorageMisconfigured or StorageUnavailable."""
        ...


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


def store_from_settings(settings: Settings) -> ObjectStore:
    """Build the configured store, refusing a configuration that cannot work."""
    provider = settings.object_store_provider
    if provider not in OBJECT_STORE_PROVIDERS:
        raise ConfigurationError(
            f"OBJECT_STORE_PROVIDER={provider!r} is not one of {', '.join(OBJECT_STORE_PROVIDERS)}"
        )
    if provider == "filesystem":
        root = settings.object_store_path or settings.state_dir / "objects"
        return FilesystemStore(root=root)
    raise ConfigurationError(f"OBJECT_STORE_PROVIDER={provider!r} is not available yet")
