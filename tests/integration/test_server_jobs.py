"""Jobs on the tenant's own server (issue 29, item 3), against a second real cluster: the tool's
schema applied by ``provisioner migrate``, the worker's refusal to start without it or without
credentials or as a superuser there, and provisioning by a one-off command and by a worker,
every step committed on the tenant server with its journal row and the fence."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO

import psycopg
import pytest
from psycopg import pq
from psycopg.rows import dict_row

from provisioner import queue, servers, service
from provisioner.engine import Engine, runner
from provisioner.engine import sessions as engine_sessions
from provisioner.kinds.provision import PROVISION_JOB_TYPE, STEPS
from provisioner.local import cluster as local_pg
from provisioner.models import Job, JobStatus
from provisioner.queue.claim import claim_params
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.templates import reference as template_reference
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database, run_cli
from tests.extra_clusters import TenantServerDb
from tests.integration.test_fleet_upgrade import make_tree, use_tree

#: The provisioning steps with work on the tenant's server (the journal's rows).
SERVER_STEPS = ("create_schema", "run_tenant_migrations", "grant_app_rw", "seed_role_profiles")


def on_control(database: Database, schema: str) -> bool:
    with database.owner() as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        return found.fetchone() is not None


def test_migrate_applies_the_tool_schema_and_a_worker_refuses_a_server_behind(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    jobs_server.add_to(database)
    refused = run_cli(settings, "worker", "--once")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: tenant server east: its tool schema is at version 0, this build needs 2: "
        "run `provisioner migrate`"
    ]
    # A one-off command meets the same refusal at its job's first use of the server: the job
    # stays queued with the reason, nothing is created there.
    early = run_cli(settings, "provision", "early")
    assert early.returncode == 1, early.stdout + early.stderr
    assert "its tool schema is at version 0, this build needs 2" in early.stdout
    # ... and never says it finished
    assert "stopped after" in early.stdout and "the job is queued, not done" in early.stdout
    assert "finished in" not in early.stdout
    assert not jobs_server.schema_exists("tenant_early")
    first = run_cli(settings, "migrate")
    assert first.returncode == 0, first.stderr
    assert "tenant server east: tool schema (none) -> 2" in first.stdout
    again = run_cli(settings, "migrate")
    assert "tenant server east: tool schema at version 2" in again.stdout
    assert run_cli(settings, "worker", "--once").returncode == 0
    # The application role cannot read the tool's schema.
    with jobs_server.app() as app, pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute("SELECT * FROM provisioner_server.fences")


def test_a_worker_refuses_a_server_without_credentials_or_owned_by_a_superuser(
    settings: Settings, database: Database, jobs_server: TenantServerDb, tmp_path: Path
) -> None:
    port, name = jobs_server.cluster.port, jobs_server.name
    empty = tmp_path / "pgpass"
    empty.write_text("")
    empty.chmod(0o600)
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO control.tenant_servers (name, conninfo) VALUES ('east', %s)",
            (f"host=127.0.0.1 port={port} dbname={name} passfile={empty}",),
        )
    refused = run_cli(settings, "worker", "--once", env={"PGPASSFILE": str(empty)})
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: tenant server east: ") and "password" in line
    secret = jobs_server.cluster.password(local_pg.OWNER_ROLE)
    assert secret and secret not in refused.stderr + refused.stdout

    root = f"{jobs_server.reference} user={local_pg.SUPERUSER}"
    with database.owner() as conn:
        conn.execute("UPDATE control.tenant_servers SET conninfo = %s", (root,))
    refused = run_cli(settings, "worker", "--once")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: tenant server east: role {local_pg.SUPERUSER} is a superuser: the owner must "
        "be an ordinary role"
    ]


def test_provisioning_runs_every_step_on_the_tenant_server(
    settings: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    clean_fingerprint: dict,
) -> None:
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    out = run_cli(settings, "provision", "acme", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    job = json.loads(out.stdout)
    assert (job["status"], job["steps_completed"], job["attempts"]) == (
        "succeeded",
        list(STEPS),
        1,
    )
    assert jobs_server.schema_exists("tenant_acme")
    assert not on_control(database, "tenant_acme")
    with jobs_server.owner() as conn:
        assert fingerprint(conn, "tenant_acme") == clean_fingerprint
        seeds = conn.execute(
            "SELECT count(*) FROM provisioner_server.tenant_seeds WHERE tenant_id = 'acme'"
        ).fetchone()
    assert seeds is not None and seeds[0] > 0
    written = jobs_server.journal("acme")
    assert sorted(written) == sorted(SERVER_STEPS)
    assert len(set(written.values())) == 1  # one run, one token
    assert jobs_server.fence("acme") == next(iter(written.values()))
    with database.owner() as conn:
        state = conn.execute("SELECT state FROM control.tenants WHERE tenant_id = 'acme'")
        assert state.fetchone() == ("onboarding",)
        runs = conn.execute(
            "SELECT step, outcome FROM control.job_step_runs WHERE tenant_id = 'acme' ORDER BY id"
        ).fetchall()
    assert runs == [(step, "succeeded") for step in STEPS]
    # The schema is the template's verified replay (control's reference), not an Alembic run.
    with jobs_server.owner() as conn:
        how = conn.execute(
            "SELECT detail FROM provisioner_server.step_journal WHERE step = %s",
            ("run_tenant_migrations",),
        ).fetchone()
    assert how == ("template (verified replay of control's reference)",)
    # The application reaches its tenant on the server the directory names.
    with jobs_server.app() as app:
        app.execute("SET search_path TO tenant_acme")
        app.execute("SELECT count(*) FROM role_profiles").fetchone()
    # Provisioning again finds every effect there (on the server's catalog): nothing runs.
    again = run_cli(settings, "provision", "acme", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["attempts"] == 1
    with jobs_server.app() as app:
        app.execute("SELECT count(*) FROM tenant_acme.role_profiles").fetchone()


def test_a_worker_provisions_tenants_on_the_tenant_server(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("one", "two"):
        service.enqueue(settings, tenant)
    worker = run_cli(settings, "worker", "--once")
    assert worker.returncode == 0, worker.stderr
    for tenant in ("one", "two"):
        status = json.loads(run_cli(settings, "status", tenant, "--json").stdout)
        assert (status["status"], status["attempts"]) == ("succeeded", 1)
        assert jobs_server.schema_exists(f"tenant_{tenant}")
        assert not on_control(database, f"tenant_{tenant}")
        assert sorted(jobs_server.journal(tenant)) == sorted(SERVER_STEPS)


def _drain_once(engine: Engine, claims: list[queue.Claim]) -> runner.Outcome:
    """What a worker's engine process does for each job of its drain (provisioning only)."""
    return runner.claim_next_and_run(
        engine,
        (PROVISION_JOB_TYPE,),
        on_claimed=claims.append,
        on_progress=lambda event: None,
        should_stop=lambda: False,
    )


