"""The storage readiness check as a provisioning step, end to end: real PostgreSQL (the root
conftest's ``settings``), real moto and Azurite, the real engine and queue.

A missing bucket is permanent (the job fails at once, naming the remedy); an outage is transient
(the job goes back to the queue with a readable error); in both cases provisioning again resumes
at ``verify_object_storage`` without re-running the database steps. The check never writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError

from provisioner import service
from provisioner.engine import StepEvent
from provisioner.kinds.provision import STEPS
from provisioner.models import JobStatus
from provisioner.settings import Settings
from tests.object_servers import AZURITE_KEY, AzuriteServer, MotoS3Server
from tests.storage_fixtures import MOTO_SECRET_KEY, AzureContainer, S3Bucket, unique_name

DATABASE_STEPS = STEPS[: STEPS.index("verify_object_storage")]


@dataclass
class Backend:
    """One provider's bucket/container and server, behind the same few verbs."""

    provider: str
    server: MotoS3Server | AzuriteServer
    secret: str
    point: Callable[[Settings, str | None], Settings]  # at the fixture's bucket, or a name
    create: Callable[[str], None]
    delete: Callable[[str], None]
    snapshot: Callable[[], dict[str, object]]


def _s3_backend(bucket: S3Bucket, server: MotoS3Server) -> Backend:
    def point(base: Settings, name: str | None) -> Settings:
        settings = bucket.settings(base)
        return replace(settings, s3_bucket=name) if name else settings

    def delete(name: str) -> None:
        with contextlib.suppress(bucket.client.exceptions.NoSuchBucket):
            bucket.client.delete_bucket(Bucket=name)

    bucket.client.put_object(Bucket=bucket.name, Key="existing/object.txt", Body=b"keep me")
    return Backend(
        provider="s3",
        server=server,
        secret=MOTO_SECRET_KEY,
        point=point,
        create=lambda name: bucket.client.create_bucket(Bucket=name),
        delete=delete,
        snapshot=bucket.snapshot,
    )


def _azure_backend(container: AzureContainer, server: AzuriteServer) -> Backend:
    def point(base: Settings, name: str | None) -> Settings:
        settings = container.settings(base)
        return replace(settings, azure_container=name) if name else settings

    def delete(name: str) -> None:
        with contextlib.suppress(ResourceNotFoundError):
            container.service.delete_container(name)

    blobs = container.service.get_container_client(container.name)
    blobs.upload_blob("existing/object.txt", b"keep me")
    return Backend(
        provider="azure",
        server=server,
        secret=AZURITE_KEY,
        point=point,
        create=lambda name: container.service.create_container(name),
        delete=delete,
        snapshot=container.snapshot,
    )


