"""Object-store readiness checks behind one small interface; the only importer of cloud SDKs.

The provisioner never writes to object storage: each store answers one question, "is the
tenant's bucket/container there and readable with these credentials?", and raises
:class:`StorageMisconfigured` (permanent: fail the job now) or :class:`StorageUnavailable`
(transient: let the queue's backoff retry) otherwise.

Stores:

* ``filesystem`` - a local directory (the embedded default).
* ``s3`` - ``HeadBucket`` through boto3. Credentials come from boto3's usual chain
  (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, an
  instance or task role); ``S3_ENDPOINT_URL`` points it at MinIO or another S3-compatible
  server, ``S3_ADDRESSING_STYLE`` (``path`` | ``virtual`` | ``auto``) picks the URL form.
* ``azure`` - ``Get Container Properties`` through azure-storage-blob, either from
  ``AZURE_STORAGE_CONNECTION_STRING`` (account key or SAS inside it) or from
  ``AZURE_STORAGE_ACCOUNT_URL`` plus an optional ``AZURE_STORAGE_CREDENTIAL`` (an account key or a
  SAS token; without it the request is anonymous, which only works for a public container).

Every network call is bounded (short connect and read timeouts, a single attempt), so a dead
endpoint fails the check in seconds rather than minutes; the queue's backoff does the retrying.
Third-party errors are translated here, once, into the two classes above; messages name the
provider, the bucket or container and the remedy, never a key, token or connection string.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol
from urllib.parse import urlsplit

# The cloud SDKs take ~0.25 s to import: they are imported where a store is checked, so CLI
# commands that never touch storage start fast.
if TYPE_CHECKING:
    import botocore.exceptions
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import ContainerClient

from provisioner.errors import ConfigurationError, StorageMisconfigured, StorageUnavailable
from provisioner.redact import redact
from provisioner.settings import OBJECT_STORE_PROVIDERS, Settings

S3_ADDRESSING_STYLES = ("path", "virtual", "auto")
AZURE_CREDENTIAL_ENV = "AZURE_STORAGE_CREDENTIAL"

# Bounds for one readiness check: one attempt, short timeouts (seconds).
CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 5.0

# S3 answers a HEAD with no body, so the "code" is often just the status as a string.
_S3_MISSING = frozenset({"404", "NoSuchBucket", "NotFound"})
_S3_DENIED = frozenset(
    {
        "401",
        "403",
        "AccessDenied",
        "AllAccessDisabled",
        "Forbidden",
        "InvalidAccessKeyId",
        "InvalidToken",
        "ExpiredToken",
        "SignatureDoesNotMatch",
        "AccountProblem",
    }
)
_S3_TRANSIENT = frozenset(
    {
        "429",
        "500",
        "502",
        "503",
        "504",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
    }
)
_S3_WRONG_REGION = frozenset({"301", "PermanentRedirect", "AuthorizationHeaderMalformed"})


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


def _safe_endpoint(url: str) -> str:
    """``scheme://host[:port]/path`` of a URL, without user info or query (a SAS lives there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return redact(f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}")


