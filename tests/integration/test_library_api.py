"""The library covers what the CLI does (issue 24, item 7): enqueue_async through SQLAlchemy's
AsyncSession and AsyncConnection, status read on the caller's connection, and typed Python
functions for suspend, restore, deprovision and purge, check and health, on real PostgreSQL."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import provisioner
from provisioner import db
from provisioner.settings import Settings
from tests.conftest import Database
from tests.integration.test_api import tenant_rows


def test_enqueue_async_through_an_async_session_and_connection(database: Database) -> None:
    async def enqueue(commit: bool) -> None:
        engine = create_async_engine(
            database.app_url.replace("postgresql://", "postgresql+psycopg://", 1),
            poolclass=sa.pool.NullPool,
        )
        try:
            async with AsyncSession(engine) as session:
                job = await provisioner.enqueue_async(session, "async_session")
                assert job.tenant_id == "async_session"
                if commit:
                    await session.commit()
            async with engine.connect() as conn:
                await provisioner.enqueue_async(conn, "async_conn")
                if commit:
                    await conn.commit()
        finally:
            await engine.dispose()

    asyncio.run(enqueue(commit=False))
    assert tenant_rows(database, "async_session") == (0, 0)
    assert tenant_rows(database, "async_conn") == (0, 0)
    asyncio.run(enqueue(commit=True))
    assert tenant_rows(database, "async_session") == (1, 1)
    assert tenant_rows(database, "async_conn") == (1, 1)


def test_enqueue_async_refuses_an_async_engine_on_another_driver(database: Database) -> None:
    """asyncpg is not installed here, so the refusal is shown through a wrong object type."""

    async def wrong() -> None:
        await provisioner.enqueue_async(object(), "x")  # type: ignore[arg-type]

    with pytest.raises(provisioner.InvalidInput, match="needs a psycopg 3 connection"):
        asyncio.run(wrong())


def test_status_on_the_callers_connection_sees_its_own_transaction(database: Database) -> None:
    engine = db.engine(database.app_url, poolclass=sa.pool.NullPool)
    try:
        with Session(engine) as session:
            job = provisioner.enqueue(session, "same_tx")
            # Not committed: only the caller's own transaction can see it.
            seen = provisioner.status("same_tx", conn=session)
            assert seen.job.id == job.id and seen.job.status is provisioner.JobStatus.QUEUED
            session.rollback()
    finally:
        engine.dispose()
    with psycopg.connect(database.app_url) as conn, pytest.raises(provisioner.UnknownTenant):
        provisioner.status("same_tx", conn=conn)


def test_lifecycle_check_and_health_from_code(settings: Settings, database: Database) -> None:
    assert provisioner.provision("life", settings=settings).job.status.value == "succeeded"
    report = provisioner.check(["life"], settings=settings)
    assert isinstance(report, provisioner.DriftReport) and not report.drifted

    suspended = provisioner.suspend("life", settings=settings)
    assert isinstance(suspended, provisioner.LifecycleResult)
    assert suspended.state == "suspended"
    with database.app() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT count(*) FROM tenant_life.role_profiles")
    assert provisioner.restore("life", settings=settings).state == "onboarding"
    with database.app() as conn:
        assert conn.execute("SELECT count(*) FROM tenant_life.role_profiles").fetchone() == (4,)

    assert provisioner.deprovision("life", settings=settings).state == "archived"
    assert provisioner.deprovision("life", purge=True, settings=settings).state == "deleted"
    with database.owner() as conn:
        gone = conn.execute("SELECT to_regnamespace('tenant_life')").fetchone()
    assert gone == (None,)

    health = provisioner.health(settings=settings)
    assert isinstance(health, provisioner.HealthReport) and health.ready is False  # no worker


def test_enqueue_on_a_connection_without_begin_commits_with_it(database: Database) -> None:
    """``engine.connect()`` then ``conn.commit()``, as SQLAlchemy 2.0's docs write it: the job
    goes out with the commit (it was left in a transaction SQLAlchemy never began)."""
    engine = db.engine(database.app_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            provisioner.enqueue(conn, "connect_commit")
            conn.commit()
    finally:
        engine.dispose()
    assert tenant_rows(database, "connect_commit") == (1, 1)
