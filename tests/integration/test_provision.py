"""End-to-end provisioning through the library and the CLI, on a real database."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from provisioner import db, queue, service
from provisioner.cli import main
from provisioner.engine import Engine, StepEvent
from provisioner.errors import LeaseLost
from provisioner.kinds.provision import GRANTS_IN_PLACE, STEPS, ensure_provision_job
from provisioner.models import JobStatus, TenantId
from provisioner.roles import DEFAULT_APP_ROLES
from provisioner.settings import Settings
from provisioner.storage import store_from_settings
from provisioner.templates import migrations
from provisioner.tenant import schema as tenant_schema
from provisioner.testing import Tenant
from tests.conftest import Database, downgrade_tenant, fingerprint, run_cli, settings_env
from tests.unit.test_models import BAD_TENANT_IDS


def step_runs(database: Database, tenant: str) -> list[tuple]:
    with database.owner() as conn:
        return conn.execute(
            "SELECT attempt, step, outcome, detail FROM control.job_step_runs "
            "WHERE tenant_id = %s ORDER BY id",
            (tenant,),
        ).fetchall()


def test_provision_runs_six_steps_and_records_them(settings: Settings, database: Database) -> None:
    events: list[StepEvent] = []
    result = service.provision(settings, "acme", on_progress=events.append)
    job = result.job
    assert job.status is JobStatus.SUCCEEDED
    assert job.steps_completed == list(STEPS)
    assert job.progress == 100 and job.attempts == 1
    assert [e.step for e in events if e.outcome == "done"] == list(STEPS)
    assert [(a, s, o) for a, s, o, _ in step_runs(database, "acme")] == [
        (1, step, "succeeded") for step in STEPS
    ]
    with database.owner() as conn:
        state = conn.execute(
            "SELECT state, onboarding_started_at IS NOT NULL FROM control.tenants "
            "WHERE tenant_id = 'acme'"
        ).fetchone()
        assert state == ("onboarding", True)
        assert conn.execute(
            "SELECT key FROM tenant_acme.role_profiles ORDER BY key"
        ).fetchall() == [("admin",), ("analyst",), ("owner",), ("viewer",)]
        owner = conn.execute(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'tenant_acme'"
        ).fetchone()
        assert owner == ("provisioner_owner",)
        # every object of the template lives in the tenant schema and nowhere else
        leaked = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public'"
        ).fetchone()
        assert leaked == (0,)


def test_second_provision_says_already_provisioned(settings: Settings, database: Database) -> None:
    service.provision(settings, "acme")
    again = service.provision(settings, "acme")
    assert again.already_provisioned
    assert again.job.attempts == 1
    assert len(step_runs(database, "acme")) == len(STEPS)


def test_app_rw_can_write_rows_but_not_ddl(tenant: Tenant) -> None:
    with tenant.connect(autocommit=True) as conn:  # search_path: the tenant's schema alone
        conn.execute(
            "INSERT INTO members (email, role_profile_id) "
            "SELECT 'a@example.com', id FROM role_profiles WHERE key = 'viewer'"
        )
        conn.execute("INSERT INTO datasets (name) VALUES ('sales')")
        conn.execute(
            "INSERT INTO dataset_records (dataset_id, external_key) SELECT id, 'r1' FROM datasets"
        )
        conn.execute("UPDATE datasets SET description = 'q3'")
        conn.execute("DELETE FROM dataset_records")
        for statement in (
            f"CREATE TABLE {tenant.schema}.evil (id int)",
            "CREATE TABLE evil (id int)",
            "CREATE TABLE control.evil (id int)",
            "CREATE TABLE public.evil (id int)",
            "CREATE SCHEMA evil",
            "ALTER TABLE members ADD COLUMN evil int",
            "DROP TABLE audit_events",
            "TRUNCATE members",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        # A GRANT by a role without grant option is a warning, and grants nothing.
        conn.execute("GRANT SELECT ON members TO PUBLIC")
        acl = conn.execute(
            "SELECT relacl::text FROM pg_class WHERE oid = 'members'::regclass"
        ).fetchone()[0]
        assert "=r/" not in acl.replace("app_rw=", "").replace("provisioner_owner=", "")


def test_later_migration_tables_are_covered_by_default_privileges(tenant: Tenant) -> None:
    with psycopg.connect(tenant.owner_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {tenant.schema}.later_table (id int)")
    with tenant.connect(autocommit=True) as conn:
        conn.execute("INSERT INTO later_table VALUES (1)")
        assert conn.execute("SELECT id FROM later_table").fetchall() == [(1,)]


def test_dropped_schema_is_repaired_by_a_rerun(settings: Settings, database: Database) -> None:
    service.provision(settings, "acme")
    clean = fingerprint(database, "acme")
    with database.owner() as conn:
        conn.execute("DROP SCHEMA tenant_acme CASCADE")
    events: list[StepEvent] = []
    result = service.provision(settings, "acme", on_progress=events.append)
    assert not result.already_provisioned
    assert result.job.status is JobStatus.SUCCEEDED
    assert [e.step for e in events if e.outcome == "repaired"] == list(STEPS[:4])
    assert fingerprint(database, "acme") == clean
    details = [d for _, s, o, d in step_runs(database, "acme")[len(STEPS) :]]
    assert all("effect was missing" in d for d in details)


def test_a_tenant_behind_the_template_head_is_upgraded_by_a_rerun(
    settings: Settings, database: Database
) -> None:
    """After a deploy adds tenant_template revisions, provisioning an existing tenant again
    runs only the migration step, in place, up to the new head."""
    service.provision(settings, "acme")
    clean = fingerprint(database, "acme")
    downgrade_tenant(database, "acme", "t003")  # the tenant as the previous release left it
    events: list[StepEvent] = []
    result = service.provision(settings, "acme", on_progress=events.append)
    assert result.job.status is JobStatus.SUCCEEDED
    assert [(e.step, e.outcome) for e in events if e.outcome != "skipped"] == [
        ("run_tenant_migrations", "started"),
        ("run_tenant_migrations", "repaired"),
    ]
    detail = step_runs(database, "acme")[-1][3]
    assert "effect was missing" in detail and "from=t003 head=t004" in detail
    assert fingerprint(database, "acme") == clean


def test_revoked_grant_is_repaired_and_only_that_step_reruns(
    settings: Settings, database: Database
) -> None:
    service.provision(settings, "acme")
    with database.owner() as conn:
        conn.execute("REVOKE DELETE ON tenant_acme.members FROM app_rw")
    events: list[StepEvent] = []
    service.provision(settings, "acme", on_progress=events.append)
    assert [e.step for e in events if e.outcome in ("done", "repaired")] == ["grant_app_rw"]
    with database.app() as conn:
        conn.execute("DELETE FROM tenant_acme.members")


def test_revoked_schema_usage_is_granted_again_in_one_round_trip(
    settings: Settings, database: Database
) -> None:
    """Only USAGE on the schema gone, every other grant in place: the repaired grant step grants
    USAGE and checks every ACL in one query (it does not name every table), and says so."""
    service.provision(settings, "acme")
    with database.owner() as conn:
        conn.execute("REVOKE USAGE ON SCHEMA tenant_acme FROM app_rw")
    events: list[StepEvent] = []
    service.provision(settings, "acme", on_progress=events.append)
    assert [(e.step, e.outcome) for e in events if e.outcome in ("done", "repaired")] == [
        ("grant_app_rw", "repaired")
    ]
    runs = [r for r in step_runs(database, "acme") if r[1] == "grant_app_rw"]
    assert runs[-1][2:] == (
        "succeeded",
        f"re-ran: its effect was missing from the catalog; {GRANTS_IN_PLACE}",
    )
    with database.app() as conn:
        conn.execute("DELETE FROM tenant_acme.members")


def test_two_tenants_have_identical_schemas(settings: Settings, database: Database) -> None:
    service.provision(settings, "one")
    service.provision(settings, "two")
    assert fingerprint(database, "one") == fingerprint(database, "two")
    assert fingerprint(database, "one")["alembic_version"] == [("t004",)]


def test_a_process_that_lost_its_lease_records_nothing(
    settings: Settings, database: Database
) -> None:
    with psycopg.connect(database.owner_url) as conn:
        ensure_provision_job(conn, TenantId("acme"))
        conn.commit()
        mine = queue.claim_next(conn, ["provision_tenant"], "zombie")
    assert mine is not None
    # Recovery takes the job back and another holder claims it.
    with psycopg.connect(database.owner_url, autocommit=True) as conn:
        conn.execute("UPDATE control.platform_jobs SET locked_at = now() - interval '1 hour'")
    with psycopg.connect(database.owner_url) as conn:
        queue.recover_stale(conn, 60)
        conn.commit()
        theirs = queue.claim_next(conn, ["provision_tenant"], "successor")
    assert theirs is not None and theirs.attempts == 2
    store = store_from_settings(settings)
    with (
        Engine(
            settings.owner_url, holder="zombie", app_roles=DEFAULT_APP_ROLES, store=store
        ) as engine,
        pytest.raises(LeaseLost),
    ):
        engine.run(mine)
    with psycopg.connect(database.owner_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, locked_by, steps_completed FROM control.platform_jobs"
        ).fetchone()
        assert row == ("running", "successor", [])
        # its step's transaction rolled back: no schema
        assert conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'tenant_acme'"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT step, outcome FROM control.job_step_runs WHERE worker = 'zombie'"
        ).fetchall() == [("create_schema", "lease_lost")]
        # and it cannot complete the job either
        with psycopg.connect(database.owner_url) as app, pytest.raises(LeaseLost):
            queue.complete(app, mine.lease)


def test_a_sign_up_reads_the_tenant_trees_state_once_in_each_step_that_uses_it(
    settings: Settings, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the tree's state stats every file of it: a sign-up does it in the take's look
    for a spare and once in its migration step (the template replay is given the state the step
    read), never for its resume check (its payload names no rollout's head)."""
    with psycopg.connect(database.owner_url) as conn:
        ensure_provision_job(conn, TenantId("acme"))
        conn.commit()
        claimed = queue.claim_next(conn, ["provision_tenant"], "counting")
    assert claimed is not None
    reads: list[str] = []
    read = migrations.tenant_tree_state

    def counted(tree: Path | None = None) -> migrations.TreeState:
        reads.append("read")
        return read(tree)

    store = store_from_settings(settings)
    with Engine(
        settings.owner_url, holder="counting", app_roles=DEFAULT_APP_ROLES, store=store
    ) as engine:
        engine.load_tree()  # a worker child's start: the reference read or computed
        monkeypatch.setattr(migrations, "tenant_tree_state", counted)
        done = engine.run(claimed)
    assert done.status is JobStatus.SUCCEEDED
    assert len(reads) == 2


