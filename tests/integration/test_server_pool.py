"""The warm pool on tenant servers (issue 29, item 2), against a second real cluster: spares
built there and recorded on control with their server, taken by a tenant placed there (renamed
in the server's step transaction, the record gone with the checkpoint), and placement that
prefers a server with a spare to spare."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from provisioner import db, pool, service
from provisioner.control import heartbeats
from provisioner.kinds.provision import STEPS, ensure_provision_job
from provisioner.local import cluster as local_pg
from provisioner.models import JobStatus, TenantId
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database, run_cli
from tests.extra_clusters import create_database, drop_database
from tests.job_server import TenantServerDb
from tests.workers import Workers, job_row, wait_until


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """The workers' settings (tests.workers): a quick heartbeat."""
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=10.0)


@pytest.fixture
def placed(settings: Settings, database: Database, jobs_server: TenantServerDb) -> Settings:
    """The test's control database with the tenant server ``east`` in its directory, migrated;
    the settings with the warm pool on (a take on a server claims only then)."""
    jobs_server.add_to(database)
    migrated = run_cli(settings, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    return replace(settings, pool_size=1)


@pytest.fixture
def second_server(jobs_server: TenantServerDb) -> Iterator[TenantServerDb]:
    """Another fresh database on the second cluster, as a second tenant server. Its roles are
    bootstrapped under the suite's lock, as every test database's: a bootstrap beside another
    xdist worker's on the same cluster met its role statements (a setup error, now and then)."""
    name = create_database(jobs_server.cluster, "ts")
    try:
        yield TenantServerDb(jobs_server.cluster, name)
    finally:
        drop_database(jobs_server.cluster, name)


def fill(settings: Settings, server: TenantServerDb, name: str, size: int) -> tuple[str, ...]:
    """Refill server ``name``'s spares to ``size`` as the worker's keeper does."""
    control = db.Database(settings.owner_url)
    there = db.Database(server.cluster.url(local_pg.OWNER_ROLE, server.name))
    try:
        with control.session() as session, there.session() as target:
            on = pool.OnServer(name, target)
            return pool.refill(session, size, "test", settings.app_roles, on=on).built
    finally:
        control.close()
        there.close()


def pool_rows(database: Database) -> list[tuple[str, str | None, str | None]]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT schema_name, server, claimed_by FROM control.tenant_pool ORDER BY created_at"
        ).fetchall()
    return [(str(a), b, c) for a, b, c in rows]


def recorded_names(database: Database) -> set[str]:
    with database.owner() as conn:
        rows = conn.execute("SELECT schema_name FROM control.tenant_pool_schemas").fetchall()
    return {str(r[0]) for r in rows}


def test_a_tenant_placed_on_a_server_with_spares_takes_one(
    placed: Settings, database: Database, jobs_server: TenantServerDb, clean_fingerprint: dict
) -> None:
    built = fill(placed, jobs_server, "east", 2)
    assert len(built) == 2 and all(jobs_server.schema_exists(name) for name in built)
    assert pool_rows(database) == [(name, "east", None) for name in built]
    with database.owner() as conn:  # control's own pool is left alone: nothing there
        assert pool.counts(conn, placed.app_roles).ready == 0
        assert pool.server_counts(conn, "east", placed.app_roles).ready == 2
        # The spares live on the server, not on control.
        on_control = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = ANY(%s)", (list(built),)
        ).fetchone()
    assert on_control == (0,)

    result = service.provision(placed, "acme")

    assert result.job.status is JobStatus.SUCCEEDED, result.job.error_detail
    assert result.job.steps_completed == list(STEPS)
    oldest = built[0]
    assert not jobs_server.schema_exists(oldest)  # renamed: the tenant's schema now
    assert jobs_server.schema_exists(built[1])
    with jobs_server.owner() as conn:
        assert fingerprint(conn, "tenant_acme") == clean_fingerprint
        detail = conn.execute(
            "SELECT detail FROM provisioner_server.step_journal WHERE step = 'create_schema'"
        ).fetchone()
    assert detail == (f"taken from the warm pool: {oldest}",)
    assert pool_rows(database) == [(built[1], "east", None)]  # the taken spare's row is gone
    assert oldest not in recorded_names(database)
    # The application reaches its tenant there, with the spare's grants and USAGE.
    with jobs_server.app() as app:
        app.execute("SET search_path TO tenant_acme")
        app.execute("SELECT count(*) FROM role_profiles").fetchone()
    # The next tenant takes the other one; a third builds its schema as before.
    assert service.provision(placed, "bravo").job.status is JobStatus.SUCCEEDED
    assert pool_rows(database) == []
    assert service.provision(placed, "carol").job.status is JobStatus.SUCCEEDED
    with jobs_server.owner() as conn:
        carol = conn.execute(
            "SELECT detail FROM provisioner_server.step_journal"
            " WHERE tenant_id = 'carol' AND step = 'create_schema'"
        ).fetchone()
        assert fingerprint(conn, "tenant_carol") == clean_fingerprint
    assert carol == (None,)


