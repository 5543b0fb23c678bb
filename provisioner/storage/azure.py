"""The ``azure`` store: an Azure Blob container, checked with ``Get Container Properties``.

Either from ``AZURE_STORAGE_CONNECTION_STRING`` (account key or SAS inside it) or from
``AZURE_STORAGE_ACCOUNT_URL`` plus an optional ``AZURE_STORAGE_CREDENTIAL`` (an account key or a
SAS token; without it the request is anonymous, which only works for a public container).
azure-storage-blob is the ``[azure]`` extra: this module imports it only inside
:meth:`AzureBlobStore.check`, and :func:`azure_store` refuses the provider with one line naming
the extra when it is not installed. The SDK's errors are translated here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import ContainerClient

from provisioner.errors import ConfigurationError, StorageMisconfigured, StorageUnavailable
from provisioner.settings import AZURE_CREDENTIAL_ENV, Settings
from provisioner.storage.base import (
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    ClientMemo,
    fail,
    library_gone,
    require_library,
    safe_endpoint,
)


@dataclass(frozen=True)
class AzureBlobStore:
    """An Azure Blob container, checked with ``Get Container Properties``."""

    container: str
    connection_string: str | None = field(default=None, repr=False)
    account_url: str | None = field(default=None, repr=False)
    credential: str | None = field(default=None, repr=False)
    connect_timeout: float = CONNECT_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    provider: str = "azure"
    #: the container's client, built by the first check
    #: (:class:`provisioner.storage.base.ClientMemo`)
    _clients: ClientMemo[ContainerClient] = field(
        default_factory=ClientMemo, init=False, repr=False, compare=False
    )

    def describe(self) -> str:
        return f"azure container '{self.container}' at {self._account()}"

    def _account(self) -> str:
        """The blob endpoint, from the account URL or the connection string, secret-free."""
        if self.account_url:
            return safe_endpoint(self.account_url)
        pairs = _connection_string_pairs(self.connection_string or "")
        if "blobendpoint" in pairs:
            return safe_endpoint(pairs["blobendpoint"])
        account = pairs.get("accountname", "?")
        suffix = pairs.get("endpointsuffix", "core.windows.net")
        return f"{pairs.get('defaultendpointsprotocol', 'https')}://{account}.blob.{suffix}"

    def _client(self) -> ContainerClient:
        try:
            from azure.storage.blob import ContainerClient
        except ImportError as exc:
            library_gone(self.provider, "azure-storage-blob", "azure", exc)

        if self.connection_string:
            return ContainerClient.from_connection_string(
                self.connection_string,
                self.container,
                retry_total=0,
                connection_timeout=self.connect_timeout,
                read_timeout=self.read_timeout,
            )
        if not self.account_url:
            raise ConfigurationError("azure store needs a connection string or an account URL")
        return ContainerClient(
            self.account_url,
            self.container,
            credential=self.credential,
            retry_total=0,
            connection_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
        )

    def check(self) -> None:
        try:
            from azure.core.exceptions import (
                AzureError,
                ClientAuthenticationError,
                HttpResponseError,
                ResourceNotFoundError,
                ServiceRequestError,
                ServiceRequestTimeoutError,
                ServiceResponseError,
                ServiceResponseTimeoutError,
            )
        except ImportError as exc:
            library_gone(self.provider, "azure-storage-blob", "azure", exc)

        try:
            client = self._clients.get(self._client)
        except (ValueError, AzureError) as exc:
            fail(
                self,
                StorageMisconfigured,
                "cannot be addressed: the connection string or account URL is malformed; fix "
                "AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL",
                exc,
            )
        try:
            client.get_container_properties()
        except ResourceNotFoundError as exc:
            fail(
                self,
                StorageMisconfigured,
                f"does not exist ({_azure_label(exc)}): create the container or fix "
                "AZURE_STORAGE_CONTAINER",
                exc,
            )
        except ClientAuthenticationError as exc:
            if exc.status_code is None:
                # Raised before sending: the SDK could not sign with this key.
                fail(
                    self,
                    StorageMisconfigured,
                    "cannot be signed: the account key is malformed (not base64); fix "
                    f"AZURE_STORAGE_CONNECTION_STRING or {AZURE_CREDENTIAL_ENV}",
                    exc,
                )
            self._denied(exc)
        except (ServiceRequestTimeoutError, ServiceResponseTimeoutError) as exc:
            fail(
                self,
                StorageUnavailable,
                f"timed out ({type(exc).__name__}); check the account URL and the network, "
                "the job will be retried",
                exc,
            )
        except (ServiceRequestError, ServiceResponseError) as exc:
            # Connection refused, DNS failure, connection reset.
            fail(
                self,
                StorageUnavailable,
                f"is unreachable ({type(exc).__name__}); check the account URL and the "
                "network, the job will be retried",
                exc,
            )
        except HttpResponseError as exc:
            status = exc.status_code
            if status in (401, 403):
                self._denied(exc)
            if status is not None and (status >= 500 or status in (408, 429)):
                fail(
                    self,
                    StorageUnavailable,
                    f"answered {_azure_label(exc)} (throttled or failing); the job will be retried",
                    exc,
                )
            fail(
                self,
                StorageMisconfigured,
                f"was refused ({_azure_label(exc)}); check AZURE_STORAGE_CONTAINER and the "
                "account settings",
                exc,
            )
        except AzureError as exc:
            fail(
                self,
                StorageUnavailable,
                f"could not be checked ({type(exc).__name__}); the job will be retried",
                exc,
            )

    def _denied(self, exc: HttpResponseError) -> NoReturn:
        fail(
            self,
            StorageMisconfigured,
            f"access denied ({_azure_label(exc)}): the account key or SAS token is wrong, "
            "expired or lacks read permission; fix AZURE_STORAGE_CONNECTION_STRING or "
            f"{AZURE_CREDENTIAL_ENV}",
            exc,
        )


def _azure_label(exc: Exception) -> str:
    """``<error code> / HTTP <status>``, never the SDK's message (it may quote the URL)."""
    code = getattr(exc, "error_code", None)
    response = getattr(exc, "response", None)
    if not code and response is not None:
        code = response.headers.get("x-ms-error-code")
    code = getattr(code, "value", code)  # StorageErrorCode is a str enum
    status = getattr(exc, "status_code", None)
    if status is None:
        return f"{code}" if code else type(exc).__name__
    return f"{code} / HTTP {status}" if code else f"HTTP {status}"


