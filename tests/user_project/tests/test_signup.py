"""The application's tests, on real tenant schemas from the provisioner plugin's fixtures."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest
import sqlalchemy as sa
from signup_app import add_dataset, dataset_names, sign_up, sign_up_async
from sqlalchemy.orm import Session

import provisioner
from provisioner.testing import Tenant
from provisioner.testing.pytest_plugin import ProvisionerWorker


def sqlalchemy_engine(url: str) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def test_sign_up_commits_the_job_with_the_business_write(
    provisioner_settings: provisioner.Settings,
) -> None:
    engine = sqlalchemy_engine(provisioner_settings.app_url)
    with Session(engine) as session:
        sign_up(session, "rolled_back", "Never Mind Ltd")
        session.rollback()
    with pytest.raises(provisioner.UnknownTenant):
        provisioner.status("rolled_back", settings=provisioner_settings)

    with Session(engine) as session, session.begin():
        job = sign_up(session, "acme", "Acme Corp")
    current = provisioner.status("acme", settings=provisioner_settings)
    assert current.job.id == job.id
    assert current.job.status is provisioner.JobStatus.QUEUED
    engine.dispose()


def test_a_psycopg2_session_is_refused_before_anything_is_written(
    provisioner_settings: provisioner.Settings,
) -> None:
    url = provisioner_settings.app_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    engine = sa.create_engine(url)
    with Session(engine) as session, pytest.raises(provisioner.InvalidInput, match="psycopg 3"):
        sign_up(session, "old_driver", "Old Driver Inc")
    engine.dispose()
    with pytest.raises(provisioner.UnknownTenant):
        provisioner.status("old_driver", settings=provisioner_settings)


def test_sign_up_from_an_async_handler(provisioner_settings: provisioner.Settings) -> None:
    async def handler() -> provisioner.Job:
        async with await psycopg.AsyncConnection.connect(provisioner_settings.app_url) as conn:
            return await sign_up_async(conn, "async_co")  # committed when the block exits

    job = asyncio.run(handler())
    assert provisioner.status("async_co", settings=provisioner_settings).job.id == job.id


def test_provision_now_through_the_api(provisioner_settings: provisioner.Settings) -> None:
    result = provisioner.provision("provisioned_now", settings=provisioner_settings)
    assert result.job.status is provisioner.JobStatus.SUCCEEDED


@pytest.mark.parametrize("attempt", range(4))
def test_each_test_gets_a_fresh_tenant(tenant: Tenant, attempt: int) -> None:
    # datasets.name is unique: a tenant shared between tests (or xdist workers) would fail here.
    with tenant.connect() as conn:
        assert dataset_names(conn) == []
        add_dataset(conn, "sales")
        assert dataset_names(conn) == ["sales"]


def test_tenants_do_not_see_each_other(tenant_factory: Callable[..., Tenant]) -> None:
    north, south = tenant_factory("north"), tenant_factory("south")
    with north.connect() as conn:
        add_dataset(conn, "north only")
    with south.connect() as conn:
        assert dataset_names(conn) == []


def test_the_orm_side_of_a_tenant(tenant: Tenant) -> None:
    engine = tenant.sqlalchemy_engine()
    with Session(engine) as session, session.begin():
        session.execute(sa.text("INSERT INTO datasets (name) VALUES ('from the orm')"))
    with Session(engine) as session:
        assert session.execute(sa.text("SELECT name FROM datasets")).scalars().all() == [
            "from the orm"
        ]
    engine.dispose()


@pytest.mark.parametrize("attempt", range(2))
def test_a_sign_up_is_provisioned_by_draining_the_queue(
    provisioner_settings: provisioner.Settings,
    provisioner_worker: ProvisionerWorker,
    attempt: int,
) -> None:
    # Both attempts sign the same customer up: what the first left is swept after it.
    with pytest.raises(provisioner.UnknownTenant):
        provisioner.status("globex", settings=provisioner_settings)
    engine = sqlalchemy_engine(provisioner_settings.app_url)
    with Session(engine) as session, session.begin():
        sign_up(session, "globex", "Globex Corporation")
    engine.dispose()

    ran = provisioner_worker.drain()  # only this test's job: earlier tests' were swept too

    assert [(str(job.tenant_id), job.status) for job in ran] == [
        ("globex", provisioner.JobStatus.SUCCEEDED)
    ]
    current = provisioner.status("globex", settings=provisioner_settings)
    assert current.tenant is not None and current.tenant.state == "onboarding"
    with psycopg.connect(provisioner_settings.app_url, options="-c search_path=tenant_globex") as c:
        add_dataset(c, f"attempt {attempt}")
        assert dataset_names(c) == [f"attempt {attempt}"]