def test_a_spare_claimed_by_a_tenant_whose_schema_exists_is_given_back(
    placed: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    (spare,) = fill(placed, jobs_server, "east", 1)
    with jobs_server.owner() as conn:  # the tenant's schema is there already (by hand)
        conn.execute("CREATE SCHEMA tenant_acme")
    result = service.provision(placed, "acme")
    assert result.job.status is JobStatus.SUCCEEDED
    assert jobs_server.schema_exists(spare)
    assert pool_rows(database) == [(spare, "east", None)]  # unclaimed again, still ready


def test_the_keeper_drops_a_server_spare_of_another_tree_state_and_an_unfinished_one(
    placed: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    stale, unfinished = fill(placed, jobs_server, "east", 2)
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.tenant_pool SET tree_digest = 'old' WHERE schema_name = %s", (stale,)
        )
        conn.execute("DELETE FROM control.tenant_pool WHERE schema_name = %s", (unfinished,))
    rebuilt = fill(placed, jobs_server, "east", 2)
    assert len(rebuilt) == 2
    assert not jobs_server.schema_exists(stale) and not jobs_server.schema_exists(unfinished)
    assert [r[0] for r in pool_rows(database)] == list(rebuilt)
    assert recorded_names(database) == set(rebuilt)


def _server_of(database: Database, tenant: str) -> str | None:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT server FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None
    return row[0]


def beat_pool(database: Database, settings: Settings) -> None:
    """A worker's heartbeat with the pool on, as its keeper reports it: what its takes hand
    out (placement reads it, control revision 20261205_h33spares)."""
    with database.owner() as conn:
        heartbeats.beat(conn, "worker", "pool-test", {"pool": pool.takes_for(settings.app_roles)})


def test_placement_prefers_a_server_with_a_spare_to_spare(
    placed: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    second_server: TenantServerDb,
) -> None:
    second_server.add_to(database, "west")
    assert run_cli(placed, "migrate").returncode == 0
    beat_pool(database, placed)
    # Without spares: the least loaded, by name among equals (east).
    assert service.provision(placed, "first").job.status is JobStatus.SUCCEEDED
    assert _server_of(database, "first") == "east"
    # West is the less loaded now; a spare on east has east preferred.
    fill(placed, jobs_server, "east", 1)
    with database.owner() as conn:
        ensure_provision_job(conn, TenantId("second"))
    assert _server_of(database, "second") == "east"
    # East's one spare is spoken for by the queued job of "second": the next goes by load.
    with database.owner() as conn:
        ensure_provision_job(conn, TenantId("third"))
    assert _server_of(database, "third") == "west"
    # A server at its capacity is never chosen, spares or not.
    with database.owner() as conn:
        conn.execute("UPDATE control.tenant_servers SET capacity = 2 WHERE name = 'east'")
    fill(placed, jobs_server, "east", 3)
    with database.owner() as conn:
        ensure_provision_job(conn, TenantId("fourth"))
    assert _server_of(database, "fourth") == "west"
    # The queued tenants provision on their servers; "second" takes east's oldest spare.
    worker = run_cli(placed, "worker", "--once")
    assert worker.returncode == 0, worker.stderr
    with database.owner() as conn:
        states = dict(
            conn.execute("SELECT tenant_id, status FROM control.platform_jobs").fetchall()
        )
    assert states == {t: "succeeded" for t in ("first", "second", "third", "fourth")}
    assert jobs_server.schema_exists("tenant_second")
    # one of three taken (the worker's keeper may build on west and control meanwhile)
    assert [r[1] for r in pool_rows(database) if r[1] == "east"] == ["east", "east"]
    assert second_server.schema_exists("tenant_third")


def test_a_tenant_that_holds_a_claim_takes_that_spare_and_no_other(
    placed: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    oldest, newest = fill(placed, jobs_server, "east", 2)
    # A run that claimed the newest spare on control and died before the server's commit.
    with database.owner() as conn:
        ensure_provision_job(conn, TenantId("acme"))
        conn.execute(
            "UPDATE control.tenant_pool SET claimed_by = 'acme' WHERE schema_name = %s", (newest,)
        )
        assert pool.server_counts(conn, "east", placed.app_roles).ready == 1  # claimed: not
    result = service.provision(placed, "acme")
    assert result.job.status is JobStatus.SUCCEEDED
    assert not jobs_server.schema_exists(newest) and jobs_server.schema_exists(oldest)
    assert pool_rows(database) == [(oldest, "east", None)]


def test_a_workers_keeper_fills_each_active_servers_pool_and_reports_it(
    placed: Settings, database: Database, jobs_server: TenantServerDb, workers: Workers
) -> None:
    worker = workers.start(env={"PROVISIONER_POOL_SIZE": "1"})

    def east_ready() -> int:
        with database.owner() as conn:
            return pool.server_counts(conn, "east", placed.app_roles).ready

    wait_until(lambda: east_ready() == 1, 90, "a spare on east")
    (spare, server, claimed) = next(r for r in pool_rows(database) if r[1] == "east")
    assert (server, claimed) == ("east", None) and jobs_server.schema_exists(spare)
    wait_until(
        lambda: (
            json.loads(run_cli(placed, "health", "--json").stdout)["components"][0]["detail"]
            .get("pool", {})
            .get("servers", {})
            .get("east", {})
            .get("ready")
            == 1
        ),
        30,
        "the heartbeat to report east's pool",
    )
    # ... and what its takes hand out, which placement reads (revision 20261205_h33spares)
    beat = json.loads(run_cli(placed, "health", "--json").stdout)["components"][0]["detail"]
    wanted = pool.takes_for(placed.app_roles)
    assert (beat["pool"]["digest"], beat["pool"]["roles"]) == (wanted["digest"], wanted["roles"])
    # A sign-up placed on east takes it; the keeper builds the next one there.
    with db.connect(placed.app_url) as conn:
        ensure_provision_job(conn, TenantId("acme"))
        conn.commit()
    wait_until(lambda: job_row(database, "acme")["status"] == "succeeded", 60, "acme")
    assert not jobs_server.schema_exists(spare) and jobs_server.schema_exists("tenant_acme")
    wait_until(lambda: east_ready() == 1, 90, "east's pool refilled")
    assert spare not in {r[0] for r in pool_rows(database)}
    assert worker.stop() == 0, worker.output()


def test_each_worker_child_opens_a_session_on_each_server_in_service_before_any_job(
    placed: Settings, database: Database, jobs_server: TenantServerDb, workers: Workers
) -> None:
    """servers/sessions.py (``open_ahead``): each worker child opens its pool on every tenant
    server in service as it starts, so its first job there pays no login; no job is queued here,
    and a pool opened on first use would never show."""
    worker = workers.start("--concurrency", "2", env={"PROVISIONER_POOL_SIZE": "0"}).idle()
    holders = sorted(wait_until(lambda: len(worker.holders()) == 2 and worker.holders(), 30, "2"))

    wait_until(
        lambda: jobs_server.sessions(holders) == holders, 30, "a session of each child on east"
    )
    assert worker.stop() == 0, worker.output()


def test_placement_prefers_no_server_for_spares_a_take_would_not_hand_out(
    placed: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    second_server: TenantServerDb,
) -> None:
    """A server whose only spares are of another tree state or role set, or whose spares no
    worker with the pool on would take, is not preferred over a less loaded one."""
    second_server.add_to(database, "west")
    assert run_cli(placed, "migrate").returncode == 0
    assert service.provision(placed, "first").job.status is JobStatus.SUCCEEDED
    assert _server_of(database, "first") == "east"  # west is the less loaded now
    stale, other_roles = fill(placed, jobs_server, "east", 2)
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.tenant_pool SET tree_digest = 'old' WHERE schema_name = %s", (stale,)
        )
        conn.execute(
            "UPDATE control.tenant_pool SET app_roles = 'app_rw=readonly' WHERE schema_name = %s",
            (other_roles,),
        )
    beat_pool(database, placed)
    with database.owner() as conn:
        assert pool.server_counts(conn, "east", placed.app_roles).ready == 0  # none a take's
        ensure_provision_job(conn, TenantId("second"))
    assert _server_of(database, "second") == "west"
    # Once a usable spare is there (built without grants: any role set takes it), east first.
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.tenant_pool SET app_roles = '' WHERE schema_name = %s", (other_roles,)
        )
        ensure_provision_job(conn, TenantId("third"))
    assert _server_of(database, "third") == "east"
    # No worker runs a pool (no heartbeat says what its takes are): by load alone.
    with database.owner() as conn:
        conn.execute("DELETE FROM control.runtime_heartbeats")
        conn.execute("UPDATE control.platform_jobs SET status = 'cancelled'")
        ensure_provision_job(conn, TenantId("fourth"))
    assert _server_of(database, "fourth") == "west"


