"""The object-storage readiness check against real servers: moto (S3) and Azurite (Azure Blob).

Every check must be read-only, classify failures as permanent (StorageMisconfigured: missing
bucket, refused credentials) or transient (StorageUnavailable: endpoint down, hung, 5xx), name
the bucket and the remedy, and never quote a secret.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import boto3
import pytest
from azure.storage.blob import (
    AccountSasPermissions,
    ResourceTypes,
    generate_account_sas,
)

from provisioner.errors import ConfigurationError, StorageMisconfigured, StorageUnavailable
from provisioner.settings import Settings
from provisioner.storage import AzureBlobStore, S3Store, store_from_settings
from tests.object_servers import AZURITE_ACCOUNT, AZURITE_KEY, HOST, AzuriteServer, MotoS3Server
from tests.storage_fixtures import (
    MOTO_ACCESS_KEY,
    MOTO_REGION,
    MOTO_SECRET_KEY,
    AzureContainer,
    S3Bucket,
    unique_name,
)

# No timing is asserted except this sanity bound: unbounded SDK defaults take 1.5-3 minutes.
SANITY_BOUND_SECONDS = 30.0


def timed_failure(check: object, expected: type[Exception]) -> tuple[Exception, float]:
    assert callable(check)
    started = time.monotonic()
    with pytest.raises(expected) as info:
        check()
    return info.value, time.monotonic() - started


def assert_secret_free(message: str, *secrets: str) -> None:
    assert "\n" not in message, message
    for secret in secrets:
        assert secret, "a secret to look for must be non-empty"
        assert secret not in message, f"secret leaked into: {message}"


def put_objects(bucket: S3Bucket) -> None:
    bucket.client.put_object(Bucket=bucket.name, Key="keep/a.txt", Body=b"alpha")
    bucket.client.put_object(Bucket=bucket.name, Key="keep/b.bin", Body=bytes(range(256)))


def put_blobs(container: AzureContainer) -> None:
    client = container.service.get_container_client(container.name)
    client.upload_blob("keep/a.txt", b"alpha")
    client.upload_blob("keep/b.bin", bytes(range(256)))


# --- a hung endpoint and a failing endpoint: real sockets on 127.0.0.1 ---------------------


@pytest.fixture
def hung_endpoint() -> Iterator[str]:
    """A port that completes TCP handshakes (the kernel's backlog) but never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen(8)
        yield f"http://{HOST}:{sock.getsockname()[1]}"


class _FailingHandler(http.server.BaseHTTPRequestHandler):
    status = 503

    def _answer(self) -> None:
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def failing_endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    """An HTTP server answering every request with the status given by the parameter."""
    server = http.server.ThreadingHTTPServer((HOST, 0), _FailingHandler)
    server.status = request.param  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# --- S3 (moto) ---------------------------------------------------------------------------


def test_s3_check_passes_and_writes_nothing(s3_bucket: S3Bucket) -> None:
    put_objects(s3_bucket)
    before = s3_bucket.snapshot()

    store = store_from_settings(s3_bucket.settings())
    assert isinstance(store, S3Store)
    store.check()
    store.check()

    assert s3_bucket.snapshot() == before
    assert s3_bucket.name in store.describe()


@pytest.mark.parametrize("style", ["path", "virtual", "auto"])
def test_s3_addressing_styles_reach_the_bucket(s3_bucket: S3Bucket, style: str) -> None:
    # botocore falls back to path style for an IP endpoint, so every style reaches moto.
    settings = replace(s3_bucket.settings(), s3_addressing_style=style)
    store_from_settings(settings).check()


def test_s3_missing_bucket_is_misconfigured_and_not_created(s3_bucket: S3Bucket) -> None:
    before = s3_bucket.snapshot()
    missing = unique_name("missing")
    settings = replace(s3_bucket.settings(), s3_bucket=missing)

    error, _ = timed_failure(store_from_settings(settings).check, StorageMisconfigured)

    message = str(error)
    assert f"'{missing}'" in message
    assert "does not exist" in message
    assert "create the bucket or fix S3_BUCKET" in message
    assert_secret_free(message, MOTO_SECRET_KEY, MOTO_ACCESS_KEY)
    assert s3_bucket.snapshot() == before  # the check never creates the bucket


def test_s3_invalid_bucket_name_is_misconfigured(s3_bucket: S3Bucket) -> None:
    settings = replace(s3_bucket.settings(), s3_bucket="Not A Bucket!")
    with pytest.raises(StorageMisconfigured, match="not a valid bucket name; fix S3_BUCKET"):
        store_from_settings(settings).check()


def test_s3_without_any_credentials_is_misconfigured(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")

    error, elapsed = timed_failure(
        store_from_settings(s3_bucket.settings()).check, StorageMisconfigured
    )

    assert "no usable AWS credentials" in str(error)
    assert s3_bucket.name in str(error)
    print(f"s3 without credentials failed in {elapsed:.3f} s")


def _iam_user(
    moto_server: MotoS3Server, name: str, policy: dict[str, object] | None
) -> tuple[str, str]:
    """Create an IAM user (IAM enforcement must still be off) and return its access key."""
    iam = boto3.client(
        "iam",
        endpoint_url=moto_server.endpoint_url,
        region_name=MOTO_REGION,
        aws_access_key_id=MOTO_ACCESS_KEY,
        aws_secret_access_key=MOTO_SECRET_KEY,
    )
    with contextlib.closing(iam):
        iam.create_user(UserName=name)
        if policy is not None:
            iam.put_user_policy(
                UserName=name, PolicyName="read-only", PolicyDocument=json.dumps(policy)
            )
        key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def _read_only(bucket: S3Bucket) -> dict[str, object]:
    """An IAM policy that lets its user read ``bucket`` and nothing else."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                # AWS authorises HeadBucket as s3:ListBucket; moto calls it s3:HeadBucket.
                "Action": ["s3:ListBucket", "s3:HeadBucket", "s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{bucket.name}", f"arn:aws:s3:::{bucket.name}/*"],
            }
        ],
    }


def test_s3_credentials_are_checked(
    s3_bucket: S3Bucket, moto_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_objects(s3_bucket)
    before = s3_bucket.snapshot()
    reader_key, reader_secret = _iam_user(moto_server, unique_name("reader"), _read_only(s3_bucket))
    stranger_key, stranger_secret = _iam_user(moto_server, unique_name("stranger"), None)
    bogus_key, bogus_secret = "AKIA" + "X" * 16, "bogus/" + "y" * 34

    moto_server.enforce_auth(0)
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", reader_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", reader_secret)
        store_from_settings(s3_bucket.settings()).check()  # read-only rights are enough

        refusals = {}
        for key, secret in ((stranger_key, stranger_secret), (bogus_key, bogus_secret)):
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
            # a store reads its credentials at its first check: a new one for each
            store = store_from_settings(s3_bucket.settings())
            error, _ = timed_failure(store.check, StorageMisconfigured)
            refusals[key] = str(error)
            assert_secret_free(str(error), secret, key)
    finally:
        moto_server.disable_auth()

    for message in refusals.values():
        assert "access denied" in message
        assert "credentials" in message
        assert f"'{s3_bucket.name}'" in message
    assert s3_bucket.snapshot() == before


def test_a_store_keeps_its_client_and_the_credentials_it_read(
    s3_bucket: S3Bucket, moto_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """storage/base.py: a store builds its client at its first check and keeps it: the next
    checks build no boto3 session (one costs ~100 ms of CPU) and sign with the credentials
    read then, even once the environment's are wrong; a new store reads them again."""
    key, secret = _iam_user(moto_server, unique_name("keeper"), _read_only(s3_bucket))
    sessions: list[object] = []
    real_session = boto3.session.Session

    def counted(*args: object, **kwargs: object) -> boto3.session.Session:
        sessions.append(args)
        return real_session(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(boto3.session, "Session", counted)
    moto_server.enforce_auth(0)
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        store = store_from_settings(s3_bucket.settings())
        store.check()
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong/" + "z" * 34)
        for _ in range(3):
            store.check()  # the credentials it read at its first check
        assert len(sessions) == 1
        error, _ = timed_failure(store_from_settings(s3_bucket.settings()).check,
                                 StorageMisconfigured)  # fmt: skip
    finally:
        moto_server.disable_auth()
    assert "access denied" in str(error) and len(sessions) == 2


def test_s3_outage_is_transient_and_recovers_on_the_same_port(
    s3_bucket: S3Bucket, moto_server: MotoS3Server
) -> None:
    put_objects(s3_bucket)
    before = s3_bucket.snapshot()
    store = store_from_settings(s3_bucket.settings())
    port = moto_server.port

    moto_server.stop()
    try:
        error, elapsed = timed_failure(store.check, StorageUnavailable)
    finally:
        moto_server.start()

    print(f"s3 check against a stopped moto server failed in {elapsed:.3f} s: {error}")
    assert moto_server.port == port
    assert "unreachable" in str(error)
    assert f"'{s3_bucket.name}'" in str(error)
    assert "retried" in str(error)
    store.check()
    assert s3_bucket.snapshot() == before


def test_s3_hung_endpoint_times_out_quickly(hung_endpoint: str, moto_credentials: None) -> None:
    store = S3Store(bucket=unique_name(), endpoint_url=hung_endpoint, addressing_style="path")

    error, elapsed = timed_failure(store.check, StorageUnavailable)

    print(f"s3 check against a hung endpoint failed in {elapsed:.3f} s: {error}")
    assert "timed out" in str(error)
    assert elapsed < SANITY_BOUND_SECONDS


@pytest.mark.parametrize("failing_endpoint", [500, 503, 429], indirect=True)
def test_s3_server_errors_and_throttling_are_transient(
    failing_endpoint: str, moto_credentials: None
) -> None:
    store = S3Store(bucket=unique_name(), endpoint_url=failing_endpoint, addressing_style="path")
    error, _ = timed_failure(store.check, StorageUnavailable)
    assert "retried" in str(error)


# --- Azure Blob (Azurite) ------------------------------------------------------------------


def test_azure_check_passes_and_writes_nothing(azure_container: AzureContainer) -> None:
    put_blobs(azure_container)
    before = azure_container.snapshot()

    store = store_from_settings(azure_container.settings())
    assert isinstance(store, AzureBlobStore)
    store.check()
    store.check()

    assert azure_container.snapshot() == before
    assert azure_container.name in store.describe()
    assert AZURITE_KEY not in store.describe()
    assert AZURITE_KEY not in repr(store)


def test_azure_missing_container_is_misconfigured_and_not_created(
    azure_container: AzureContainer,
) -> None:
    before = azure_container.snapshot()
    missing = unique_name("missing")
    settings = replace(azure_container.settings(), azure_container=missing)

    error, _ = timed_failure(store_from_settings(settings).check, StorageMisconfigured)

    message = str(error)
    assert f"'{missing}'" in message
    assert "does not exist" in message
    assert "create the container or fix AZURE_STORAGE_CONTAINER" in message
    assert_secret_free(message, AZURITE_KEY, azure_container.connection_string)
    assert azure_container.snapshot() == before


@pytest.mark.parametrize(
    "key",
    [
        "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3Jvbmc=",
        "not-base64-at-all!",
    ],
    ids=["wrong-key", "malformed-key"],
)
def test_azure_wrong_key_is_misconfigured(
    azure_container: AzureContainer, azurite_server: AzuriteServer, key: str
) -> None:
    before = azure_container.snapshot()
    connection_string = azurite_server.connection_string_with_key(key)
    settings = replace(azure_container.settings(), azure_connection_string=connection_string)

    error, _ = timed_failure(store_from_settings(settings).check, StorageMisconfigured)

    message = str(error)
    assert f"'{azure_container.name}'" in message
    assert "AZURE_STORAGE_CONNECTION_STRING" in message
    assert ("access denied" in message) or ("account key is malformed" in message)
    assert_secret_free(message, key, connection_string)
    assert azure_container.snapshot() == before


def _account_sas(expiry: dt.datetime) -> str:
    return generate_account_sas(
        account_name=AZURITE_ACCOUNT,
        account_key=AZURITE_KEY,
        resource_types=ResourceTypes(container=True, object=True),
        permission=AccountSasPermissions(read=True, list=True),
        expiry=expiry,
    )


def test_azure_account_url_with_read_only_sas(azure_container: AzureContainer) -> None:
    before = azure_container.snapshot()
    now = dt.datetime.now(dt.UTC)
    good_sas = _account_sas(now + dt.timedelta(hours=1))
    expired_sas = _account_sas(now - dt.timedelta(hours=1))
    settings = replace(
        azure_container.settings(),
        azure_connection_string=None,
        azure_account_url=azure_container.account_url,
    )

    store_from_settings(settings, environ={"AZURE_STORAGE_CREDENTIAL": good_sas}).check()

    error, _ = timed_failure(
        store_from_settings(settings, environ={"AZURE_STORAGE_CREDENTIAL": expired_sas}).check,
        StorageMisconfigured,
    )
    assert "access denied" in str(error)
    assert "AZURE_STORAGE_CREDENTIAL" in str(error)
    signature = expired_sas.split("sig=")[1]
    assert_secret_free(str(error), expired_sas, signature)

    missing = replace(settings, azure_container=unique_name("missing"))
    error, _ = timed_failure(
        store_from_settings(missing, environ={"AZURE_STORAGE_CREDENTIAL": good_sas}).check,
        StorageMisconfigured,
    )
    assert "does not exist" in str(error)
    assert_secret_free(str(error), good_sas, good_sas.split("sig=")[1])

    # Anonymous (no credential) only reaches public containers: this one is private.
    with pytest.raises(StorageMisconfigured, match=r"access denied|does not exist"):
        store_from_settings(settings, environ={}).check()
    assert azure_container.snapshot() == before


def test_azure_account_url_with_account_key(azure_container: AzureContainer) -> None:
    settings = replace(
        azure_container.settings(),
        azure_connection_string=None,
        azure_account_url=azure_container.account_url,
    )
    store = store_from_settings(settings, environ={"AZURE_STORAGE_CREDENTIAL": AZURITE_KEY})
    assert AZURITE_KEY not in repr(store)
    store.check()


def test_azure_outage_is_transient_and_recovers_on_the_same_port(
    azure_container: AzureContainer, azurite_server: AzuriteServer
) -> None:
    put_blobs(azure_container)
    before = azure_container.snapshot()
    store = store_from_settings(azure_container.settings())
    port = azurite_server.port

    azurite_server.stop()
    try:
        error, elapsed = timed_failure(store.check, StorageUnavailable)
    finally:
        azurite_server.start()

    print(f"azure check against a stopped Azurite failed in {elapsed:.3f} s: {error}")
    assert azurite_server.port == port
    assert "unreachable" in str(error)
    assert f"'{azure_container.name}'" in str(error)
    assert_secret_free(str(error), AZURITE_KEY)
    store.check()
    assert azure_container.snapshot() == before


def test_azure_hung_endpoint_times_out_quickly(hung_endpoint: str) -> None:
    connection_string = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={hung_endpoint}/{AZURITE_ACCOUNT};"
    )
    store = AzureBlobStore(container=unique_name(), connection_string=connection_string)

    error, elapsed = timed_failure(store.check, StorageUnavailable)

    print(f"azure check against a hung endpoint failed in {elapsed:.3f} s: {error}")
    assert "timed out" in str(error)
    assert_secret_free(str(error), AZURITE_KEY)
    assert elapsed < SANITY_BOUND_SECONDS


@pytest.mark.parametrize("failing_endpoint", [500, 503, 429], indirect=True)
def test_azure_server_errors_and_throttling_are_transient(failing_endpoint: str) -> None:
    store = AzureBlobStore(
        container=unique_name(), account_url=f"{failing_endpoint}/{AZURITE_ACCOUNT}"
    )
    error, _ = timed_failure(store.check, StorageUnavailable)
    assert "retried" in str(error)


# --- store_from_settings -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        (Settings(object_store_provider="gcs"), "OBJECT_STORE_PROVIDER='gcs' is not one of"),
        (Settings(object_store_provider="s3"), "needs S3_BUCKET"),
        (
            Settings(object_store_provider="s3", s3_bucket="b-1", s3_addressing_style="sideways"),
            "S3_ADDRESSING_STYLE='sideways' is not one of",
        ),
        (
            Settings(object_store_provider="s3", s3_bucket="b-1", s3_endpoint_url="minio:9000"),
            "S3_ENDPOINT_URL must be an http:// or https:// URL",
        ),
        (
            Settings(object_store_provider="azure", azure_connection_string="AccountName=a;"),
            "needs AZURE_STORAGE_CONTAINER",
        ),
        (
            Settings(object_store_provider="azure", azure_container="c-1"),
            "needs AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL",
        ),
        (
            Settings(
                object_store_provider="azure",
                azure_container="c-1",
                azure_connection_string="AccountKey=s3cr3t-value;Nonsense=1",
            ),
            "names neither AccountName nor BlobEndpoint",
        ),
    ],
    ids=[
        "unknown-provider",
        "s3-no-bucket",
        "s3-bad-style",
        "s3-bad-endpoint",
        "azure-no-container",
        "azure-no-account",
        "azure-bad-connection-string",
    ],
)
def test_store_from_settings_refuses(settings: Settings, needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        store_from_settings(settings)
    message = str(info.value)
    assert needle in message
    assert_secret_free(message, "s3cr3t-value")


def test_store_from_settings_builds_each_provider(tmp_path: object) -> None:
    s3 = store_from_settings(
        Settings(object_store_provider="s3", s3_bucket="b-1", s3_region="eu-west-1")
    )
    azure = store_from_settings(
        Settings(
            object_store_provider="azure",
            azure_container="c-1",
            azure_account_url="https://acct.blob.core.windows.net",
        ),
        environ={"AZURE_STORAGE_CREDENTIAL": "sv=2024&sig=s3cr3t"},
    )
    filesystem = store_from_settings(Settings())
    assert (s3.provider, azure.provider, filesystem.provider) == ("s3", "azure", "filesystem")
    assert s3.describe() == "s3 bucket 'b-1'"
    assert azure.describe() == "azure container 'c-1' at https://acct.blob.core.windows.net"
    assert "s3cr3t" not in repr(azure)