def _connection_string_pairs(connection_string: str) -> dict[str, str]:
    """``Key=Value;...`` as a dict with lower-case keys (the SDK parses it the same way)."""
    pairs: dict[str, str] = {}
    for item in connection_string.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            pairs[key.strip().lower()] = value.strip()
    return pairs


def azure_store(settings: Settings) -> AzureBlobStore:
    """The configured container's store, refusing settings that cannot work (or no SDK)."""
    if not settings.azure_container:
        raise ConfigurationError(
            "OBJECT_STORE_PROVIDER=azure needs AZURE_STORAGE_CONTAINER (the container name)"
        )
    if not settings.azure_connection_string and not settings.azure_account_url:
        raise ConfigurationError(
            "OBJECT_STORE_PROVIDER=azure needs AZURE_STORAGE_CONNECTION_STRING or "
            "AZURE_STORAGE_ACCOUNT_URL"
        )
    if settings.azure_connection_string:
        pairs = _connection_string_pairs(settings.azure_connection_string)
        if "blobendpoint" not in pairs and "accountname" not in pairs:
            raise ConfigurationError(
                "AZURE_STORAGE_CONNECTION_STRING names neither AccountName nor BlobEndpoint"
            )
        require_library("azure", "azure.storage.blob", "azure-storage-blob", "azure")
        return AzureBlobStore(
            container=settings.azure_container,
            connection_string=settings.azure_connection_string,
        )
    require_library("azure", "azure.storage.blob", "azure-storage-blob", "azure")
    return AzureBlobStore(
        container=settings.azure_container,
        account_url=settings.azure_account_url,
        credential=settings.azure_credential,
    )