def test_placement_believes_only_a_live_beat_written_by_the_owner_side(
    placed: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    second_server: TenantServerDb,
) -> None:
    """A usable spare on east, west the less loaded: east is preferred only while a pool's
    heartbeat is younger than the lease it promises, and only when the owner side wrote it
    (control revision 20261206_h35beats). A stopped worker's row, or one ``app_rw`` writes,
    leaves placement to load alone."""
    second_server.add_to(database, "west")
    assert run_cli(placed, "migrate").returncode == 0
    assert service.provision(placed, "first").job.status is JobStatus.SUCCEEDED
    assert _server_of(database, "first") == "east"  # west is the less loaded now
    fill(placed, jobs_server, "east", 1)
    takes = pool.takes_for(placed.app_roles, alive_seconds=30.0)

    def placed_on(tenant: str) -> str | None:
        with database.owner() as conn:
            ensure_provision_job(conn, TenantId(tenant))
            conn.execute("UPDATE control.platform_jobs SET status = 'cancelled'")
        return _server_of(database, tenant)

    with database.owner() as conn:
        heartbeats.beat(conn, "worker", "pool-test", {"pool": takes})
    assert placed_on("live") == "east"
    # The same beat 31 s old: its worker stopped beating (its lease said 30 s).
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.runtime_heartbeats SET heartbeat_at = now() - interval '31 seconds'"
        )
    assert placed_on("stopped") == "west"
    # A fresh beat with the same report, written by the application role.
    with database.owner() as conn:
        conn.execute("DELETE FROM control.runtime_heartbeats")
    with db.connect(placed.app_url) as conn:
        heartbeats.beat(conn, "worker", "forged", {"pool": takes})
        conn.commit()
    assert placed_on("forged") == "west"
    # A beat that does not say its lease (a worker older than the revision) counts for 60 s.
    with database.owner() as conn:
        conn.execute("DELETE FROM control.runtime_heartbeats")
        heartbeats.beat(conn, "worker", "older", {"pool": pool.takes_for(placed.app_roles)})
        conn.execute(
            "UPDATE control.runtime_heartbeats SET heartbeat_at = now() - interval '50 seconds'"
        )
    assert placed_on("older") == "east"