def test_a_worker_childs_start_plans_the_fingerprint_on_its_steps_session(
    settings: Settings, database: Database
) -> None:
    """engine/engine.py (``load_tree``, a worker child's start): the steps session has the
    fingerprint's catalog query prepared with a generic plan before the child says it is
    ready, so that its first jobs bind it instead of planning it (psycopg would prepare it at
    the sixth run). Not the kinds' other plans: the take's would wait on a lock a build holds
    (the child then never ready: tests/crash/test_pool_crash.py)."""
    with Engine.from_settings(settings, "planning") as engine:
        engine.load_tree()
        with engine.sessions.transaction() as tx:
            rows = tx.pg.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%%AS default_privileges%%'"
            ).fetchall()
    assert rows == [(1, 0)]


def test_the_grant_step_leaves_the_sessions_prepared_statements_prepared(
    settings: Settings, database: Database
) -> None:
    """tenant/schema.py (``grant_app_roles``): the grant step's ALTER DEFAULT PRIVILEGES no
    longer has psycopg deallocate every statement the session prepared. A worker's steps
    session kept none from one sign-up to the next: the queue's statements and the
    fingerprint's catalog query were planned again at every one."""
    assert service.provision(settings, "granted").job.status is JobStatus.SUCCEEDED
    with psycopg.connect(database.owner_url) as conn:
        conn.execute("SELECT %s::int AS kept", [1], prepare=True)
        tenant_schema.grant_app_roles(conn, "tenant_granted", settings.app_roles)
        prepared = conn.execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%%kept%%'"
        ).fetchall()
        conn.rollback()
    assert prepared == [("SELECT $1::int AS kept",)]