def _sent(trace: IO[bytes]) -> list[str]:
    """The messages a traced session sent (libpq's trace: "F" lines), message and text."""
    trace.seek(0)
    messages: list[str] = []
    for line in trace.read().decode(errors="replace").splitlines():
        if line.split("\t")[:1] in (["F"], ["B"]):
            messages.append(line)
        elif messages:  # a statement's text goes on over several lines
            messages[-1] += "\n" + line
    return [message for message in messages if message.startswith("F\t")]


@contextmanager
def _traced(wire: pq.abc.PGconn) -> Iterator[IO[bytes]]:
    with tempfile.TemporaryFile() as trace:
        wire.trace(trace.fileno())
        wire.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield trace
        finally:
            wire.untrace()


@pytest.mark.parametrize("pool_size", [0, 1], ids=["pool-off", "pool-on"])
def test_a_placed_job_takes_its_token_from_its_claim_and_raises_its_fence_with_its_first_step(
    settings: Settings, database: Database, jobs_server: TenantServerDb, pool_size: int
) -> None:
    """queue/fence.py and engine/remote.py: a worker child's job on a tenant server takes its
    fencing token from its claim (the first job's, alone; the second's, riding on the first
    job's last commit), so its run writes nothing on control before its first step; and its
    fence is raised in its first step's server transaction: one server transaction per step,
    none of the adopt's own. With the warm pool off it sends nothing at all on the engine's
    control session: no claim of a spare (kinds/placed.py)."""
    settings = replace(settings, pool_size=pool_size)
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("one", "two"):
        service.enqueue(settings, tenant)
    claims: list[queue.Claim] = []
    with Engine.from_settings(settings, "drainer") as engine:
        assert isinstance(_drain_once(engine, claims), runner.Settled)
        assert engine.holds_claim()  # the second job, claimed by the first one's last commit
        pool = engine.servers.database(engine.control, "east")
        with pool.session() as session:  # the pool's one session, which the next job takes
            server_wire = session.driver.pgconn
        with _traced(engine.control.pgconn) as on_control, _traced(server_wire) as on_server:
            second = _drain_once(engine, claims)
            control_sent, server_sent = _sent(on_control), _sent(on_server)
    assert isinstance(second, runner.Settled) and second.job.status is JobStatus.SUCCEEDED
    assert [c.job.tenant_id for c in claims] == ["one", "two"]
    first_token, second_token = (c.fence for c in claims)
    assert first_token is not None and second_token is not None
    for claim in claims:
        tenant = str(claim.job.tenant_id)
        assert set(jobs_server.journal(tenant).values()) == {claim.fence}
        assert jobs_server.fence(tenant) == claim.fence
    # on control, the warm pool's claim of a spare on the server alone (one statement, bound to
    # the tenant and its server: pool/server_spares.py), none with the pool off; no token of
    # its own (no RUN_FENCE)
    executes = [line for line in control_sent if "\tExecute\t" in line]
    binds = [line for line in control_sent if "\tBind\t" in line]
    assert len(executes) == len(binds) == pool_size, control_sent
    if pool_size:
        assert "'two'" in binds[0] and "'east'" in binds[0], control_sent
    # one server transaction per step (each COMMIT sent with the step's journal row), none of
    # the adopt's own
    commits = [line for line in server_sent if "\tQuery\t" in line and 'COMMIT"' in line]
    assert len(commits) == len(SERVER_STEPS), server_sent