@pytest.mark.parametrize("alive", ['"nope"', "1e300", "-5", '{"x": 1}', "null"])
def test_a_heartbeat_the_application_writes_never_breaks_placement(
    placed: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    second_server: TenantServerDb,
    alive: str,
) -> None:
    """Control revision 20261207_h37guard: placement reads a heartbeat's lease only once the
    owner side is known to have written it, and only as a JSON number within a day. Before it,
    a row ``app_rw`` wrote with a lease that is not a number (or too large for an interval)
    raised in every placement while a server kept spares: no tenant could be registered."""
    second_server.add_to(database, "west")
    assert run_cli(placed, "migrate").returncode == 0
    assert service.provision(placed, "first").job.status is JobStatus.SUCCEEDED
    fill(placed, jobs_server, "east", 1)
    takes = pool.takes_for(placed.app_roles, alive_seconds=30.0)
    hostile = {"pool": {**takes, "alive_seconds": json.loads(alive)}}
    with db.connect(placed.app_url) as conn:
        heartbeats.beat(conn, "evil", "i", hostile)
        conn.commit()
    # An owner-side beat with the same bad lease: believed as no lease at all (not a number).
    with database.owner() as conn:
        heartbeats.beat(conn, "worker", "odd", hostile)
    for tenant in ("second", "third"):
        with database.owner() as conn:
            ensure_provision_job(conn, TenantId(tenant))
        assert _server_of(database, tenant) in ("east", "west")
    # The application's own registration goes through as well.
    with db.connect(placed.app_url) as conn:
        ensure_provision_job(conn, TenantId("fourth"))
        conn.commit()
    assert _server_of(database, "fourth") in ("east", "west")
