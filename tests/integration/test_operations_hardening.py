"""Operations hardening (issue 27, items 13, 15 and 16), each reproduced the way it was found.

* Item 13: a long ``app_rw`` transaction holding a lock on a tenant table; the upgrade's and
  the purge's lock timeouts are waited out (retried with backoff, no attempt spent), the
  rollout's brake is not tripped, and both finish once the application's transaction ends.
* Item 15: bad settings and flags through the CLI as a subprocess: one line, exit 2, nothing
  touched; an application role a revoke cannot cut off is refused before anything is granted
  or revoked, and a suspension checks the role's effective access after its revoke.
* Item 16: a pipeline whose first statement fails is left cleanly, every time.
"""

from __future__ import annotations

import logging
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from provisioner import db, service
from provisioner.settings import Settings
from tests.conftest import Database, run_cli
from tests.integration.test_fleet_upgrade import (  # noqa: F401 -- provision_fleet: a fixture
    Fleet,
    make_tree,
    provision_fleet,
    use_tree,
    versions,
)
from tests.workers import Workers, wait_until

LIFECYCLE_TYPES = "provision_tenant,suspend_tenant,restore_tenant,deprovision_tenant,purge_tenant"


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def one_line(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def jobs_of(database: Database, tenant: str) -> list[dict[str, Any]]:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT * FROM control.platform_jobs WHERE tenant_id = %s ORDER BY created_at",
            (tenant,),
        ).fetchall()


def job_of(database: Database, tenant: str, job_type: str) -> dict[str, Any]:
    (job,) = [j for j in jobs_of(database, tenant) if j["job_type"] == job_type]
    return job


def tenant_state(database: Database, tenant: str) -> str | None:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT state FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    return None if row is None else str(row[0])


def app_reads(database: Database, tenant: str) -> bool:
    """Whether app_rw, over a new connection, can read the tenant's role profiles."""
    try:
        with database.app() as conn:
            conn.execute(f"SELECT count(*) FROM tenant_{tenant}.role_profiles").fetchone()
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable):
        return False
    return True


def schema_exists(database: Database, tenant: str) -> bool:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (f"tenant_{tenant}",)
        ).fetchone()
    return row == (1,)


def latest_rollout(database: Database) -> dict[str, Any]:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM control.rollouts ORDER BY id DESC LIMIT 1").fetchone()
    assert row is not None
    return row


# -- item 13: lock timeouts behind an application's transaction ---------------------------------


def test_an_upgrade_waits_out_an_application_transaction_and_never_trips_the_brake(
    fast: Settings,
    database: Database,
    workers: Workers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provision_fleet: Fleet,  # noqa: F811
) -> None:
    provision_fleet(fast, ["busy", "calm"])
    env = use_tree(monkeypatch, make_tree(tmp_path))
    env["PROVISIONER_LOCK_TIMEOUT_SECONDS"] = "0.2"
    holder = psycopg.connect(database.app_url)  # a long application transaction
    holder.execute("SELECT count(*) FROM tenant_busy.audit_events")
    service.upgrade(fast, max_failures=1)
    with database.owner() as conn:  # two attempts in all: the waits must not spend them
        conn.execute("UPDATE control.platform_jobs SET max_attempts = 2 WHERE tenant_id = 'busy'")
    workers.start(env=env)

    waited = wait_until(
        lambda: (job := job_of(database, "busy", "provision_tenant"))["lock_waits"] >= 4 and job,
        90,
        "the upgrade to give up waiting for the lock four times",
    )
    assert waited["status"] in ("queued", "running"), waited
    assert waited["attempts"] <= 1 and "lock timeout" in str(waited["error_detail"])
    assert latest_rollout(database)["state"] == "running"
    assert versions(database, "calm") == ["t005"] and versions(database, "busy") == ["t004"]

    holder.commit()  # the application's transaction ends: the next try goes through
    holder.close()
    done = wait_until(
        lambda: (
            (job := job_of(database, "busy", "provision_tenant"))["status"] == "succeeded" and job
        ),
        90,
        "the upgrade once the lock is free",
    )
    print(f"\nthe upgrade gave up waiting for the lock {waited['lock_waits']}+ times, then ran")
    assert versions(database, "busy") == ["t005"]
    assert (done["attempts"], done["lock_waits"]) == (1, 0)
    assert latest_rollout(database)["state"] in ("running", "completed")
    with database.owner() as conn:
        failed = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE status = 'failed'"
        ).fetchone()
    assert failed == (0,)