def test_a_server_steps_close_on_control_sends_its_begin_and_lock_with_it(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    """engine/remote.py, db/sessions.py (``deferred``), queue/lease.py (``begin_with``): a
    step whose work is all on the tenant server (migrations, grants, seeds) closes on control
    in one round trip before its COMMIT, its BEGIN and the tenant's lock sent in the close's
    pipeline (two before it: the BEGIN with the lock, then the close); a step with a control
    side (create_schema's mark, storage, activation) takes the lock with its BEGIN first, as
    before. Every step closes once, in order."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("first", "traced"):
        service.enqueue(settings, tenant)
    claims: list[queue.Claim] = []
    with Engine.from_settings(settings, "drainer") as engine:
        assert isinstance(_drain_once(engine, claims), runner.Settled)  # the references
        with engine.sessions.db.session() as session:  # the pool's one session: the job's
            wire = session.driver.pgconn
        with _traced(wire) as on_control:
            outcome = _drain_once(engine, claims)
            sent = _sent(on_control)
    assert isinstance(outcome, runner.Settled), outcome
    assert outcome.job.status is JobStatus.SUCCEEDED, outcome.job.error_detail
    kinds = [line.split("\t")[2] for line in sent]
    texts = [line.split("\t")[3].lstrip(' "') if len(line.split("\t")) > 3 else "" for line in sent]
    deferred = [
        i
        for i, (k, t) in enumerate(zip(kinds, texts, strict=True))
        if k == "Parse" and t.startswith('BEGIN"')
    ]
    begun = [
        i
        for i, (k, t) in enumerate(zip(kinds, texts, strict=True))
        if k == "Query" and t.startswith("BEGIN;")
    ]
    assert len(deferred) == 3, sent  # run_tenant_migrations, grant_app_rw, seed_role_profiles
    assert len(begun) == 3, sent  # create_schema, verify_object_storage, activate_onboarding
    for at in deferred:
        commit = next(i for i in range(at, len(sent)) if texts[i].startswith("COMMIT"))
        assert kinds[at:commit].count("Sync") == 1, sent[at : commit + 1]
        parsed = [texts[i] for i in range(at + 1, commit) if kinds[i] == "Parse"]
        assert "tenant_locks" in parsed[0], sent[at : commit + 1]  # the lock, then the close
        assert kinds[at:commit].count("Query") == 0, sent[at : commit + 1]
    with database.owner() as conn:
        closed = conn.execute(
            "SELECT step, outcome FROM control.job_step_runs WHERE tenant_id = 'traced' ORDER BY id"
        ).fetchall()
    assert closed == [(step, "succeeded") for step in STEPS]
    assert outcome.job.steps_completed == list(STEPS)


def test_a_hand_offs_claim_token_is_its_own_and_a_placed_claim_commits_durably(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    """queue/fence.py: a last step's transaction got its id early; a token another run took
    meanwhile (committed before the claim) is larger than that id, and the hand-off's claim
    token, its savepoint's own id, larger still. A claim of a job whose tenant lives on a
    tenant server asks for a durable commit; one of a tenant on control does not."""
    service.enqueue(settings, "here")  # before the server joins: on the control database
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("there", "later"):
        service.enqueue(settings, tenant)
    params = claim_params([PROVISION_JOB_TYPE], "w")
    with psycopg.connect(database.owner_url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(queue.CLAIM_NEXT, params).fetchone()
        assert row is not None and (row["tenant_id"], row["tenant_server"]) == ("here", None)
        assert row["commit_waits"] is None and row["fence_token"] is not None
        lease = Job.from_row(row).lease
        opened = conn.execute(queue.step_run_opening(lease, "here", STEPS[0])).fetchone()
        assert opened is not None
    with psycopg.connect(database.owner_url) as tx:
        early = tx.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        with psycopg.connect(database.owner_url, autocommit=True) as other:
            taken = other.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        closed = queue.close_step(
            tx,
            int(opened["id"]),
            None,
            lease,
            list(STEPS),
            100,
            last=True,
            claim_next=(PROVISION_JOB_TYPE,),
            first_steps={PROVISION_JOB_TYPE: list(STEPS)},
        )
        tx.commit()
    assert closed.claimed is not None and closed.claimed.job.tenant_id == "there"
    assert early is not None and taken is not None and closed.claimed.fence is not None
    assert early[0] < taken[0] < closed.claimed.fence
    with psycopg.connect(database.owner_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("UPDATE control.platform_jobs SET status = 'succeeded' "
                     "WHERE tenant_id = 'there'")  # fmt: skip
        row = conn.execute(queue.CLAIM_NEXT, params).fetchone()
        assert row is not None and (row["tenant_id"], row["tenant_server"]) == ("later", "east")
        assert row["commit_waits"] == "on"
        assert int(row["fence_token"]) == int(row["claim_xmin"]) > closed.claimed.fence


def test_a_fleet_upgrades_job_on_a_server_adopts_nothing_of_its_earlier_run(
    settings: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """servers/journal.py, version 2: a fleet upgrade re-opens each tenant's provisioning job
    (same id, next run). The server's journal rows of its first run are not this run's to
    adopt, so nothing of them is checked on the catalog. The second tenant's job (the engine's
    replay plan proven on the first) is ONE server transaction of four round trips: BEGIN with
    the lock timeout, the fence and the journal's read; the planned replay; its fingerprint;
    the journal's row with the COMMIT. Its row then says run 2."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("away1", "away2"):
        assert service.provision(settings, tenant).job.status is JobStatus.SUCCEEDED
    env = use_tree(monkeypatch, make_tree(tmp_path))
    queued = run_cli(settings, "upgrade", "--all", "--json", env=env)
    assert queued.returncode == 0, queued.stdout + queued.stderr
    claims: list[queue.Claim] = []
    with Engine.from_settings(settings, "drainer") as engine:
        first = _drain_once(engine, claims)
        pool = engine.servers.database(engine.control, "east")
        with pool.session() as session:
            server_wire = session.driver.pgconn
        with _traced(server_wire) as on_server:
            second = _drain_once(engine, claims)
            server_sent = _sent(on_server)
    for outcome in (first, second):
        assert isinstance(outcome, runner.Settled), outcome
        assert outcome.job.status is JobStatus.SUCCEEDED and outcome.job.run == 2
    assert [str(c.job.tenant_id) for c in claims] == ["away1", "away2"]
    assert "BEGIN; SELECT set_config('lock_timeout'" in server_sent[0], server_sent
    assert "provisioner_server.fences" in server_sent[0], server_sent
    waits = [line for line in server_sent if "\tQuery\t" in line or "\tSync" in line]
    assert len(waits) == 4, "\n".join(server_sent)
    assert waits[-1].endswith('; COMMIT"'), waits[-1]
    with jobs_server.owner() as conn:
        rows = conn.execute(
            "SELECT step, run FROM provisioner_server.step_journal WHERE tenant_id = 'away2'"
        ).fetchall()
    runs = {step: 2 if step == "run_tenant_migrations" else 1 for step in SERVER_STEPS}
    assert dict(rows) == runs


