"""A take from a tenant server's warm pool killed by SIGKILL between its server commit and its
control checkpoint (issue 29, item 2): the spare is taken once and its record goes once.

The child provisions a tenant placed on the server with two spares ready there and freezes
once the ``create_schema`` step committed on the server (the oldest spare renamed to the
tenant's schema, with its journal row), before control's checkpoint. Its control row is then
still there, claimed by the tenant: another tenant's take skips it (it gets the other spare),
and the resume adopts the step from the server's journal and deletes the claimed row in its
checkpoint.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from provisioner import service
from provisioner.engine import StepEvent
from provisioner.kinds.provision import STEPS
from provisioner.models import JobStatus
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database, run_cli
from tests.integration.test_server_pool import fill, pool_rows, recorded_names
from tests.job_server import TenantServerDb
from tests.workers import kill_frozen

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