def test_a_purge_waits_out_an_application_transaction_instead_of_hanging(
    fast: Settings, database: Database, workers: Workers
) -> None:
    service.provision(fast, "gone")
    env = {"PROVISIONER_LOCK_TIMEOUT_SECONDS": "0.2"}
    holder = psycopg.connect(database.app_url)  # a long application transaction
    holder.execute("SELECT count(*) FROM tenant_gone.role_profiles")

    # In the foreground the purge revokes, gives up on the drop after the lock timeout and
    # leaves the job queued for a worker: it returns instead of waiting as long as the
    # application's transaction lives.
    first = run_cli(fast, "deprovision", "gone", "--purge", "--yes", env=env, timeout=60)
    assert first.returncode == 1, (first.stdout, first.stderr)
    purge = job_of(database, "gone", "purge_tenant")
    assert (purge["status"], purge["lock_waits"]) == ("queued", 1), purge
    assert "lock timeout" in str(purge["error_detail"])
    assert not app_reads(database, "gone")  # cut off already: the revoke step committed
    assert schema_exists(database, "gone")
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET max_attempts = 1 WHERE tenant_id = 'gone'")

    workers.start(env={**env, "PROVISIONER_WORKER_JOB_TYPES": LIFECYCLE_TYPES})
    wait_until(
        lambda: job_of(database, "gone", "purge_tenant")["lock_waits"] >= 3,
        90,
        "the purge to give up waiting for the lock three times",
    )
    assert job_of(database, "gone", "purge_tenant")["status"] in ("queued", "running")
    assert schema_exists(database, "gone")

    holder.commit()
    holder.close()
    wait_until(lambda: tenant_state(database, "gone") == "deleted", 90, "the purge")
    purge = job_of(database, "gone", "purge_tenant")
    assert (purge["status"], purge["attempts"], purge["lock_waits"]) == ("succeeded", 1, 0)
    assert not schema_exists(database, "gone")


# -- item 15: bad settings and flags ------------------------------------------------------------

BAD_NUMBERS = [
    ("PROVISIONER_JOB_STALE_AFTER_SECONDS", "nan", "finite"),
    ("PROVISIONER_JOB_STALE_AFTER_SECONDS", "inf", "finite"),
    ("PROVISIONER_JOB_STALE_AFTER_SECONDS", "-5", "positive"),
    ("PROVISIONER_LOCK_TIMEOUT_SECONDS", "nan", "finite"),
    ("PROVISIONER_LOCK_TIMEOUT_SECONDS", "inf", "finite"),
    ("PROVISIONER_LOCK_TIMEOUT_SECONDS", "0.0000001", "at least"),
    ("PROVISIONER_HEARTBEAT_SECONDS", "NaN", "finite"),
    ("PROVISIONER_POLL_SECONDS", "1e400", "finite"),
    ("PROVISIONER_DRAIN_TIMEOUT_SECONDS", "9999999999", "at most"),
    ("PROVISIONER_POOL_SIZE", "99999999999999999999", "between 0 and"),
    ("PROVISIONER_POOL_SIZE", "-1", "between 0 and"),
    # Digits str.isdigit takes and int() refuses: a traceback before
    ("PROVISIONER_METRICS_PORT", "\u00b2", "port number"),
    ("PROVISIONER_CONSOLE_PORT", "\u0661\u00b2", "port number"),
]


@pytest.mark.parametrize(("variable", "value", "says"), BAD_NUMBERS)
@pytest.mark.parametrize(
    "command", [("worker", "--once"), ("jobs", "list")], ids=["worker", "jobs"]
)
def test_a_bad_number_in_the_environment_is_one_line_and_exit_2(
    settings: Settings, variable: str, value: str, says: str, command: tuple[str, ...]
) -> None:
    result = run_cli(settings, *command, env={variable: value}, timeout=60)
    line = one_line(result)
    assert variable in line and says in line, line


def test_a_digit_int_cannot_read_in_the_tenant_id_length_is_one_line_and_exit_2(
    settings: Settings, database: Database
) -> None:
    env = {"PROVISIONER_TENANT_ID_MAX_LENGTH": "\u00b2"}
    for command in (("enqueue", "zz1"), ("worker", "--once")):
        line = one_line(run_cli(settings, *command, env=env, timeout=60))
        assert "PROVISIONER_TENANT_ID_MAX_LENGTH must be a whole number" in line, line
    assert jobs_of(database, "zz1") == []


@pytest.mark.parametrize(
    "args",
    [
        ("worker", "--once", "--stale-after", "nan"),
        ("worker", "--once", "--heartbeat", "inf"),
        ("status", "acme", "--watch", "--interval", "nan"),
        ("upgrade", "--watch", "--interval", "nan"),
        ("jobs", "list", "--limit", "99999999999999999999"),
        ("upgrade", "--all", "--dry-run", "--canary", "99999999999"),
        ("upgrade", "--all", "--dry-run", "--max-failures", "3000000000"),
    ],
)
def test_a_flag_beyond_what_it_can_be_is_one_line_and_exit_2(
    settings: Settings, args: tuple[str, ...]
) -> None:
    service.enqueue(settings, "acme")
    line = one_line(run_cli(settings, *args, timeout=60))
    assert "Invalid value for" in line, line


