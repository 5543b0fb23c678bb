"""Issue 27, items 1, 2, 3 and 6: no row, key or lock of the application role can stall or fool
the owner side. Each attack is made as it was found: over a real ``app_rw`` connection, with
the operator's CLI (real processes) and real workers running beside it.

* item 1: times Python cannot hold (year 20000, year 0) are refused by the tables;
* item 2: the lifecycle keys are the owner's: no product row may hold one;
* item 3: a running product row, the engine's old advisory locks held by ``app_rw`` sessions,
  or a table lock, never keep the operator from cutting a tenant off, nor stall a worker;
* item 6: ``status`` never headlines a product row (its times or its error text).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import psycopg
import pytest
from psycopg import errors
from psycopg.rows import dict_row

from provisioner import queue, service
from provisioner.models import JobStatus
from provisioner.settings import Settings
from tests.conftest import Database, run_cli
from tests.workers import Workers, job_row, wait_until

#: The old engine's step lock ('prov') and claim lock ('jobs'): any role may take them.
PROV, JOBS = 0x70726F76, 0x6A6F6273
#: How long an operator's command may take here before the test calls it hung.
PATIENCE = 60
#: A refusal by a constraint or by a row-level security policy.
REFUSED = (errors.CheckViolation, errors.InsufficientPrivilege)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def app(database: Database) -> psycopg.Connection:
    return psycopg.connect(database.app_url, autocommit=True, row_factory=dict_row)


def insert_job(conn: psycopg.Connection, **values: object) -> None:
    """An INSERT into control.platform_jobs of ``values`` (bound parameters)."""
    names = ", ".join(values)
    marks = ", ".join(["%s"] * len(values))
    conn.execute(
        f"INSERT INTO control.platform_jobs ({names}) VALUES ({marks})", list(values.values())
    )


def register(conn: psycopg.Connection, tenant: str) -> None:
    """Register the tenant as app_rw may (its control row, pending)."""
    conn.execute(
        "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s) "
        "ON CONFLICT DO NOTHING",
        (tenant, f"tenant_{tenant}"),
    )


def cli_ok(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """An operator's command, which must finish (not hang) and succeed in one piece."""
    done = run_cli(settings, *args, timeout=PATIENCE)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "too large" not in done.stderr + done.stdout
    return done


def tenant_state(database: Database, tenant: str) -> str:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT state FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def app_reads(database: Database, tenant: str) -> bool:
    """True when app_rw can still read the tenant's tables."""
    try:
        with database.app() as conn:
            conn.execute(f"SELECT count(*) FROM tenant_{tenant}.role_profiles").fetchone()
    except (errors.InsufficientPrivilege, errors.UndefinedTable):
        return False
    return True


# -- item 1: times Python cannot hold ---------------------------------------------------------

FAR = "20000-01-01 00:00:00+00"
BEFORE_ONE = "0001-01-01 00:00:00+00 BC"  # year 0: PostgreSQL holds it, Python does not

TIME_FORGERIES = {
    "provision created_at": {"job_type": "provision_tenant", "created_at": FAR},
    "provision updated_at": {"job_type": "provision_tenant", "updated_at": FAR},
    "provision created_at BC": {"job_type": "provision_tenant", "created_at": BEFORE_ONE},
    "product created_at": {"job_type": "send_email", "created_at": FAR},
    "product updated_at": {"job_type": "send_email", "updated_at": FAR},
    "product available_at": {"job_type": "send_email", "available_at": FAR},
    "product locked_at": {"job_type": "send_email", "status": "running", "locked_at": FAR},
    "product finished_at": {"job_type": "send_email", "status": "failed", "finished_at": FAR},
}


@pytest.mark.parametrize("forged", list(TIME_FORGERIES), ids=list(TIME_FORGERIES))
def test_app_rw_cannot_write_a_job_time_python_cannot_hold(database: Database, forged: str) -> None:
    values = {"tenant_id": "mallory", **TIME_FORGERIES[forged]}
    if values["job_type"] == "provision_tenant":
        values["idempotency_key"] = "provision:mallory"
    with app(database) as conn:
        register(conn, "mallory")
        with pytest.raises(REFUSED):
            insert_job(conn, **values)
    with database.owner() as conn:
        assert conn.execute("SELECT count(*) FROM control.platform_jobs").fetchone() == (0,)