def test_no_control_transaction_waits_over_a_server_step(
    settings: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """engine/handoff.py: a job's last commit begins the next job's first transaction only when
    that job's first step runs on control. Before a job on a tenant server it begins nothing:
    that transaction would sit idle on control for the whole of the step's work on the server,
    and a step longer than the sessions' idle timeout (a migration waiting on a lock) would
    come back to a session the server had ended, and fail the job's close. Here the second
    job's first server statement waits 3 s on a lock with the idle timeout at 1 s: the job
    succeeds at its first attempt, every step closed once."""
    monkeypatch.setattr(engine_sessions, "idle_timeout_ms", lambda stale: 1000)
    settings = replace(settings, lock_timeout_seconds=30.0)
    service.enqueue(settings, "home")  # before the server joins: on the control database
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    service.enqueue(settings, "away")
    with jobs_server.owner() as blocker:
        blocker.autocommit = False  # its fence row, uncommitted: the adopt's insert waits
        blocker.execute(
            "INSERT INTO provisioner_server.fences (tenant_id, token, job_id) "
            "VALUES ('away', 0, gen_random_uuid())"
        )
        release = threading.Timer(3.0, blocker.rollback)
        release.start()
        try:
            claims: list[queue.Claim] = []
            with Engine.from_settings(settings, "drainer") as engine:
                first = _drain_once(engine, claims)
                second = _drain_once(engine, claims)
        finally:
            release.join()
    assert [str(c.job.tenant_id) for c in claims] == ["home", "away"]
    for outcome in (first, second):
        assert isinstance(outcome, runner.Settled), outcome
        assert outcome.job.status is JobStatus.SUCCEEDED, outcome.job.error_detail
        assert outcome.job.attempts == 1
    with database.owner() as conn:
        outcomes = conn.execute(
            "SELECT step, outcome FROM control.job_step_runs WHERE tenant_id = 'away'"
        ).fetchall()
    assert sorted(outcomes) == sorted((step, "succeeded") for step in STEPS)
    assert sorted(jobs_server.journal("away")) == sorted(SERVER_STEPS)


def test_a_server_step_waiting_on_controls_reference_keeps_its_transaction(
    settings: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """db/keepalive.py, kinds/placed.py: a new tenant's migration step on its server reads the
    template's reference from control, or waits there while another process computes it,
    and the step's server transaction waits meanwhile. Longer than the idle timeout (1 s here;
    the reference's lock held by another session for 2.5 s), that transaction used to be
    ended by the server and the job ran again; now it is kept alive and the job succeeds at
    its first attempt."""
    monkeypatch.setattr(engine_sessions, "idle_timeout_ms", lambda stale: 1000)
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    service.enqueue(settings, "away")
    digest = migrations.tenant_tree_state().digest
    waited: list[int] = []

    def release(blocker: psycopg.Connection) -> None:
        with database.owner() as look:
            row = look.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
            ).fetchone()
        waited.append(int(row[0]) if row else 0)
        blocker.rollback()

    with database.owner() as blocker:  # computing the reference, as another child would
        blocker.autocommit = False
        lock = {"class": template_reference.REFERENCE_LOCK_CLASS, "digest": digest}
        blocker.execute(template_reference.LOCK_REFERENCE, lock)
        timer = threading.Timer(2.5, release, (blocker,))
        timer.start()
        try:
            claims: list[queue.Claim] = []
            with Engine.from_settings(settings, "drainer") as engine:
                outcome = _drain_once(engine, claims)
        finally:
            timer.join()
    assert waited == [1]  # the step waited for the reference all along
    assert isinstance(outcome, runner.Settled), outcome
    assert outcome.job.status is JobStatus.SUCCEEDED, outcome.job.error_detail
    assert outcome.job.attempts == 1
    assert sorted(jobs_server.journal("away")) == sorted(SERVER_STEPS)


def test_an_engine_lets_go_of_a_servers_pool_no_job_used_for_a_while(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    """servers/sessions.py: a tenant server's pool stays open while jobs use it and is closed at
    the tidy-up (a worker child's, between drains) once unused for the idle bound; a job there
    opens it again. Before, every worker child held a session on a server drained and retired
    until it restarted (its ``DROP DATABASE`` refused)."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    service.enqueue(settings, "kept")

    def sessions_on_server() -> int:
        return len(jobs_server.sessions(["pool-holder"]))

    with Engine.from_settings(settings, "pool-holder") as engine:
        outcome = _drain_once(engine, [])
        assert isinstance(outcome, runner.Settled)
        assert outcome.job.status is JobStatus.SUCCEEDED, outcome.job.error_detail
        assert sessions_on_server() == 1
        assert engine.servers.close_idle() == []  # used just now: kept
        assert sessions_on_server() == 1
        assert engine.servers.close_idle(0.0) == ["east"]
        assert _wait_for(lambda: sessions_on_server() == 0)
        service.enqueue(settings, "again")
        outcome = _drain_once(engine, [])
        assert isinstance(outcome, runner.Settled)
        assert outcome.job.status is JobStatus.SUCCEEDED, outcome.job.error_detail
        assert sessions_on_server() == 1


def test_an_engine_opens_the_pools_of_the_servers_in_service_ahead_and_no_other(
    settings: Settings, database: Database, jobs_server: TenantServerDb, silent_listener: int
) -> None:
    """servers/sessions.py: ``open_servers`` (a worker child's, before it says it is ready)
    opens a session on every tenant server in service (active or full), so the first job there
    pays no login; a server that refuses the connection, or one that never answers (it costs
    the connect timeout, the servers being opened side by side), is skipped without an error
    (its first job reports it), and a draining one is not opened. The first job uses the pool
    opened so."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    with database.owner() as conn:
        servers.add(conn, "down", "host=127.0.0.1 port=1 dbname=nothing")
        servers.add(conn, "hushed", f"host=127.0.0.1 port={silent_listener} dbname=nothing")
        servers.add(conn, "west", jobs_server.reference)
        servers.set_status(conn, "west", servers.ServerStatus.DRAINING)
        servers.add(conn, "north", jobs_server.reference)
        servers.set_status(conn, "north", servers.ServerStatus.FULL)
    with Engine.from_settings(settings, "ahead-holder") as engine:
        assert jobs_server.sessions(["ahead-holder"]) == []
        engine.open_servers()  # east and north (both on the test's database), not west
        assert jobs_server.sessions(["ahead-holder"]) == ["ahead-holder"] * 2
        service.enqueue(settings, "ahead", server="east")
        outcome = _drain_once(engine, [])
        assert isinstance(outcome, runner.Settled)
        assert outcome.job.status is JobStatus.SUCCEEDED, outcome.job.error_detail
        assert jobs_server.sessions(["ahead-holder"]) == ["ahead-holder"] * 2


def test_a_servers_pool_opens_with_the_fingerprints_plan_made_and_its_jobs_bind_it(
    settings: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """servers/sessions.py (``plans``, the engine's): a pool opened ahead has the fingerprint's
    catalog query prepared, with a generic plan, and a fleet upgrade's jobs on that server bind
    it from the first (each verified replay reads the fingerprint): no custom plan, no second
    copy prepared by psycopg after five runs. Without it each of the first five jobs there
    planned it (~4 ms the first time, ~1 ms the next four)."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    for tenant in ("plan1", "plan2"):
        assert service.provision(settings, tenant).job.status is JobStatus.SUCCEEDED
    env = use_tree(monkeypatch, make_tree(tmp_path))
    assert run_cli(settings, "upgrade", "--all", env=env).returncode == 0
    with Engine.from_settings(settings, "plans-holder") as engine:
        engine.open_servers()
        pool = engine.servers.database(engine.control, "east")

        def fingerprint_plans() -> list[tuple[int, int]]:
            with pool.transaction() as tx:
                rows = tx.pg.execute(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE '%%AS default_privileges%%'"
                ).fetchall()
            return [(int(g), int(c)) for g, c in rows]

        assert fingerprint_plans() == [(1, 0)]  # made ahead, on a name no schema has
        for _ in range(2):
            outcome = _drain_once(engine, [])
            assert isinstance(outcome, runner.Settled)
            assert outcome.job.status is JobStatus.SUCCEEDED, outcome.job.error_detail
        assert fingerprint_plans() == [(3, 0)]
    with database.owner() as conn:
        details = conn.execute(
            "SELECT detail FROM control.job_step_runs WHERE detail LIKE '%%from=t004%%'"
        ).fetchall()
    assert len(details) == 2 and all("path=replay" in d for (d,) in details), details


def _wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Poll ``condition`` until it holds or ``seconds`` pass (a closed session leaves the
    server's view a moment after the client closes it)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
