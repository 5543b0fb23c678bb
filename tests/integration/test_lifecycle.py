"""suspend, restore, deprovision and purge through the real CLI, each end state checked from
outside as ``app_rw``; the state machine's refusals; a worker drains these kinds only when told.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import psycopg
import pytest
from click.testing import CliRunner

from provisioner import queue, service
from provisioner.cli import main
from provisioner.engine import Engine, runner
from provisioner.kinds.provision import PROVISION_JOB_TYPE, ensure_provision_job
from provisioner.models import TenantId
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from provisioner.testing import Tenant
from tests.conftest import Database, run_cli, settings_env
from tests.workers import Workers


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def cli(settings: Settings, *args: str) -> Ran:
    """The CLI in this process (click's runner: stdin is not a terminal), as a subprocess would
    see it: exit code, stdout, stderr."""
    result = CliRunner().invoke(main, list(args), env=settings_env(settings))
    return Ran(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def app_reads(database: Database, tenant: str) -> int | str:
    """As app_rw: the number of role profiles, or the error class when access is refused."""
    try:
        with database.app() as conn:
            row = conn.execute(f"SELECT count(*) FROM tenant_{tenant}.role_profiles").fetchone()
    except psycopg.errors.InsufficientPrivilege as exc:
        return "permission denied" if "permission denied" in str(exc) else str(exc)
    except psycopg.errors.UndefinedTable:
        return "no such table"
    assert row is not None
    return int(row[0])


def state(database: Database, tenant: str) -> tuple[str, str | None]:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT state, previous_state FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def schema_exists(database: Database, tenant: str) -> bool:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (f"tenant_{tenant}",)
        ).fetchone()
    return row == (1,)


def one_line_error(result: object, code: int, *needles: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)  # type: ignore[attr-defined]
    err: str = result.stderr  # type: ignore[attr-defined]
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert all(n in err for n in needles), err


def test_suspend_restore_deprovision_purge_seen_from_app_rw(
    provisioner_settings: Settings, tenant_database: Database, tenant_factory: Callable[..., Tenant]
) -> None:
    settings, database = provisioner_settings, tenant_database
    tenant_factory("acme")
    with database.owner() as conn:
        provisioned = fingerprint(conn, "tenant_acme")
    assert app_reads(database, "acme") == 4

    suspended = run_cli(settings, "suspend", "acme")  # once as a real process
    assert suspended.returncode == 0, suspended.stderr
    assert app_reads(database, "acme") == "permission denied"
    assert state(database, "acme") == ("suspended", "onboarding")
    with database.owner() as conn:  # the data is untouched
        assert conn.execute("SELECT count(*) FROM tenant_acme.role_profiles").fetchone() == (4,)

    again = cli(settings, "suspend", "acme", "--json")
    assert again.returncode == 0
    assert json.loads(again.stdout)["already"] is True

    restored = cli(settings, "restore", "acme", "--json")
    assert restored.returncode == 0, restored.stderr
    view = json.loads(restored.stdout)
    assert view["state"] == "onboarding" and view["status"] == "succeeded"
    assert app_reads(database, "acme") == 4
    assert state(database, "acme") == ("onboarding", None)
    with database.owner() as conn:  # privileges exactly as provisioning gave them
        assert fingerprint(conn, "tenant_acme") == provisioned

    archived = cli(settings, "deprovision", "acme")
    assert archived.returncode == 0, archived.stderr
    assert state(database, "acme") == ("archived", "onboarding")
    assert app_reads(database, "acme") == "permission denied"
    assert schema_exists(database, "acme")

    refused = cli(settings, "deprovision", "acme", "--purge")  # not a terminal, no --yes
    one_line_error(refused, 2, "--yes")
    assert schema_exists(database, "acme")

    purged = cli(settings, "deprovision", "acme", "--purge", "--yes", "--json")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout)["state"] == "deleted"
    assert not schema_exists(database, "acme")
    assert app_reads(database, "acme") == "no such table"
    with database.owner() as conn:  # the control rows and every job's history are kept
        kinds = conn.execute(
            "SELECT job_type, status FROM control.platform_jobs WHERE tenant_id = 'acme' "
            "ORDER BY created_at"
        ).fetchall()
        steps = conn.execute(
            "SELECT count(*) FROM control.job_step_runs WHERE tenant_id = 'acme'"
        ).fetchone()
    assert kinds == [
        ("provision_tenant", "succeeded"),
        ("suspend_tenant", "succeeded"),
        ("restore_tenant", "succeeded"),
        ("deprovision_tenant", "succeeded"),
        ("purge_tenant", "succeeded"),
    ]
    assert steps == (6 + 2 + 2 + 2 + 3,)

    # A purged id comes back only when asked for explicitly, from scratch.
    one_line_error(cli(settings, "provision", "acme"), 2, "deleted", "--reuse-deleted")
    one_line_error(cli(settings, "enqueue", "acme"), 2, "deleted")
    again = cli(settings, "provision", "acme", "--reuse-deleted")
    assert again.returncode == 0, again.stderr
    assert app_reads(database, "acme") == 4
    assert state(database, "acme") == ("onboarding", None)
    status = cli(settings, "status", "acme")
    assert "run 2  provision_tenant  started by `provision --reuse-deleted (repair)`" in (
        status.stdout
    )
    assert "run 1  purge_tenant  started by `deprovision --purge`" in status.stdout


def test_commands_refuse_wrong_states_and_unknown_tenants(
    provisioner_settings: Settings, tenant_database: Database, tenant_factory: Callable[..., Tenant]
) -> None:
    settings, database = provisioner_settings, tenant_database
    one_line_error(cli(settings, "suspend", "ghost"), 3, "unknown tenant ghost")
    tenant_factory("acme")
    one_line_error(cli(settings, "restore", "acme"), 2, "acme is onboarding")
    assert cli(settings, "suspend", "acme").returncode == 0
    one_line_error(cli(settings, "provision", "acme"), 2, "suspended", "restore")
    one_line_error(cli(settings, "enqueue", "acme"), 2, "suspended")
    assert app_reads(database, "acme") == "permission denied"  # provision gave nothing back
    assert cli(settings, "deprovision", "acme").returncode == 0
    assert state(database, "acme") == ("archived", "onboarding")
    one_line_error(cli(settings, "suspend", "acme"), 2, "acme is archived")
    assert cli(settings, "restore", "acme").returncode == 0
    assert state(database, "acme") == ("onboarding", None)


def test_a_refused_provision_prints_nothing_but_its_error(
    provisioner_settings: Settings, tenant_database: Database, tenant_factory: Callable[..., Tenant]
) -> None:
    """`provision` says "provisioning tenant T" once the request is accepted: refused for the
    tenant's state (known before any work), it prints its one-line error alone."""
    settings = provisioner_settings
    tenant_factory("acme")
    assert cli(settings, "suspend", "acme").returncode == 0
    for args in (("provision", "acme"), ("provision", "acme", "--reuse-deleted")):
        refused = cli(settings, *args)
        one_line_error(refused, 2, "acme is suspended", "restore")
        assert refused.stdout == "", refused.stdout
    assert cli(settings, "restore", "acme").returncode == 0
    again = cli(settings, "provision", "acme")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[:2] == [
        "provisioning tenant acme",
        "tenant acme is already provisioned; nothing to do",
    ]


def test_a_refused_lifecycle_command_prints_nothing_but_its_error(
    provisioner_settings: Settings, tenant_factory: Callable[..., Tenant]
) -> None:
    """`suspend`, `restore`, `deprovision` say "<command> tenant T" once the request is
    accepted: an unknown tenant, or a state the command does not apply to, prints its one-line
    error alone."""
    settings = provisioner_settings
    for command in ("suspend", "restore", "deprovision"):
        refused = cli(settings, command, "nobody")
        assert refused.returncode != 0 and refused.stdout == "", (command, refused.stdout)
        assert "unknown tenant nobody" in refused.stderr, refused.stderr
    tenant_factory("acme")
    refused = cli(settings, "restore", "acme")
    one_line_error(refused, 2, "restore applies to")
    assert refused.stdout == "", refused.stdout
    done = cli(settings, "suspend", "acme")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "suspend tenant acme"


def test_a_job_waits_while_another_job_of_its_tenant_runs(database: Database) -> None:
    tenant = TenantId("acme")
    with psycopg.connect(database.owner_url) as conn:
        provision = ensure_provision_job(conn, tenant).job
        conn.commit()
        claimed = queue.claim_next(conn, ["provision_tenant"], "holder-1")
        assert claimed is not None and claimed.id == provision.id
        queue.ensure_tenant_job(conn, tenant, "deprovision_tenant", "deprovision_tenant:acme")
        conn.commit()
        kinds = ["provision_tenant", "deprovision_tenant"]
        assert queue.claim_next(conn, kinds, "holder-2") is None  # waits for the provisioning
        queue.complete(conn, claimed.lease)
        conn.commit()
        follows = queue.claim_next(conn, kinds, "holder-2")
        assert follows is not None and follows.job_type == "deprovision_tenant"


@pytest.mark.slow
def test_the_default_worker_never_claims_a_deprovision_job(
    fast: Settings, database: Database, workers: Workers, tenant_factory: Callable[..., Tenant]
) -> None:
    tenant_factory("acme", settings=fast)  # in this test's database, where the workers run
    queued = run_cli(fast, "deprovision", "acme", "--queue")
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.strip()

    default = workers.start("--once")
    assert default.wait() == 0
    with database.owner() as conn:
        row = conn.execute(
            "SELECT status, attempts FROM control.platform_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row == ("queued", 0)
    assert state(database, "acme") == ("onboarding", None)

    listed = workers.start(
        "--once", env={"PROVISIONER_WORKER_JOB_TYPES": "provision_tenant,deprovision_tenant"}
    )
    assert listed.wait() == 0
    with database.owner() as conn:
        row = conn.execute(
            "SELECT status FROM control.platform_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row == ("succeeded",)
    assert state(database, "acme") == ("archived", "onboarding")
    assert app_reads(database, "acme") == "permission denied"


def test_a_provisioning_job_never_gives_an_inactive_tenant_its_access_back(
    provisioner_settings: Settings, tenant_database: Database, tenant_factory: Callable[..., Tenant]
) -> None:
    settings, database = provisioner_settings, tenant_database
    tenant_factory("acme")
    assert cli(settings, "suspend", "acme").returncode == 0
    with psycopg.connect(database.owner_url) as conn:  # e.g. an upgrade re-opening the job
        job = queue.latest_for_tenant(conn, TenantId("acme"), PROVISION_JOB_TYPE)
        assert job is not None
        queue.reopen(conn, job.id)
        conn.commit()
    with Engine.from_settings(settings, "someone") as engine:
        outcome = runner.claim_and_run(
            engine, job.id, on_progress=lambda e: None, should_stop=lambda: False
        )
    assert isinstance(outcome, runner.Settled)
    assert outcome.job.status.value == "failed"
    assert "acme is suspended" in str(outcome.job.error_detail)
    assert app_reads(database, "acme") == "permission denied"


def test_status_numbers_runs_and_says_what_started_each(
    provisioner_settings: Settings, tenant_database: Database, tenant_factory: Callable[..., Tenant]
) -> None:
    settings, database = provisioner_settings, tenant_database
    tenant_factory("acme")
    with database.owner() as conn:  # damage it: provisioning repairs in a second run
        conn.execute("REVOKE DELETE ON tenant_acme.members FROM app_rw")
    service.provision(settings, "acme")
    assert cli(settings, "suspend", "acme").returncode == 0

    human = cli(settings, "status", "acme").stdout
    history = human.split("history\n", 1)[1].splitlines()
    headers = [line.strip() for line in history if line.startswith("  run")]
    assert headers == [
        "run 1  provision_tenant  started by `provision`",
        "run 2  provision_tenant  started by `provision (repair)`",
        "run 1  suspend_tenant  started by `suspend`",
    ]
    view = json.loads(cli(settings, "status", "acme", "--json").stdout)
    assert view["job_type"] == "suspend_tenant" and view["state"] == "suspended"
    runs = [(r["job_type"], r["run"], r["attempt"], r["step"]) for r in view["step_runs"]]
    assert runs[6:] == [
        ("provision_tenant", 2, 1, "grant_app_rw"),
        ("suspend_tenant", 1, 1, "revoke_app_rw"),
        ("suspend_tenant", 1, 1, "mark_suspended"),
    ]
    assert [(r["job_type"], r["run"], r["started_by"]) for r in view["runs"]] == [
        ("provision_tenant", 1, "provision"),
        ("provision_tenant", 2, "provision (repair)"),
        ("suspend_tenant", 1, "suspend"),
    ]


def _foreign_schema(database: Database, tenant: str) -> None:
    """A schema the tool never made under the tenant's name, with data: a DBA's, a restore's."""
    with database.owner() as conn:
        conn.execute(f"CREATE SCHEMA tenant_{tenant}")
        conn.execute(f"CREATE TABLE tenant_{tenant}.payroll (salary int)")
        conn.execute(f"INSERT INTO tenant_{tenant}.payroll VALUES (100000)")


def _payroll(database: Database, tenant: str) -> list[tuple[int]]:
    with database.owner() as conn:
        return conn.execute(f"SELECT salary FROM tenant_{tenant}.payroll").fetchall()


def test_provisioning_takes_no_schema_it_did_not_make_and_a_purge_drops_none(
    settings: Settings, database: Database
) -> None:
    """tenant/schema.py, kinds/lifecycle.py: the application registers an id whose schema
    exists with someone else's data. Provisioning refuses it in one line (it would have run
    the tenant's migrations in it and granted the application every table); the purge of the
    still-pending tenant revokes and drops nothing and says the schema was left as it is.
    Before, the job succeeded and app_rw could read and update the payroll, and the purge
    dropped it."""
    _foreign_schema(database, "secret")
    with database.app() as conn:
        ensure_provision_job(conn, TenantId("secret"))
    ran = run_cli(settings, "worker", "--once")
    assert ran.returncode == 0, ran.stderr
    with database.owner() as conn:
        row = conn.execute(
            "SELECT status, error_detail FROM control.platform_jobs WHERE tenant_id = 'secret'"
        ).fetchone()
    assert row is not None and row[0] == "failed", row
    assert "schema tenant_secret already exists and holds 1 object(s) the tool" in row[1]
    assert app_reads(database, "secret") == "permission denied"
    assert _payroll(database, "secret") == [(100000,)]
    assert state(database, "secret")[0] == "pending"

    purged = run_cli(settings, "deprovision", "secret", "--purge", "--yes")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert state(database, "secret")[0] == "deleted"
    assert _payroll(database, "secret") == [(100000,)]
    with database.owner() as conn:
        details = dict(
            conn.execute(
                "SELECT s.step, s.detail FROM control.job_step_runs s "
                "JOIN control.platform_jobs j ON j.id = s.job_id "
                "WHERE s.tenant_id = 'secret' AND j.job_type = 'purge_tenant'"
            ).fetchall()
        )
    assert details["drop_schema"] == (
        "nothing done: the tenant is pending, the tool never made its schema; "
        "schema tenant_secret exists and is left as it is"
    )