def test_a_failing_step_schedules_a_retry_with_a_readable_error(
    settings: Settings, database: Database, objects_dir
) -> None:
    objects_dir.rmdir()
    result = service.provision(settings, "acme")
    job = result.job
    assert job.status is JobStatus.FAILED  # a missing store is a configuration fault
    assert job.attempts == 1
    assert job.error_detail is not None
    assert job.error_detail.startswith("verify_object_storage: filesystem store")
    assert job.steps_completed == list(STEPS[:4])
    objects_dir.mkdir()
    events: list[StepEvent] = []
    again = service.provision(settings, "acme", on_progress=events.append)
    assert again.job.status is JobStatus.SUCCEEDED
    assert [e.step for e in events if e.outcome == "done"] == list(STEPS[4:])


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_provision_prints_steps_and_json(settings: Settings) -> None:
    out = run_cli(settings, "provision", "acme")
    assert out.returncode == 0, out.stderr
    for step in STEPS:
        assert step in out.stdout
    assert "succeeded" in out.stdout
    again = run_cli(settings, "provision", "acme", "--json")
    assert again.returncode == 0
    view = json.loads(again.stdout)
    assert view["already_provisioned"] is True
    assert {k: view[k] for k in ("tenant_id", "status", "progress", "attempts")} == {
        "tenant_id": "acme",
        "status": "succeeded",
        "progress": 100,
        "attempts": 1,
    }
    assert set(view) >= {"job_id", "steps_completed", "error_detail"}