def test_app_rw_cannot_move_its_own_rows_or_beats_out_of_python_range(
    database: Database,
) -> None:
    with app(database) as conn:
        register(conn, "mallory")
        insert_job(conn, tenant_id="mallory", job_type="send_email", idempotency_key="mail:1")
        for change in ("updated_at", "locked_at", "available_at", "finished_at"):
            with pytest.raises(errors.CheckViolation):
                conn.execute(
                    f"UPDATE control.platform_jobs SET {change} = %s WHERE job_type = 'send_email'",
                    (FAR,),
                )
        with pytest.raises(errors.CheckViolation):
            conn.execute(
                "INSERT INTO control.runtime_heartbeats (component, instance_id, heartbeat_at) "
                "VALUES ('provisioner-worker', 'forged', %s)",
                (FAR,),
            )
        conn.execute(
            "INSERT INTO control.runtime_heartbeats (component, instance_id) VALUES ('mine', 'a')"
        )
        with pytest.raises(errors.CheckViolation):
            conn.execute(
                "UPDATE control.runtime_heartbeats SET heartbeat_at = %s WHERE component = 'mine'",
                (FAR,),
            )
        job = conn.execute("SELECT id, run, job_type FROM control.platform_jobs").fetchone()
        assert job is not None
        with pytest.raises(errors.CheckViolation):
            conn.execute(
                "INSERT INTO control.job_runs (job_id, run, job_type, started_by, started_at) "
                "VALUES (%s, %s, %s, 'app', %s)",
                (job["id"], job["run"], job["job_type"], FAR),
            )


@pytest.mark.slow
def test_after_app_rw_tried_far_times_every_command_keeps_working(
    fast: Settings, database: Database, workers: Workers
) -> None:
    """The attack of issue 27 item 1, end to end: app_rw tries a provisioning row and a
    product row in year 20000 and a heartbeat in year 20000 (all refused); the worker still
    provisions, and health, jobs list, status, upgrade --all --dry-run and check --all answer."""
    with app(database) as conn:
        register(conn, "victim")
        with pytest.raises(REFUSED):
            insert_job(
                conn,
                tenant_id="victim",
                job_type="provision_tenant",
                idempotency_key="provision:victim",
                created_at=FAR,
            )
        with pytest.raises(errors.CheckViolation):
            insert_job(conn, tenant_id="victim", job_type="send_email", updated_at=FAR)
        with pytest.raises(errors.CheckViolation):
            conn.execute(
                "INSERT INTO control.runtime_heartbeats (component, instance_id, heartbeat_at) "
                "VALUES ('product-worker', 'p', %s)",
                (FAR,),
            )
        insert_job(  # the application's real sign-up
            conn,
            tenant_id="victim",
            job_type="provision_tenant",
            idempotency_key="provision:victim",
        )
    worker = workers.start()
    worker.wait_for("succeeded", 60, tenant_id="victim")
    wait_until(lambda: run_cli(fast, "health").returncode == 0, 30, "health to say ready")
    listed = json.loads(cli_ok(fast, "jobs", "list", "--json").stdout)
    assert [job["status"] for job in listed] == ["succeeded"]
    assert json.loads(cli_ok(fast, "status", "victim", "--json").stdout)["status"] == "succeeded"
    cli_ok(fast, "upgrade", "--all", "--dry-run")
    cli_ok(fast, "check", "--all")
    assert worker.stop() == 0, worker.output()


# -- item 2: the lifecycle keys are the owner's -----------------------------------------------

OWNER_KEYS = (
    "provision:{t}",
    "suspend_tenant:{t}",
    "deprovision_tenant:{t}",
    "purge_tenant:{t}",
    "restore_tenant:{t}",
)