@dataclass(frozen=True)
class S3Store:
    """An S3 (or S3-compatible) bucket, checked with ``HeadBucket``."""

    bucket: str
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: str | None = None
    connect_timeout: float = CONNECT_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    provider: str = "s3"

    def describe(self) -> str:
        where = f" at {_safe_endpoint(self.endpoint_url)}" if self.endpoint_url else ""
        return f"s3 bucket '{self.bucket}'{where}"

    def check(self) -> None:
        import botocore.config
        import botocore.exceptions
        from boto3.session import Session

        config = botocore.config.Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries={"total_max_attempts": 1},
            s3={"addressing_style": self.addressing_style or "auto"},
        )
        try:
            client = Session().client(
                "s3",
                endpoint_url=self.endpoint_url,
                region_name=self.region,
                config=config,
            )
        except (ValueError, botocore.exceptions.BotoCoreError) as exc:
            # An endpoint URL botocore cannot use, or a broken AWS profile/config file.
            _fail(
                self,
                StorageMisconfigured,
                f"the S3 client cannot be built ({type(exc).__name__}); fix S3_ENDPOINT_URL, "
                "AWS_REGION or the AWS profile",
                exc,
            )
        try:
            client.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as exc:
            self._client_error(exc)
        except (
            botocore.exceptions.NoCredentialsError,
            botocore.exceptions.PartialCredentialsError,
        ) as exc:
            _fail(
                self,
                StorageMisconfigured,
                "no usable AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or AWS_PROFILE / an instance role)",
                exc,
            )
        except botocore.exceptions.ParamValidationError as exc:
            _fail(
                self,
                StorageMisconfigured,
                "is not a valid bucket name; fix S3_BUCKET",
                exc,
            )
        except (
            botocore.exceptions.ConnectTimeoutError,
            botocore.exceptions.ReadTimeoutError,
        ) as exc:
            _fail(
                self,
                StorageUnavailable,
                f"timed out ({type(exc).__name__}); check S3_ENDPOINT_URL and the network, "
                "the job will be retried",
                exc,
            )
        except botocore.exceptions.BotoCoreError as exc:
            # EndpointConnectionError, ConnectionClosedError, SSL and proxy errors, and
            # anything botocore adds later: the endpoint did not give an answer.
            _fail(
                self,
                StorageUnavailable,
                f"is unreachable ({type(exc).__name__}); check S3_ENDPOINT_URL and the network, "
                "the job will be retried",
                exc,
            )
        finally:
            client.close()

    def _client_error(self, exc: botocore.exceptions.ClientError) -> NoReturn:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        label = f"{code} / HTTP {status}" if status and str(status) != code else code
        if code in _S3_MISSING or status == 404:
            _fail(
                self,
                StorageMisconfigured,
                f"does not exist ({label}): create the bucket or fix S3_BUCKET",
                exc,
            )
        if code in _S3_DENIED or status in (401, 403):
            _fail(
                self,
                StorageMisconfigured,
                f"access denied ({label}): the AWS credentials are wrong or lack s3:ListBucket "
                "on this bucket; fix AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the IAM policy",
                exc,
            )
        if code in _S3_TRANSIENT or (isinstance(status, int) and status >= 500):
            _fail(
                self,
                StorageUnavailable,
                f"answered {label} (throttled or failing); the job will be retried",
                exc,
            )
        if code in _S3_WRONG_REGION:
            _fail(
                self,
                StorageMisconfigured,
                f"lives in another region ({label}): set AWS_REGION to the bucket's region",
                exc,
            )
        _fail(
            self,
            StorageMisconfigured,
            f"was refused ({label}); check S3_BUCKET, S3_ENDPOINT_URL and the AWS credentials",
            exc,
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

    def describe(self) -> str:
        return f"azure container '{self.container}' at {self._account()}"

    def _account(self) -> str:
        """The blob endpoint, from the account URL or the connection string, secret-free."""
        if self.account_url:
            return _safe_endpoint(self.account_url)
        pairs = _connection_string_pairs(self.connection_string or "")
        if "blobendpoint" in pairs:
            return _safe_endpoint(pairs["blobendpoint"])
        account = pairs.get("accountname", "?")
        suffix = pairs.get("endpointsuffix", "core.windows.net")
        return f"{pairs.get('defaultendpointsprotocol', 'https')}://{account}.blob.{suffix}"

    def _client(self) -> ContainerClient:
        from azure.storage.blob import ContainerClient

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

        try:
            client = self._client()
        except (ValueError, AzureError) as exc:
            _fail(
                self,
                StorageMisconfigured,
                "cannot be addressed: the connection string or account URL is malformed; fix "
                "AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL",
                exc,
            )
        try:
            with client:
                client.get_container_properties()
        except ResourceNotFoundError as exc:
            _fail(
                self,
                StorageMisconfigured,
                f"does not exist ({_azure_label(exc)}): create the container or fix "
                "AZURE_STORAGE_CONTAINER",
                exc,
            )
        except ClientAuthenticationError as exc:
            if exc.status_code is None:
                # Raised before sending: the SDK could not sign with this key.
                _fail(
                    self,
                    StorageMisconfigured,
                    "cannot be signed: the account key is malformed (not base64); fix "
                    f"AZURE_STORAGE_CONNECTION_STRING or {AZURE_CREDENTIAL_ENV}",
                    exc,
                )
            self._denied(exc)
        except (ServiceRequestTimeoutError, ServiceResponseTimeoutError) as exc:
            _fail(
                self,
                StorageUnavailable,
                f"timed out ({type(exc).__name__}); check the account URL and the network, "
                "the job will be retried",
                exc,
            )
        except (ServiceRequestError, ServiceResponseError) as exc:
            # Connection refused, DNS failure, connection reset.
            _fail(
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
                _fail(
                    self,
                    StorageUnavailable,
                    f"answered {_azure_label(exc)} (throttled or failing); the job will be retried",
                    exc,
                )
            _fail(
                self,
                StorageMisconfigured,
                f"was refused ({_azure_label(exc)}); check AZURE_STORAGE_CONTAINER and the "
                "account settings",
                exc,
            )
        except AzureError as exc:
            _fail(
                self,
                StorageUnavailable,
                f"could not be checked ({type(exc).__name__}); the job will be retried",
                exc,
            )

    def _denied(self, exc: HttpResponseError) -> NoReturn:
        _fail(
            self,
            StorageMisconfigured,
            f"access denied ({_azure_label(exc)}): the account key or SAS token is wrong, "
            "expired or lacks read permission; fix AZURE_STORAGE_CONNECTION_STRING or "
            f"{AZURE_CREDENTIAL_ENV}",
            exc,
        )


def _fail(
    store: ObjectStore,
    kind: type[StorageMisconfigured | StorageUnavailable],
    what: str,
    exc: BaseException,
) -> NoReturn:
    """Raise ``kind`` with one secret-free line: the store, then what went wrong."""
    raise kind(redact(f"{store.describe()} {what}")) from exc


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
    pairs: dict[str, str] = {}
    for item in connection_string.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            pairs[key.strip().lower()] = value.strip()
    return pairs


def store_from_settings(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> ObjectStore:
    """Build the configured store, refusing a configuration that cannot work.

    ``environ`` (default ``os.environ``) is read for one value only: ``AZURE_STORAGE_CREDENTIAL``,
    the account key or SAS token used with ``AZURE_STORAGE_ACCOUNT_URL``.
    """
    provider = settings.object_store_provider
    if provider not in OBJECT_STORE_PROVIDERS:
        raise ConfigurationError(
            f"OBJECT_STORE_PROVIDER={provider!r} is not one of {', '.join(OBJECT_STORE_PROVIDERS)}"
        )
    if provider == "filesystem":
        root = settings.object_store_path or settings.state_dir / "objects"
        return FilesystemStore(root=root)
    if provider == "s3":
        if not settings.s3_bucket:
            raise ConfigurationError("OBJECT_STORE_PROVIDER=s3 needs S3_BUCKET (the bucket name)")
        style = settings.s3_addressing_style
        if style is not None and style not in S3_ADDRESSING_STYLES:
            raise ConfigurationError(
                f"S3_ADDRESSING_STYLE={style!r} is not one of {', '.join(S3_ADDRESSING_STYLES)}"
            )
        if settings.s3_endpoint_url and urlsplit(settings.s3_endpoint_url).scheme not in (
            "http",
            "https",
        ):
            raise ConfigurationError(
                "S3_ENDPOINT_URL must be an http:// or https:// URL, got "
                f"{_safe_endpoint(settings.s3_endpoint_url)!r}"
            )
        return S3Store(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            addressing_style=style,
        )
    # azure, the last of OBJECT_STORE_PROVIDERS
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
        return AzureBlobStore(
            container=settings.azure_container,
            connection_string=settings.azure_connection_string,
        )
    env = os.environ if environ is None else environ
    return AzureBlobStore(
        container=settings.azure_container,
        account_url=settings.azure_account_url,
        credential=env.get(AZURE_CREDENTIAL_ENV) or None,
    )