def test_cli_status_enqueue_and_jobs(settings: Settings) -> None:
    """The queue levers through the CLI (in-process: the same click code, without paying an
    interpreter start per command; the child-process path is covered above)."""
    runner, env = CliRunner(), settings_env(settings)

    def cli(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, list(args), env=env)
        return result.exit_code, result.stdout

    assert cli("status", "ghost")[0] == 3
    code, out = cli("enqueue", "acme")
    assert code == 0
    job_id = out.strip()
    assert cli("enqueue", "acme")[1].strip() == job_id
    status = json.loads(cli("status", "acme", "--json")[1])
    assert status["status"] == "queued"
    assert status["job_id"] == job_id
    listed = json.loads(cli("jobs", "list", "--json")[1])
    assert [j["job_id"] for j in listed] == [job_id]
    assert cli("jobs", "cancel", job_id)[0] == 0
    assert json.loads(cli("status", "acme", "--json")[1])["status"] == "cancelled"
    assert cli("jobs", "retry", job_id)[0] == 0
    assert json.loads(cli("status", "acme", "--json")[1])["status"] == "queued"
    assert cli("jobs", "retry", job_id)[0] == 2  # only failed or cancelled jobs
    assert cli("jobs", "retry", "not-a-uuid")[0] == 2
    assert cli("jobs", "cancel", "00000000-0000-0000-0000-000000000000")[0] == 3


def test_cli_refuses_bad_tenant_ids_creating_nothing(
    settings: Settings, database: Database
) -> None:
    """Every kind of bad id, through each command taking one (in-process CLI), then once
    through a real child process; the database is unchanged."""

    def census() -> tuple:
        with database.owner() as conn:
            return conn.execute(
                "SELECT (SELECT count(*) FROM pg_namespace), "
                "(SELECT count(*) FROM control.tenants), "
                "(SELECT count(*) FROM control.platform_jobs)"
            ).fetchone()

    before = census()
    runner = CliRunner()
    env = settings_env(settings)
    for bad in BAD_TENANT_IDS:
        for command in ("provision", "enqueue", "status"):
            out = runner.invoke(main, [command, bad], env=env)
            assert out.exit_code == 2, (command, bad, out.output)
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and "tenant ids are 1-48 characters" in lines[0], lines
    child = run_cli(settings, "provision", "Robert'); DROP TABLE control.tenants;--")
    assert child.returncode == 2
    assert child.stderr.count("\n") == 1 and "tenant ids" in child.stderr
    assert census() == before