@pytest.mark.slow
def test_no_product_row_can_hold_a_lifecycle_key_and_the_operator_cuts_the_tenant_off(
    settings: Settings, database: Database
) -> None:
    service.provision(settings, "acme")
    with app(database) as conn:
        for key in OWNER_KEYS:
            with pytest.raises(errors.InsufficientPrivilege):
                insert_job(
                    conn,
                    tenant_id="acme",
                    job_type="send_email",
                    idempotency_key=key.format(t="acme"),
                )
        insert_job(conn, tenant_id="acme", job_type="send_email", idempotency_key="mail:acme")
        for key in OWNER_KEYS:  # nor move its own row onto one
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(
                    "UPDATE control.platform_jobs SET idempotency_key = %s "
                    "WHERE idempotency_key = 'mail:acme'",
                    (key.format(t="acme"),),
                )
    assert app_reads(database, "acme")
    cli_ok(settings, "suspend", "acme")
    assert tenant_state(database, "acme") == "suspended" and not app_reads(database, "acme")
    cli_ok(settings, "restore", "acme")
    assert app_reads(database, "acme")
    cli_ok(settings, "deprovision", "acme")
    assert tenant_state(database, "acme") == "archived" and not app_reads(database, "acme")
    cli_ok(settings, "deprovision", "acme", "--purge", "--yes")
    assert tenant_state(database, "acme") == "deleted"
    with database.owner() as conn:  # the application's own row is untouched
        assert conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE idempotency_key = 'mail:acme'"
        ).fetchone() == (1,)


def test_product_keys_of_the_application_own_naming_still_work(database: Database) -> None:
    with app(database) as conn:
        register(conn, "acme")
        for key in ("mail:acme", "email:acme:1", "welcome:acme", "tenant:acme", "m:1"):
            insert_job(conn, tenant_id="acme", job_type="send_email", idempotency_key=key)
        insert_job(conn, tenant_id="acme", job_type="send_email")  # and no key at all


# -- item 3: no application row or lock holds the operator back --------------------------------


@contextmanager
def app_running_row(database: Database, tenant: str) -> Iterator[None]:
    """A product row of ``tenant`` that app_rw marks running with a lease far ahead, under a
    holder name its own open session carries (so it looks live to every check)."""
    holder = "product-worker:forever"
    with psycopg.connect(database.app_url, autocommit=True, application_name=holder) as conn:
        insert_job(
            conn,
            tenant_id=tenant,
            job_type="train_tenant_model",
            status="running",
            attempts=1,
            locked_by=holder,
            locked_at="9000-01-01 00:00:00+00",
        )
        yield


@contextmanager
def app_advisory_locks(database: Database, *tenants: str) -> Iterator[None]:
    """app_rw sessions holding the old engine's step and claim advisory locks of ``tenants``."""
    with app(database) as conn:
        for tenant in tenants:
            for lock_class in (PROV, JOBS):
                conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (lock_class, tenant))
        yield


@pytest.mark.slow
def test_a_running_product_row_never_holds_back_suspend_nor_purge(
    settings: Settings, database: Database
) -> None:
    service.provision(settings, "acme")
    with app_running_row(database, "acme"):
        cli_ok(settings, "suspend", "acme")
        assert tenant_state(database, "acme") == "suspended" and not app_reads(database, "acme")
        cli_ok(settings, "deprovision", "acme", "--purge", "--yes")
        assert tenant_state(database, "acme") == "deleted"