def superuser_name(database: Database) -> str:
    with psycopg.connect(database.admin_url) as conn:
        row = conn.execute("SELECT current_user").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("role", ["superuser", "provisioner_owner", "nobody_by_that_name"])
def test_an_app_role_no_revoke_can_cut_off_is_refused_before_anything_changes(
    settings: Settings, database: Database, role: str
) -> None:
    service.provision(settings, "acme")
    name = superuser_name(database) if role == "superuser" else role
    env = {"PROVISIONER_APP_ROLE": name}

    refused = [
        one_line(run_cli(settings, "worker", "--once", env=env, timeout=60)),
        one_line(run_cli(settings, "suspend", "acme", env=env, timeout=60)),
        one_line(run_cli(settings, "deprovision", "acme", env=env, timeout=60)),
        one_line(run_cli(settings, "provision", "fresh", env=env, timeout=60)),
    ]
    for line in refused:
        assert f"application role {name} (app_roles / PROVISIONER_APP_ROLES)" in line, line
    # Nothing was revoked nor recorded as done: the tenant is onboarding and app_rw reads it.
    assert tenant_state(database, "acme") == "onboarding"
    assert app_reads(database, "acme")
    assert [j["job_type"] for j in jobs_of(database, "acme")] == ["provision_tenant"]
    assert jobs_of(database, "fresh") == [] and tenant_state(database, "fresh") is None


def test_a_suspension_never_reports_success_while_the_app_role_still_reads_the_tenant(
    settings: Settings, database: Database
) -> None:
    service.provision(settings, "leaky")
    with database.owner() as conn:  # access app_rw does not hold by name: through PUBLIC
        conn.execute("GRANT USAGE ON SCHEMA tenant_leaky TO PUBLIC")
        conn.execute("GRANT SELECT ON tenant_leaky.role_profiles TO PUBLIC")

    result = run_cli(settings, "suspend", "leaky", timeout=60)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "suspended" not in result.stdout.split("\n")[-2:], result.stdout
    job = job_of(database, "leaky", "suspend_tenant")
    assert job["status"] == "failed"
    assert "can still use tenant_leaky" in str(job["error_detail"])
    assert "role_profiles: SELECT" in str(job["error_detail"])
    assert tenant_state(database, "leaky") == "onboarding"

    with database.owner() as conn:
        conn.execute("REVOKE ALL ON SCHEMA tenant_leaky FROM PUBLIC")
        conn.execute("REVOKE ALL ON tenant_leaky.role_profiles FROM PUBLIC")
    assert run_cli(settings, "jobs", "retry", str(job["id"]), timeout=60).returncode == 0
    assert run_cli(settings, "suspend", "leaky", timeout=60).returncode == 0
    assert tenant_state(database, "leaky") == "suspended"
    assert not app_reads(database, "leaky")


