"""The public API at the package top level: enqueue in the caller's transaction through the
connections an application holds, refusals before anything is written, and the exports."""

from __future__ import annotations

import asyncio
from importlib.resources import files

import psycopg
import psycopg2
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import provisioner
from provisioner import db
from provisioner.settings import Settings
from tests.conftest import Database


def tenant_rows(database: Database, tenant_id: str) -> tuple[int, int]:
    with database.owner() as conn:
        tenants = conn.execute(
            "SELECT count(*) FROM control.tenants WHERE tenant_id = %s", (tenant_id,)
        ).fetchone()
        jobs = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE tenant_id = %s", (tenant_id,)
        ).fetchone()
    assert tenants is not None and jobs is not None
    return tenants[0], jobs[0]


def test_the_top_level_exports_are_the_api_and_typed() -> None:
    for name in provisioner.__all__:
        assert getattr(provisioner, name) is not None
    assert files("provisioner").joinpath("py.typed").is_file()


def test_enqueue_joins_a_psycopg_transaction(database: Database) -> None:
    with psycopg.connect(database.app_url) as conn:
        provisioner.enqueue(conn, "acme")
        conn.rollback()
    assert tenant_rows(database, "acme") == (0, 0)
    with psycopg.connect(database.app_url) as conn:
        job = provisioner.enqueue(conn, "acme")
        again = provisioner.enqueue(conn, "acme")  # idempotent, even in one transaction
    assert again.id == job.id and job.status is provisioner.JobStatus.QUEUED
    assert tenant_rows(database, "acme") == (1, 1)


def test_enqueue_joins_a_sqlalchemy_connection_and_session(database: Database) -> None:
    engine = db.engine(database.app_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            provisioner.enqueue(conn, "from_connection")
        with Session(engine) as session, session.begin():
            provisioner.enqueue(session, "from_session")
        with pytest.raises(provisioner.InvalidInput, match="not an Engine"):
            provisioner.enqueue(engine, "from_engine")  # type: ignore[arg-type]
    finally:
        engine.dispose()
    assert tenant_rows(database, "from_connection") == (1, 1)
    assert tenant_rows(database, "from_session") == (1, 1)
    assert tenant_rows(database, "from_engine") == (0, 0)


def test_psycopg2_is_refused_before_anything_is_written(database: Database) -> None:
    conn = psycopg2.connect(database.app_url)
    try:
        with pytest.raises(provisioner.InvalidInput) as refused:
            provisioner.enqueue(conn, "old_driver")  # type: ignore[arg-type]
        assert "psycopg 3" in str(refused.value) and "\n" not in str(refused.value)
        with conn.cursor() as cur:  # the caller's transaction is untouched and still usable
            cur.execute("SELECT 1")
        conn.commit()
    finally:
        conn.close()
    engine = sa.create_engine(database.app_url.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        with Session(engine) as session, pytest.raises(provisioner.InvalidInput, match="psycopg2"):
            provisioner.enqueue(session, "old_driver")
    finally:
        engine.dispose()
    assert tenant_rows(database, "old_driver") == (0, 0)


def test_enqueue_async_joins_an_async_transaction(database: Database, settings: Settings) -> None:
    async def enqueue_twice(commit: bool) -> tuple[provisioner.Job, provisioner.Job]:
        conn = await psycopg.AsyncConnection.connect(database.app_url)
        try:
            first = await provisioner.enqueue_async(conn, "async_co")
            second = await provisioner.enqueue_async(conn, "async_co")
            await (conn.commit() if commit else conn.rollback())
            return first, second
        finally:
            await conn.close()

    asyncio.run(enqueue_twice(commit=False))
    assert tenant_rows(database, "async_co") == (0, 0)
    first, second = asyncio.run(enqueue_twice(commit=True))
    assert first.id == second.id
    assert provisioner.status("async_co", settings=settings).job.id == first.id
    with database.owner() as conn:  # the job's first run is on record, as a sync enqueue's
        runs = conn.execute(
            "SELECT run, started_by FROM control.job_runs WHERE job_id = %s", (first.id,)
        ).fetchall()
    assert runs == [(1, "enqueue")]

    async def sync_call_on_async_connection() -> None:
        async with await psycopg.AsyncConnection.connect(database.app_url) as conn:
            provisioner.enqueue(conn, "mixed_up")  # type: ignore[arg-type]

    with pytest.raises(provisioner.InvalidInput, match="use enqueue_async"):
        asyncio.run(sync_call_on_async_connection())
    assert tenant_rows(database, "mixed_up") == (0, 0)


def test_provision_and_status_through_the_api(settings: Settings) -> None:
    result = provisioner.provision("acme", settings=settings)
    assert result.job.status is provisioner.JobStatus.SUCCEEDED
    assert provisioner.provision("acme", settings=settings).already_provisioned
    assert provisioner.status("acme", settings=settings).tenant is not None
    assert provisioner.upgrade(["acme"], settings=settings, dry_run=True).behind == []
    with pytest.raises(provisioner.UnknownTenant):
        provisioner.status("nobody", settings=settings)