def test_provision_refuses_a_control_schema_not_at_head(
    settings: Settings, database: Database
) -> None:
    with database.owner() as conn:
        conn.execute("UPDATE control.alembic_version SET version_num = '20260727_c003'")
    out = run_cli(settings, "provision", "acme")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "error: the control schema is not at this release's head: run `provisioner migrate`"
    )
    with database.owner() as conn:
        assert conn.execute("SELECT count(*) FROM control.platform_jobs").fetchone() == (0,)


def test_a_refused_reuse_of_a_deleted_tenant_leaves_it_deleted(
    settings: Settings, database: Database
) -> None:
    """The deleted tenant is made pending in the same round trip as the head check; the
    refusal rolls that back."""
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO control.tenants (tenant_id, schema_name, state) "
            "VALUES ('acme', 'tenant_acme', 'deleted')"
        )
        conn.execute("UPDATE control.alembic_version SET version_num = '20260727_c003'")
    out = run_cli(settings, "provision", "acme", "--reuse-deleted")
    assert out.returncode == 2
    assert "not at this release's head" in out.stderr
    with database.owner() as conn:
        row = conn.execute("SELECT state FROM control.tenants WHERE tenant_id = 'acme'")
        assert row.fetchone() == ("deleted",)
        assert conn.execute("SELECT count(*) FROM control.platform_jobs").fetchone() == (0,)


def test_status_shows_what_ran_attempt_by_attempt(settings: Settings) -> None:
    service.provision(settings, "acme")
    runner, env = CliRunner(), settings_env(settings)
    human = runner.invoke(main, ["status", "acme"], env=env)
    assert human.exit_code == 0
    history = human.stdout.split("history\n", 1)[1].splitlines()
    assert history[0].split() == ["run", "1", "provision_tenant", "started", "by", "`provision`"]
    assert [line.split()[3] for line in history[1:]] == list(STEPS)
    assert all("succeeded" in line for line in history[1:])
    view = json.loads(runner.invoke(main, ["status", "acme", "--json"], env=env).stdout)
    assert [(r["attempt"], r["step"], r["outcome"]) for r in view["step_runs"]] == [
        (1, step, "succeeded") for step in STEPS
    ]


def test_the_steps_session_opened_ahead_is_the_one_the_steps_use(settings: Settings) -> None:
    """A one-off run opens the steps' session in a thread while it does its bookkeeping: the
    thread's first transaction commits, and the next transaction reuses that session; a failure
    in the thread is left for the real work (which connects again)."""
    owner = db.Database(settings.owner_url)
    seen: list[int] = []
    try:
        owner.connect_ahead(lambda tx: seen.append(tx.pg.info.backend_pid)).join()
        with owner.transaction() as tx:
            assert [tx.pg.info.backend_pid] == seen

        def broken(tx: db.Transaction) -> None:
            raise RuntimeError("read failed")

        owner.connect_ahead(broken).join()  # nothing raised here
        with owner.transaction() as tx:
            assert tx.pg.execute("SELECT 1").fetchone() is not None
    finally:
        owner.close()
    unreachable = db.Database("postgresql://nobody@127.0.0.1:1/none")
    try:
        unreachable.connect_ahead().join()  # the connection error is not raised in the thread
    finally:
        unreachable.close()


def test_a_one_off_provision_replays_from_its_first_tenant_with_the_reference_read_ahead(
    settings: Settings, database: Database, clean_fingerprint: dict
) -> None:
    service.provision(settings, "ahead_one")  # computes and stores the reference
    service.provision(settings, "ahead_two")  # a new engine reads it in its thread
    with database.owner() as conn:
        details = [
            row[0]
            for row in conn.execute(
                "SELECT detail FROM control.job_step_runs WHERE step = 'run_tenant_migrations' "
                "AND tenant_id LIKE 'ahead_%' ORDER BY started_at"
            ).fetchall()
        ]
    assert [d.split(" ")[0] for d in details] == ["path=template", "path=template"]
    assert fingerprint(database, "ahead_two") == clean_fingerprint
