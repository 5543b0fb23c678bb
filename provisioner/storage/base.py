"""The ``ObjectStore`` interface and what every store shares: timeouts, secret-free messages and
the check that a provider's library is installed.

The provisioner never writes to object storage: each store answers one question, "is the
tenant's bucket/container there and readable with these credentials?", and raises
:class:`StorageMisconfigured` (permanent: fail the job now) or :class:`StorageUnavailable`
(transient: let the queue's backoff retry) otherwise.

Every network call is bounded (short connect and read timeouts, a single attempt), so a dead
endpoint fails the check in seconds rather than minutes; the queue's backoff does the retrying.
Third-party errors are translated in each store's module, once, into the two classes above;
messages name the provider, the bucket or container and the remedy, never a key, token or
connection string.

A store builds its SDK client at its first check and keeps it for the next ones
(:class:`ClientMemo`): a new boto3 session and client cost 90-190 ms of the process's CPU (the
service's model loaded, the client class built), more than a tenant's whole provisioning, on
every sign-up; a kept client costs its one request, on a connection it keeps open. Its
credentials are resolved then, once per store (a worker's engine child holds one store for its
life): keys from the environment or a file are read when the child first checks, refreshable
ones (an instance or task role, web identity) renew themselves. Pinned by
``tests/integration/test_storage.py::test_a_store_keeps_its_client_and_the_credentials_it_read``.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, NoReturn, Protocol, TypeVar
from urllib.parse import urlsplit

from provisioner.errors import ConfigurationError, StorageMisconfigured, StorageUnavailable
from provisioner.redact import redact

#: The distribution name that ``pip install '...[extra]'`` messages name.
DISTRIBUTION = "pg-tenant-provisioner"

# Bounds for one readiness check: one attempt, short timeouts (seconds).
CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 5.0


class ObjectStore(Protocol):
    """A read-only readiness check of one bucket, container or directory."""

    @property
    def provider(self) -> str:
        """``filesystem``, ``s3`` or ``azure`` (a plain or frozen attribute satisfies it)."""
        ...

    def describe(self) -> str:
        """A secret-free name for messages, e.g. ``s3 bucket 'tenants'``."""
        ...

    def check(self) -> None:
        """Return if the store is ready; raise StorageMisconfigured or StorageUnavailable."""
        ...


def missing_library(provider: str, package: str, extra: str) -> str:
    """The one line that says which extra installs a provider's library."""
    return (
        f"OBJECT_STORE_PROVIDER={provider} needs {package}: pip install '{DISTRIBUTION}[{extra}]'"
    )


def require_library(provider: str, module: str, package: str, extra: str) -> None:
    """Refuse a provider whose library is not installed, without importing it.

    The cloud SDKs are optional extras (``[s3]``, ``[azure]``) and take ~0.25 s to import, so
    the configuration check only looks the module up; the store imports it when it checks.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken module entry
        found = False
    if not found:
        raise ConfigurationError(missing_library(provider, package, extra))


def library_gone(provider: str, package: str, extra: str, exc: ImportError) -> NoReturn:
    """The library was found at configuration time but cannot be imported now: fail the job."""
    raise StorageMisconfigured(missing_library(provider, package, extra)) from exc


def safe_endpoint(url: str) -> str:
    """``scheme://host[:port]/path`` of a URL, without user info or query (a SAS lives there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return redact(f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}")


def fail(
    store: ObjectStore,
    kind: type[StorageMisconfigured | StorageUnavailable],
    what: str,
    exc: BaseException,
) -> NoReturn:
    """Raise ``kind`` with one secret-free line: the store, then what went wrong."""
    raise kind(redact(f"{store.describe()} {what}")) from exc


Client = TypeVar("Client")


@dataclass
class ClientMemo(Generic[Client]):
    """A store's SDK client, built by its first check and used by every check after it (see the
    module). The SDKs' clients are safe to share between threads; building one is not."""

    _client: Client | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, build: Callable[[], Client]) -> Client:
        """The client, built now by ``build`` if no check built it yet (a failed build is not
        kept: the next check tries again)."""
        with self._lock:
            if self._client is None:
                self._client = build()
            return self._client
