"""The ``s3`` store: an S3 (or S3-compatible) bucket, checked with ``HeadBucket`` through boto3.

Credentials come from boto3's usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, an instance or task role); ``S3_ENDPOINT_URL`` points it
at MinIO or another S3-compatible server, ``S3_ADDRESSING_STYLE`` (``path`` | ``virtual`` |
``auto``) picks the URL form. boto3 is the ``[s3]`` extra: this module imports it only inside
:meth:`S3Store.check`, and :func:`s3_store` refuses the provider with one line naming the extra
when it is not installed. botocore's errors are translated here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import botocore.exceptions

from provisioner.errors import ConfigurationError, StorageMisconfigured, StorageUnavailable
from provisioner.settings import Settings
from provisioner.storage.base import (
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    ClientMemo,
    fail,
    library_gone,
    require_library,
    safe_endpoint,
)

S3_ADDRESSING_STYLES = ("path", "virtual", "auto")

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
    #: the boto3 client, built by the first check (:class:`provisioner.storage.base.ClientMemo`)
    _clients: ClientMemo[Any] = field(
        default_factory=ClientMemo, init=False, repr=False, compare=False
    )

    def describe(self) -> str:
        where = f" at {safe_endpoint(self.endpoint_url)}" if self.endpoint_url else ""
        return f"s3 bucket '{self.bucket}'{where}"

    def check(self) -> None:
        try:
            import botocore.config
            import botocore.exceptions
            from boto3.session import Session
        except ImportError as exc:
            library_gone(self.provider, "boto3", "s3", exc)

        config = botocore.config.Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries={"total_max_attempts": 1},
            s3={"addressing_style": self.addressing_style or "auto"},
        )
        try:
            client = self._clients.get(
                lambda: Session().client(
                    "s3",
                    endpoint_url=self.endpoint_url,
                    region_name=self.region,
                    config=config,
                )
            )
        except (ValueError, botocore.exceptions.BotoCoreError) as exc:
            # An endpoint URL botocore cannot use, or a broken AWS profile/config file.
            fail(
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
            fail(
                self,
                StorageMisconfigured,
                "no usable AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or AWS_PROFILE / an instance role)",
                exc,
            )
        except botocore.exceptions.ParamValidationError as exc:
            fail(
                self,
                StorageMisconfigured,
                "is not a valid bucket name; fix S3_BUCKET",
                exc,
            )
        except (
            botocore.exceptions.ConnectTimeoutError,
            botocore.exceptions.ReadTimeoutError,
        ) as exc:
            fail(
                self,
                StorageUnavailable,
                f"timed out ({type(exc).__name__}); check S3_ENDPOINT_URL and the network, "
                "the job will be retried",
                exc,
            )
        except botocore.exceptions.BotoCoreError as exc:
            # EndpointConnectionError, ConnectionClosedError, SSL and proxy errors, and
            # anything botocore adds later: the endpoint did not give an answer.
            fail(
                self,
                StorageUnavailable,
                f"is unreachable ({type(exc).__name__}); check S3_ENDPOINT_URL and the network, "
                "the job will be retried",
                exc,
            )

    def _client_error(self, exc: botocore.exceptions.ClientError) -> NoReturn:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        label = f"{code} / HTTP {status}" if status and str(status) != code else code
        if code in _S3_MISSING or status == 404:
            fail(
                self,
                StorageMisconfigured,
                f"does not exist ({label}): create the bucket or fix S3_BUCKET",
                exc,
            )
        if code in _S3_DENIED or status in (401, 403):
            fail(
                self,
                StorageMisconfigured,
                f"access denied ({label}): the AWS credentials are wrong or lack s3:ListBucket "
                "on this bucket; fix AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the IAM policy",
                exc,
            )
        if code in _S3_TRANSIENT or (isinstance(status, int) and status >= 500):
            fail(
                self,
                StorageUnavailable,
                f"answered {label} (throttled or failing); the job will be retried",
                exc,
            )
        if code in _S3_WRONG_REGION:
            fail(
                self,
                StorageMisconfigured,
                f"lives in another region ({label}): set AWS_REGION to the bucket's region",
                exc,
            )
        fail(
            self,
            StorageMisconfigured,
            f"was refused ({label}); check S3_BUCKET, S3_ENDPOINT_URL and the AWS credentials",
            exc,
        )


def s3_store(settings: Settings) -> S3Store:
    """The configured bucket's store, refusing settings that cannot work (or no boto3)."""
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
            f"{safe_endpoint(settings.s3_endpoint_url)!r}"
        )
    require_library("s3", "boto3", "boto3", "s3")
    return S3Store(
        bucket=settings.s3_bucket,
        endpoint_url=settings.s3_endpoint_url,
        region=settings.s3_region,
        addressing_style=style,
    )