@pytest.mark.slow
def test_a_running_product_row_never_holds_back_a_workers_lifecycle_job(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.provision(fast, "acme")
    with app_running_row(database, "acme"):
        cli_ok(fast, "suspend", "acme", "--queue")
        worker = workers.start(env={"PROVISIONER_WORKER_JOB_TYPES": "suspend_tenant"})
        worker.wait_for("succeeded", 60, tenant_id="acme")
        assert tenant_state(database, "acme") == "suspended"
        assert worker.stop() == 0, worker.output()


@pytest.mark.slow
def test_app_rw_holding_the_engines_advisory_locks_cannot_hang_suspend_nor_purge(
    settings: Settings, database: Database
) -> None:
    service.provision(settings, "acme")
    with app_advisory_locks(database, "acme"), app(database) as key_share:
        # and an open application transaction whose foreign key share-locks the tenant's row
        key_share.execute("BEGIN")
        insert_job(key_share, tenant_id="acme", job_type="send_email", idempotency_key="mail:1")
        cli_ok(settings, "suspend", "acme")
        assert tenant_state(database, "acme") == "suspended" and not app_reads(database, "acme")
        cli_ok(settings, "deprovision", "acme", "--purge", "--yes")
        assert tenant_state(database, "acme") == "deleted"
        key_share.execute("ROLLBACK")


@pytest.mark.slow
def test_app_rw_holding_two_tenants_locks_stalls_no_worker_child(
    fast: Settings, database: Database, workers: Workers
) -> None:
    for tenant in ("north", "south"):
        service.provision(fast, tenant)
    with app_advisory_locks(database, "north", "south"):
        for tenant in ("north", "south"):
            cli_ok(fast, "suspend", tenant, "--queue")
        worker = workers.start(
            "--concurrency", "2", env={"PROVISIONER_WORKER_JOB_TYPES": "suspend_tenant"}
        )
        for tenant in ("north", "south"):
            wait_until(
                lambda t=tenant: job_row_of(database, t, "suspend_tenant") == "succeeded",
                60,
                f"{tenant}'s suspension",
            )
            assert tenant_state(database, tenant) == "suspended"
        assert worker.stop() == 0, worker.output()


def job_row_of(database: Database, tenant: str, job_type: str) -> str | None:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT status FROM control.platform_jobs WHERE tenant_id = %s AND job_type = %s",
            (tenant, job_type),
        ).fetchone()
    return None if row is None else str(row[0])


LOCKS_APP_RW_MAY_NOT_TAKE = {
    "the tenant's lock row": "SELECT 1 FROM control.tenant_locks FOR UPDATE",
    "the tenant's control row": "SELECT 1 FROM control.tenants FOR KEY SHARE",
    "the whole queue": "LOCK TABLE control.platform_jobs IN ACCESS EXCLUSIVE MODE",
    "every heartbeat": "LOCK TABLE control.runtime_heartbeats IN SHARE MODE",
    "the run records": "LOCK TABLE control.job_runs IN EXCLUSIVE MODE",
}


@pytest.mark.parametrize(
    "lock", list(LOCKS_APP_RW_MAY_NOT_TAKE), ids=list(LOCKS_APP_RW_MAY_NOT_TAKE)
)
def test_app_rw_cannot_take_a_lock_the_owner_side_waits_on(database: Database, lock: str) -> None:
    with psycopg.connect(database.app_url) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(LOCKS_APP_RW_MAY_NOT_TAKE[lock])


def test_a_product_worker_still_claims_and_settles_its_jobs_as_app_rw(database: Database) -> None:
    """The column privileges and the claim's try-lock leave the product side whole: a claim as
    app_rw, a running product row holding back only the application's own kinds."""
    with psycopg.connect(database.app_url, row_factory=dict_row) as conn:
        register(conn, "acme")
        queue.enqueue(conn, "send_email", tenant_id="acme", idempotency_key="mail:1")
        queue.enqueue(conn, "send_email", tenant_id="acme", idempotency_key="mail:2")
        conn.commit()
        first = queue.claim_next(conn, ["send_email"], "product-worker")
        assert first is not None and first.status is JobStatus.RUNNING
        assert queue.claim_next(conn, ["send_email"], "product-worker") is None  # one at a time
        done = queue.complete(conn, first.lease)
        conn.commit()
        assert done.status is JobStatus.SUCCEEDED
        assert queue.claim_next(conn, ["send_email"], "product-worker") is not None


# -- item 6: the headline of status is the owner's ---------------------------------------------


def test_status_never_headlines_an_application_row(settings: Settings, database: Database) -> None:
    service.provision(settings, "acme")
    with app(database) as conn:
        insert_job(
            conn,
            tenant_id="acme",
            job_type="send_email",
            status="failed",
            updated_at="9000-01-01 00:00:00+00",
            created_at="9000-01-01 00:00:00+00",
            finished_at="9000-01-01 00:00:00+00",
            error_detail="provisioning failed: contact support@evil.example",
        )
    shown = json.loads(cli_ok(settings, "status", "acme", "--json").stdout)
    assert (shown["job_type"], shown["status"]) == ("provision_tenant", "succeeded")
    assert shown["error_detail"] is None
    text = cli_ok(settings, "status", "acme").stdout
    assert "evil.example" not in text
    assert job_row(database, "acme")["status"] == "succeeded"
