"""pytest plugin: real S3 (moto) and Azure Blob (Azurite) servers, and a fresh bucket per test.

Load it from the root conftest with ``pytest_plugins = ["tests.storage_fixtures"]``.

Session fixtures (started once, stopped at the end; a server that cannot start FAILS the test):

* ``moto_server`` -> :class:`tests.object_servers.MotoS3Server`: ``endpoint_url``, ``port``,
  ``stop()``, ``start()``, ``running``, ``enforce_auth()``, ``disable_auth()``.
* ``azurite_server`` -> :class:`tests.object_servers.AzuriteServer`: ``endpoint_url`` (=
  ``account_url``), ``port``, ``connection_string``, ``connection_string_with_key(key)``,
  ``stop()``, ``start()``, ``running``.

Function fixtures (a new, empty, uniquely named bucket/container each; the server is restarted
first if an earlier test left it stopped; removed afterwards):

* ``moto_credentials`` - sets dummy ``AWS_*`` variables for the test (boto3 reads them, so the
  provisioner's S3 store does too) and hides any real AWS config from it.
* ``s3_bucket`` -> :class:`S3Bucket`: ``name``, ``endpoint_url``, ``client`` (a boto3 client
  with full rights), ``settings(base=None)`` (a ``Settings`` pointing at this bucket),
  ``snapshot()`` (every bucket and every object with its ETag, for "nothing changed" checks).
* ``azure_container`` -> :class:`AzureContainer`: ``name``, ``connection_string``,
  ``account_url``, ``service`` (a ``BlobServiceClient`` with the account key),
  ``settings(base=None)``, ``snapshot()``.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import boto3
import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobServiceClient

from provisioner.settings import Settings
from tests.object_servers import AzuriteServer, MotoS3Server, ServerStartError

MOTO_REGION = "us-east-1"
MOTO_ACCESS_KEY = "testing-access-key"
MOTO_SECRET_KEY = "testing-secret-key"  # moto accepts any key while IAM is not enforced


def unique_name(prefix: str = "t") -> str:
    """A lower-case name valid as an S3 bucket and an Azure container (3-63 chars)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@dataclass
class S3Bucket:
    name: str
    endpoint_url: str
    client: Any

    def settings(self, base: Settings | None = None) -> Settings:
        return replace(
            base or Settings(),
            object_store_provider="s3",
            s3_bucket=self.name,
            s3_endpoint_url=self.endpoint_url,
            s3_region=MOTO_REGION,
            s3_addressing_style="path",
        )

    def snapshot(self) -> dict[str, object]:
        """All bucket names, and this bucket's objects with size and ETag."""
        buckets = sorted(b["Name"] for b in self.client.list_buckets()["Buckets"])
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name)
        objects = sorted(
            (o["Key"], o["Size"], o["ETag"]) for page in pages for o in page.get("Contents", [])
        )
        return {"buckets": buckets, "objects": objects}


@dataclass
class AzureContainer:
    name: str
    connection_string: str
    account_url: str
    service: BlobServiceClient

    def settings(self, base: Settings | None = None) -> Settings:
        return replace(
            base or Settings(),
            object_store_provider="azure",
            azure_container=self.name,
            azure_connection_string=self.connection_string,
            azure_account_url=None,
        )

    def snapshot(self) -> dict[str, object]:
        """All container names, this container's ETag and metadata, its blobs with ETags."""
        containers = sorted(c.name for c in self.service.list_containers())
        container = self.service.get_container_client(self.name)
        props = container.get_container_properties()
        blobs = sorted((b.name, b.size, b.etag) for b in container.list_blobs())
        return {
            "containers": containers,
            "etag": props.etag,
            "metadata": dict(props.metadata or {}),
            "blobs": blobs,
        }


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoS3Server]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = MotoS3Server()
    try:
        server.start()
    except ServerStartError as exc:
        pytest.fail(f"moto S3 server could not start: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[AzuriteServer]:
    server = AzuriteServer()
    try:
        server.start()
    except ServerStartError as exc:
        server.close()
        pytest.fail(f"Azurite could not start: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def moto_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Dummy AWS credentials for this test, and no real AWS configuration leaking in."""
    empty = tmp_path_factory.mktemp("aws") / "none"
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", MOTO_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MOTO_SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", MOTO_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def s3_bucket(moto_server: MotoS3Server, moto_credentials: None) -> Iterator[S3Bucket]:
    if not moto_server.running:
        moto_server.start()
    client = boto3.client(
        "s3",
        endpoint_url=moto_server.endpoint_url,
        region_name=MOTO_REGION,
        aws_access_key_id=MOTO_ACCESS_KEY,
        aws_secret_access_key=MOTO_SECRET_KEY,
    )
    bucket = S3Bucket(name=unique_name(), endpoint_url=moto_server.endpoint_url, client=client)
    client.create_bucket(Bucket=bucket.name)
    try:
        yield bucket
    finally:
        if not moto_server.running:
            moto_server.start()
        with contextlib.suppress(client.exceptions.NoSuchBucket):
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket.name)
            for page in pages:
                for obj in page.get("Contents", []):
                    client.delete_object(Bucket=bucket.name, Key=obj["Key"])
            client.delete_bucket(Bucket=bucket.name)
        client.close()


@pytest.fixture
def azure_container(azurite_server: AzuriteServer) -> Iterator[AzureContainer]:
    if not azurite_server.running:
        azurite_server.start()
    service = BlobServiceClient.from_connection_string(azurite_server.connection_string)
    container = AzureContainer(
        name=unique_name(),
        connection_string=azurite_server.connection_string,
        account_url=azurite_server.account_url,
        service=service,
    )
    service.create_container(container.name)
    try:
        yield container
    finally:
        if not azurite_server.running:
            azurite_server.start()
        with contextlib.suppress(ResourceNotFoundError):
            service.delete_container(container.name)
        service.close()