@pytest.fixture(params=["s3", "azure"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Starts only the server the parameter needs."""
    if request.param == "s3":
        return _s3_backend(
            request.getfixturevalue("s3_bucket"), request.getfixturevalue("moto_server")
        )
    return _azure_backend(
        request.getfixturevalue("azure_container"), request.getfixturevalue("azurite_server")
    )


@pytest.fixture
def extra_names(backend: Backend) -> Iterator[list[str]]:
    """Buckets/containers a test creates besides the fixture's; deleted afterwards."""
    names: list[str] = []
    yield names
    if not backend.server.running:
        backend.server.start()
    for name in names:
        backend.delete(name)


class Events:
    """Collects the engine's progress events as (step, outcome) pairs."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, event: StepEvent) -> None:
        self.seen.append((event.step, event.outcome))

    def outcomes(self, outcome: str) -> list[str]:
        return [step for step, seen in self.seen if seen == outcome]


def step_runs(settings: Settings, tenant: str) -> list[dict[str, Any]]:
    return service.status(settings, tenant).step_runs


def test_provisioning_checks_storage_and_writes_nothing(
    settings: Settings, backend: Backend
) -> None:
    store_settings = backend.point(settings, None)
    before = backend.snapshot()
    events = Events()

    result = service.provision(store_settings, "acme", on_progress=events)

    job = result.job
    assert job.status is JobStatus.SUCCEEDED, job.error_detail
    assert job.steps_completed == list(STEPS)
    assert job.attempts == 1
    assert job.error_detail is None
    assert events.outcomes("done") == list(STEPS)
    verify = [r for r in step_runs(store_settings, "acme") if r["step"] == "verify_object_storage"]
    assert [r["outcome"] for r in verify] == ["succeeded"]
    assert backend.provider in verify[0]["detail"]
    assert backend.snapshot() == before


def test_missing_bucket_fails_at_once_then_resumes_at_the_storage_step(
    settings: Settings, backend: Backend, extra_names: list[str]
) -> None:
    missing = unique_name("missing")
    store_settings = backend.point(settings, missing)
    before = backend.snapshot()

    first = service.provision(store_settings, "acme").job

    assert first.status is JobStatus.FAILED  # permanent: not queued for a retry
    assert first.attempts == 1
    assert first.steps_completed == list(DATABASE_STEPS)
    detail = first.error_detail or ""
    assert detail.startswith("verify_object_storage: ")
    assert f"'{missing}'" in detail
    assert "does not exist" in detail
    assert ("create the bucket" in detail) or ("create the container" in detail)
    assert backend.secret not in detail
    assert backend.snapshot() == before  # the failed check created nothing
    runs_before = step_runs(store_settings, "acme")
    assert [(r["step"], r["outcome"]) for r in runs_before] == [
        *((step, "succeeded") for step in DATABASE_STEPS),
        ("verify_object_storage", "failed"),
    ]

    extra_names.append(missing)
    backend.create(missing)
    events = Events()
    second = service.provision(store_settings, "acme", on_progress=events).job

    assert second.status is JobStatus.SUCCEEDED, second.error_detail
    assert second.id == first.id
    assert second.steps_completed == list(STEPS)
    assert second.error_detail is None
    assert events.outcomes("skipped") == list(DATABASE_STEPS)
    assert events.outcomes("done") == ["verify_object_storage", "activate_onboarding"]
    runs_after = step_runs(store_settings, "acme")
    assert runs_after[: len(runs_before)] == runs_before  # history kept
    new_runs = runs_after[len(runs_before) :]
    assert [(r["step"], r["outcome"]) for r in new_runs] == [
        ("verify_object_storage", "succeeded"),
        ("activate_onboarding", "succeeded"),
    ]


def test_outage_requeues_with_backoff_then_succeeds_after_restart(
    settings: Settings, backend: Backend
) -> None:
    store_settings = backend.point(settings, None)
    before = backend.snapshot()
    port = backend.server.port

    backend.server.stop()
    try:
        first = service.provision(store_settings, "acme").job
    finally:
        backend.server.start()

    assert first.status is JobStatus.QUEUED  # transient: the queue's backoff retries it
    assert first.attempts == 1
    assert first.available_at is not None
    assert first.updated_at is not None
    assert first.available_at > first.updated_at  # a retry is scheduled, not immediate
    assert first.steps_completed == list(DATABASE_STEPS)
    detail = first.error_detail or ""
    print(f"{backend.provider} outage error_detail: {detail}")
    assert detail.startswith("verify_object_storage: ")
    assert "unreachable" in detail
    assert "retried" in detail
    assert backend.secret not in detail
    assert "\n" not in detail

    assert backend.server.port == port
    events = Events()
    second = service.provision(store_settings, "acme", on_progress=events).job

    assert second.status is JobStatus.SUCCEEDED, second.error_detail
    assert second.id == first.id
    assert second.attempts == 2
    assert second.error_detail is None
    assert events.outcomes("skipped") == list(DATABASE_STEPS)
    runs = step_runs(store_settings, "acme")
    verify = [(r["attempt"], r["outcome"]) for r in runs if r["step"] == "verify_object_storage"]
    assert verify == [(1, "failed"), (2, "succeeded")]
    for step in DATABASE_STEPS:
        assert [r["attempt"] for r in runs if r["step"] == step] == [1], step
    assert backend.snapshot() == before
