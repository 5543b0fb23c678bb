"""A worker frozen by SIGSTOP (the worker and its child, as ``docker pause`` does) inside its
first step's transaction on a tenant server, taken over, then woken (issue 29 leftovers).

The test holds an uncommitted ``CREATE SCHEMA tenant_<id>`` on the server, so the child's own
``CREATE SCHEMA`` in the ``create_schema`` step waits *inside* the server transaction that
raised the tenant's fence (no test hook in product code). The worker is stopped there, the
test's transaction rolled back: the child's statement completes on the server and its session
sits idle in the open transaction, holding the fence row, until the server's
``idle_in_transaction_session_timeout`` (set by the engine on its server sessions) ends it.
Another worker recovers the stale lease, waits for the fence row (its lock timeout longer than
the idle timeout) and completes the job once the frozen transaction is gone; the zombie, woken,
writes nothing on either server.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from typing import Any

import pytest

from provisioner import servers, service
from provisioner.kinds.provision import STEPS
from provisioner.settings import Settings
from provisioner.tenant.fingerprint import fingerprint
from tests.conftest import Database
from tests.extra_clusters import TenantServerDb
from tests.workers import Workers, job_row, overlapping_step_runs, step_runs, wait_until

#: The lease's outer bound on a step: 30 s, so that the server sessions' idle timeout (half of
#: it, 15 s: provisioner/engine/sessions.py) ends the frozen transaction well within it. The
#: frozen holder's job is recovered sooner, once its worker stops beating (0.5 s beats).
STALE = 30.0
SERVER_STEPS = ("create_schema", "run_tenant_migrations", "grant_app_rw", "seed_role_profiles")


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """The workers' settings: 0.5 s heartbeats, a 30 s step bound (see STALE)."""
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=STALE)


def _waiting_create(server: TenantServerDb) -> dict[str, Any] | None:
    """The server session waiting on a lock in its ``CREATE SCHEMA`` (the frozen step's: the
    statement rides with the schema's checks in one query, tenant/schema.py)."""
    with server.admin() as conn:
        row = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query ILIKE '%%CREATE SCHEMA IF NOT EXISTS%%'"
        ).fetchone()
    return None if row is None else {"pid": int(row[0]), "holder": str(row[1])}


def _session(server: TenantServerDb, pid: int) -> str | None:
    """The state of server backend ``pid`` (None: the session is gone)."""
    with server.admin() as conn:
        row = conn.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else str(row[0])


def test_a_worker_stopped_in_its_first_server_transaction_is_fenced_after_a_takeover(
    fast: Settings,
    database: Database,
    jobs_server: TenantServerDb,
    workers: Workers,
    clean_fingerprint: dict,
) -> None:
    jobs_server.add_to(database)
    assert [m.server for m in servers.migrate_servers(fast.owner_url)] == ["east"]
    blocker = jobs_server.owner()
    blocker.autocommit = False
    blocker.execute("CREATE SCHEMA tenant_sleeper")  # uncommitted: the step's waits on it
    try:
        first = workers.start()
        service.enqueue(fast, "sleeper")
        frozen = wait_until(lambda: _waiting_create(jobs_server), 60, "the step to block")
        holder = str(job_row(database, "sleeper")["locked_by"])
        assert frozen["holder"] == holder  # the job's holder, inside its first step there
        fence = jobs_server.fence("sleeper")
        first.send_group(signal.SIGSTOP)
    finally:
        blocker.rollback()  # the frozen child's CREATE SCHEMA now completes, uncommitted
        blocker.close()
    # Its session sits idle in the open transaction (the process is stopped) ...
    wait_until(
        lambda: _session(jobs_server, frozen["pid"]) == "idle in transaction",
        30,
        "the frozen step's session to sit idle in its transaction",
    )
    assert jobs_server.fence("sleeper") == fence and not jobs_server.journal("sleeper")

    second = workers.start(env={"PROVISIONER_LOCK_TIMEOUT_SECONDS": "120"})
    second.wait_for("recovered", 30, tenant_id="sleeper")
    # ... until the server's idle_in_transaction_session_timeout ends it (15 s here), which
    # lets the takeover's first step raise the fence: the takeover waits for that, no more.
    wait_until(lambda: _session(jobs_server, frozen["pid"]) is None, 60, "the timeout")
    second.wait_for("succeeded", 90, tenant_id="sleeper")
    result = job_row(database, "sleeper")
    assert (result["status"], result["attempts"]) == ("succeeded", 2)  # no attempt lost
    assert result["steps_completed"] == list(STEPS)
    journal = jobs_server.journal("sleeper")
    token = jobs_server.fence("sleeper")
    assert token is not None and (fence is None or token > fence)
    assert journal == {step: token for step in SERVER_STEPS}  # all the takeover's
    runs = step_runs(database, "sleeper")

    first.send_group(signal.SIGCONT)
    # The zombie finds its server session ended (no write of it can commit there), then its
    # lease gone on control.
    failed = first.wait_for("step_failed", 60, tenant_id="sleeper", step="create_schema")
    lost = ("connection is lost", "server closed the connection unexpectedly")
    assert any(text in failed["detail"] for text in lost), failed  # (mid-read, or at its next)
    first.wait_for("lease_lost", 60, tenant_id="sleeper")

    # Nothing the woken zombie did reached either server, nor control's job row.
    assert jobs_server.journal("sleeper") == journal
    assert jobs_server.fence("sleeper") == token
    assert job_row(database, "sleeper") == result
    assert step_runs(database, "sleeper") == runs
    zombie_run = runs[0]
    assert (zombie_run["attempt"], zombie_run["step"], zombie_run["worker"]) == (
        1,
        "create_schema",
        holder,
    )
    assert zombie_run["outcome"] == "abandoned" and len(runs) == 1 + len(STEPS)
    assert all(r["worker"] != holder and r["outcome"] == "succeeded" for r in runs[1:])
    assert overlapping_step_runs(database) == []
    with jobs_server.owner() as conn:
        assert fingerprint(conn, "tenant_sleeper") == clean_fingerprint
    assert first.stop() == 0, first.output()[-3000:]
    assert second.stop() == 0, second.output()[-3000:]