def test_the_worker_refuses_an_app_url_the_app_role_does_not_reach(
    settings: Settings, database: Database
) -> None:
    role = f"other_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        result = run_cli(settings, "worker", "--once", env={"PROVISIONER_APP_ROLE": role})
        line = one_line(result)
        assert "APP_DATABASE_URL connects as app_rw" in line, line
        assert f"application role {role} (app_roles / PROVISIONER_APP_ROLES)" in line, line
    finally:
        with psycopg.connect(database.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("tree", ["missing", "empty", "no-revisions"])
def test_the_worker_refuses_a_tenant_tree_it_cannot_read(
    settings: Settings, tmp_path: Path, tree: str
) -> None:
    folder = tmp_path / "tree"
    if tree != "missing":
        folder.mkdir()
    if tree == "no-revisions":
        (folder / "versions").mkdir()
        (folder / "env.py").write_text("")
        (folder / "alembic.ini").write_text("[alembic]\nscript_location = .\n")
    result = run_cli(settings, "worker", "--once", env={"PROVISIONER_TENANT_TREE": str(folder)})
    line = one_line(result)
    assert "PROVISIONER_TENANT_TREE" in line and str(folder) in line, line


def nothing_of(database: Database, tenant: str) -> bool:
    """No control row, no job and no schema for ``tenant``."""
    return (
        tenant_state(database, tenant) is None
        and jobs_of(database, tenant) == []
        and not schema_exists(database, tenant)
    )


#: The commands that read the tenant tree, each refused before it creates or reads anything.
TREE_COMMANDS = [
    ("provision", "fresh"),
    ("tenants", "list"),
    ("upgrade", "--all", "--dry-run"),
    ("upgrade", "acme"),
    ("check", "--all"),
    ("repair", "acme", "--dry-run"),
]


@pytest.mark.parametrize("tree", ["missing", "empty"])
def test_commands_refuse_a_tenant_tree_they_cannot_read_before_anything_is_created(
    settings: Settings, database: Database, tmp_path: Path, tree: str
) -> None:
    service.provision(settings, "acme")
    folder = tmp_path / "tree"
    if tree == "empty":
        folder.mkdir()
    env = {"PROVISIONER_TENANT_TREE": str(folder)}
    for command in TREE_COMMANDS:
        line = one_line(run_cli(settings, *command, env=env, timeout=60))
        assert "PROVISIONER_TENANT_TREE" in line and str(folder) in line, (command, line)
    assert nothing_of(database, "fresh")  # no tenant placed, no job queued, no schema
    assert [j["job_type"] for j in jobs_of(database, "acme")] == ["provision_tenant"]


@pytest.mark.parametrize("seeds", ["/nonexistent/seed-dir", "nosuchmod:fn", "{tmp}/bad.sql"])
def test_seeds_that_cannot_be_used_are_refused_before_the_schema_is_built(
    settings: Settings, database: Database, tmp_path: Path, seeds: str
) -> None:
    (tmp_path / "bad.sql").write_bytes(b"INSERT INTO x VALUES ('\xff');\n")  # not UTF-8
    env = {"PROVISIONER_SEEDS": seeds.format(tmp=tmp_path)}
    line = one_line(run_cli(settings, "provision", "sd1", env=env, timeout=60))
    assert "PROVISIONER_SEEDS" in line, line
    assert nothing_of(database, "sd1")  # before: created, migrated and granted, then step 4
    worker = one_line(run_cli(settings, "worker", "--once", env=env, timeout=60))
    assert "PROVISIONER_SEEDS" in worker, worker


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("postgresql://u:s3cret-pw@127.0.0.1:99999/db", "invalid port '99999'"),
        ("postgresql://u:s3cret-pw@h1:5432,h2:0/db", "invalid port '0'"),
        ("host=127.0.0.1 port=70000 user=u password=s3cret-pw", "invalid port '70000'"),
        ("postgresql://u:s3cret-pw@127.0.0.1:5432/db?sslmode=bogus", "invalid sslmode value"),
        ("postgresql://u:s3cret-pw@127.0.0.1:5432/db?nosuch=1", "invalid URI query parameter"),
        (
            "postgresql://u:s3cret-pw@127.0.0.1:5432/db?keepalives_idle=soon",
            'invalid integer value "soon"',
        ),
    ],
)
@pytest.mark.parametrize(
    ("variable", "command"),
    [
        ("APP_DATABASE_URL", ("jobs", "list")),
        ("MIGRATIONS_DATABASE_URL", ("jobs", "retry", "--failed")),  # as the owner
    ],
    ids=["app", "owner"],
)
def test_a_database_address_that_can_never_work_is_a_setting_error_not_an_outage(
    settings: Settings, variable: str, command: tuple[str, ...], address: str, says: str
) -> None:
    result = run_cli(settings, *command, env={variable: address}, timeout=60)
    line = one_line(result)  # exit 2, not 1 ("database unavailable", retried by a worker)
    assert says in line and "unavailable" not in line, line
    assert "s3cret" not in result.stdout + result.stderr


# -- item 16: a failed pipeline is left cleanly -------------------------------------------------


def fail_in_a_pipeline(conn: psycopg.Connection[Any]) -> None:
    """A first statement that fails, 200 more in flight behind it, then its rows fetched."""
    with db.pipeline(conn):
        failing = conn.execute("SELECT * FROM control.no_such_table")
        for _ in range(200):
            conn.execute("SELECT 1")
        failing.fetchall()


def test_a_failed_pipeline_is_left_cleanly_every_time(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The first statement fails while many more are in flight (their answers: *pipeline
    aborted*): the error raised is the first one's, every time, and psycopg has nothing to warn
    about on leaving the pipeline (it used to, at random: issue 27, item 16)."""
    caplog.set_level(logging.WARNING, logger="psycopg")
    with psycopg.connect(database.owner_url) as conn:
        for _ in range(30):
            with pytest.raises(psycopg.errors.UndefinedTable):
                fail_in_a_pipeline(conn)
            conn.rollback()
            assert conn.execute("SELECT 2").fetchone() == (2,)  # the connection still serves
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
