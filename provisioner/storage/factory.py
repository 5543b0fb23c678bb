"""``store_from_settings``: the configured store, or one line refusing settings that fail.

Kept apart from :mod:`provisioner.storage.base` so that the interface module imports no store
(each store imports the interface). Building a store imports no cloud SDK: the ``s3`` and
``azure`` providers only check that their extra is installed, and import it when they check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from provisioner.errors import ConfigurationError, StorageMisconfigured, StorageUnavailable
from provisioner.settings import AZURE_CREDENTIAL_ENV, OBJECT_STORE_PROVIDERS, Settings
from provisioner.storage.azure import azure_store
from provisioner.storage.base import ObjectStore
from provisioner.storage.filesystem import FilesystemStore
from provisioner.storage.none import NoStore
from provisioner.storage.s3 import s3_store


def store_from_settings(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> ObjectStore:
    """Build the configured store, refusing a configuration that cannot work.

    A provider whose library is missing (the ``[s3]`` or ``[azure]`` extra not installed) is a
    :class:`ConfigurationError` that names the extra. The Azure credential is the settings'
    (``AZURE_STORAGE_CREDENTIAL``, read by :meth:`Settings.from_env`); ``environ``, when given,
    stands for the environment for that one value, as ``from_env`` would read it (a caller that
    builds its settings by hand).
    """
    provider = settings.object_store_provider
    if provider not in OBJECT_STORE_PROVIDERS:
        raise ConfigurationError(
            f"OBJECT_STORE_PROVIDER={provider!r} is not one of {', '.join(OBJECT_STORE_PROVIDERS)}"
        )
    if provider == "none":
        return NoStore()
    if provider == "filesystem":
        return FilesystemStore(root=settings.object_store_path or settings.state_dir / "objects")
    if provider == "s3":
        return s3_store(settings)
    if environ is not None:
        settings = replace(settings, azure_credential=environ.get(AZURE_CREDENTIAL_ENV) or None)
    return azure_store(settings)  # azure, the last of OBJECT_STORE_PROVIDERS


@dataclass(frozen=True)
class Readiness:
    """The configured store's read-only check: ``text`` says what was checked when ``ready``,
    else why it is not ready."""

    ready: bool
    provider: str
    text: str


def readiness(settings: Settings) -> Readiness:
    """Check the configured store; a store fault is reported, never raised (a worker whose
    store is down still starts, and ``health --check-storage`` says why). A configuration that
    cannot work at all is still a :class:`ConfigurationError`."""
    store = store_from_settings(settings)
    try:
        store.check()
    except (StorageMisconfigured, StorageUnavailable) as exc:
        return Readiness(False, store.provider, str(exc))
    return Readiness(True, store.provider, store.describe())
