"""A take from a tenant server's warm pool killed by SIGKILL between its server commit and its
control checkpoint (issue 29, item 2): the spare is taken once and its record goes once.

The child provisions a tenant placed on the server with two spares ready there and freezes
once the ``create_schema`` step committed on the server (the oldest spare renamed to the
tenant's schema, with its journal row), before control's checkpoint. Its control row is then
still there, claimed by the tenant: another tenant's take skips it (it gets the other spare),
and the resume adopts the step from the server's journal and deletes the claimed row in its
checkpoint.

A run killed between its claim on control and the rename on the server (``claim_child.py``)
leaves the spare whole and claimed: the resume takes it; once its job is cancelled the claim
is abandoned and the next builder drops the spare and builds another.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from provisioner import pool, service
from provisioner.engine import StepEvent
from provisioner.kinds.provision import STEPS
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database, run_cli
from tests.integration.test_server_pool import fill, pool_rows, recorded_names
from tests.job_server import TenantServerDb
from tests.workers import job_row, kill_frozen

KILL_CHILD = Path(__file__).with_name("provision_child.py")


def test_sigkill_after_the_server_take_keeps_the_spare_taken_once(
    settings: Settings, database: Database, jobs_server: TenantServerDb, clean_fingerprint: dict
) -> None:
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    settings = replace(settings, pool_size=1)  # a take on a server claims only then
    first, second = fill(settings, jobs_server, "east", 2)

    kill_frozen(settings, KILL_CHILD, "victim", "create_schema", "on_server")

    # The server committed the take: the oldest spare is the tenant's schema there.
    assert not jobs_server.schema_exists(first) and jobs_server.schema_exists("tenant_victim")
    assert jobs_server.journal("victim").keys() == {"create_schema"}
    # Control's checkpoint did not follow: the spare's row is there, claimed by the tenant.
    assert pool_rows(database) == [(first, "east", "victim"), (second, "east", None)]

    # Another tenant meanwhile takes the other spare, never the claimed one.
    other = service.provision(settings, "other")
    assert other.job.status is JobStatus.SUCCEEDED
    assert not jobs_server.schema_exists(second)
    assert pool_rows(database) == [(first, "east", "victim")]

    events: list[StepEvent] = []
    result = service.provision(settings, "victim", on_progress=events.append)

    assert (result.job.status, result.job.attempts) == (JobStatus.SUCCEEDED, 2)
    assert result.job.steps_completed == list(STEPS)
    adopted = [e.step for e in events if e.outcome == "skipped" and e.detail]
    assert adopted == ["create_schema"]  # not run again: no second take
    assert pool_rows(database) == []  # the checkpoint deleted the claimed row, once
    assert recorded_names(database) == set()
    with jobs_server.owner() as conn:
        for tenant in ("tenant_victim", "tenant_other"):
            assert fingerprint(conn, tenant) == clean_fingerprint
        details = dict(
            conn.execute(
                "SELECT tenant_id, detail FROM provisioner_server.step_journal"
                " WHERE step = 'create_schema'"
            ).fetchall()
        )
    assert details == {
        "victim": f"taken from the warm pool: {first}",
        "other": f"taken from the warm pool: {second}",
    }


CLAIM_CHILD = Path(__file__).with_name("claim_child.py")


def test_sigkill_between_the_claim_and_the_rename_keeps_the_spare_for_the_resume(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    """Killed after its claim committed on control, before the rename on the server: the spare
    stays whole and claimed. While the job can still resume (queued or running) a keeper's
    refill neither drops it nor counts it ready, another tenant's take skips it, and the
    resume takes that very spare: taken once, no second one."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    settings = replace(settings, pool_size=1)
    first, second = fill(settings, jobs_server, "east", 2)

    kill_frozen(settings, CLAIM_CHILD, "victim", "create_schema", "claimed")

    assert jobs_server.schema_exists(first) and not jobs_server.schema_exists("tenant_victim")
    assert jobs_server.journal("victim") == {}  # the server's transaction rolled back
    assert pool_rows(database) == [(first, "east", "victim"), (second, "east", None)]
    assert job_row(database, "victim")["status"] == "running"  # its holder is dead

    # The next builder: the claim is the resume's, neither dropped nor ready (one more built).
    (third,) = fill(settings, jobs_server, "east", 2)
    assert jobs_server.schema_exists(first)
    assert pool_rows(database) == [
        (first, "east", "victim"),
        (second, "east", None),
        (third, "east", None),
    ]
    other = service.provision(settings, "other")  # the oldest unclaimed one, not the claimed
    assert other.job.status is JobStatus.SUCCEEDED
    assert not jobs_server.schema_exists(second)

    result = service.provision(settings, "victim")

    assert (result.job.status, result.job.attempts) == (JobStatus.SUCCEEDED, 2)
    assert not jobs_server.schema_exists(first)
    assert pool_rows(database) == [(third, "east", None)]
    assert recorded_names(database) == {third}
    with jobs_server.owner() as conn:
        details = dict(
            conn.execute(
                "SELECT tenant_id, detail FROM provisioner_server.step_journal"
                " WHERE step = 'create_schema'"
            ).fetchall()
        )
    assert details == {
        "victim": f"taken from the warm pool: {first}",
        "other": f"taken from the warm pool: {second}",
    }


def test_a_claim_left_by_a_killed_run_whose_job_is_cancelled_is_dropped_by_the_keeper(
    settings: Settings, database: Database, jobs_server: TenantServerDb
) -> None:
    """Killed between its claim and the rename, then its job cancelled: the claim is
    abandoned (no run left to finish it). The next builder drops the spare by its ``pool_``
    name and builds another in its place: the spare is not lost to the pool, and nobody is
    handed it. The tenant, provisioned again, takes the new one."""
    jobs_server.add_to(database)
    assert run_cli(settings, "migrate").returncode == 0
    settings = replace(settings, pool_size=1)
    (spare,) = fill(settings, jobs_server, "east", 1)

    kill_frozen(settings, CLAIM_CHILD, "gone", "create_schema", "claimed")
    assert pool_rows(database) == [(spare, "east", "gone")]
    with database.owner() as conn:  # a claim of a live job: neither ready nor stale
        found = pool.server_counts(conn, "east", settings.app_roles)
    assert (found.ready, found.stale) == (0, 0)

    cancelled = run_cli(settings, "jobs", "cancel", str(job_row(database, "gone")["id"]))
    assert cancelled.returncode == 0, cancelled.stderr
    assert job_row(database, "gone")["status"] == "cancelled"
    with database.owner() as conn:
        assert pool.server_counts(conn, "east", settings.app_roles).stale == 1

    (rebuilt,) = fill(settings, jobs_server, "east", 1)

    assert rebuilt != spare
    assert not jobs_server.schema_exists(spare) and jobs_server.schema_exists(rebuilt)
    assert pool_rows(database) == [(rebuilt, "east", None)]
    assert recorded_names(database) == {rebuilt}
    assert not jobs_server.schema_exists("tenant_gone")

    retried = run_cli(settings, "jobs", "retry", str(job_row(database, "gone")["id"]))
    assert retried.returncode == 0, retried.stderr
    result = service.provision(settings, "gone")
    assert result.job.status is JobStatus.SUCCEEDED
    assert not jobs_server.schema_exists(rebuilt) and jobs_server.schema_exists("tenant_gone")
    assert pool_rows(database) == [] and recorded_names(database) == set()
