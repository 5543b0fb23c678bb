"""The fast path's reference is stored once per database and tree state and shared by every
process: a fresh process replays from its first tenant, and two processes that need it at once
compute it once."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.templates.reference import REFERENCE_LOCK_CLASS, reference_key
from tests.conftest import Database, run_cli, settings_env
from tests.workers import step_runs, wait_until

HEAD = migrations.head_label(migrations.tenant_heads())
#: Where the reference is stored: the tree's digest and the fingerprint's format.
KEY = reference_key(migrations.tenant_tree_state().digest)


def migration_record(database: Database, tenant: str) -> tuple[str, str]:
    """(detail, worker) of the tenant's succeeded migration step."""
    (run,) = [
        r
        for r in step_runs(database, tenant)
        if r["step"] == "run_tenant_migrations" and r["outcome"] == "succeeded"
    ]
    return str(run["detail"]), str(run["worker"])


def references(database: Database) -> list[tuple[str, str]]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT tree_digest, created_by FROM control.tenant_template_references"
        ).fetchall()
    return [(str(d), str(c)) for d, c in rows]


def test_a_fresh_process_replays_the_shared_reference_from_its_first_tenant(
    settings: Settings, database: Database
) -> None:
    first = run_cli(settings, "provision", "first")
    assert first.returncode == 0, first.stderr
    detail, first_holder = migration_record(database, "first")
    # Even the database's very first tenant: the reference is computed, then replayed.
    assert detail == f"path=template head={HEAD}"
    assert references(database) == [(KEY, first_holder)]

    second = run_cli(settings, "provision", "second")  # another process, its first tenant
    assert second.returncode == 0, second.stderr
    detail, second_holder = migration_record(database, "second")
    assert second_holder != first_holder
    assert detail == f"path=template head={HEAD}"
    assert references(database) == [(KEY, first_holder)]


def waiting_on_lock(database: Database, count: int) -> bool:
    with psycopg.connect(database.admin_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'cli:%%' "
            "AND wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    return bool(row and row[0] >= count)


def test_two_processes_computing_the_reference_at_once_compute_it_once(
    settings: Settings, database: Database
) -> None:
    digest = migrations.tenant_tree_state().digest
    env = settings_env(settings)
    with psycopg.connect(database.owner_url, autocommit=True) as gate:
        # Hold the reference's lock: both processes find no reference and queue behind it.
        gate.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (REFERENCE_LOCK_CLASS, digest))
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "provisioner", "provision", tenant],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for tenant in ("left", "right")
        ]
        try:
            wait_until(lambda: waiting_on_lock(database, 2), 60, "both to wait on the lock")
        finally:
            gate.execute(
                "SELECT pg_advisory_unlock(%s, hashtext(%s))", (REFERENCE_LOCK_CLASS, digest)
            )
        outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    details = [migration_record(database, tenant) for tenant in ("left", "right")]
    assert [d for d, _ in details] == [f"path=template head={HEAD}"] * 2
    ((stored_digest, created_by),) = references(database)
    assert stored_digest == reference_key(digest)
    assert created_by in {holder for _, holder in details}


def test_a_reference_stored_with_another_fingerprint_format_is_never_used(
    settings: Settings, database: Database
) -> None:
    """A reference stored by a version that rendered the catalog differently (the bare digest
    was the key before the fingerprint's format joined it) is left alone, not compared."""
    digest = migrations.tenant_tree_state().digest
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO control.tenant_template_references "
            "(tree_digest, heads, statements, fingerprint, created_by) "
            "VALUES (%s, %s, ARRAY['SELECT 1'], '{}', 'an older version')",
            (digest, sorted(migrations.tenant_heads())),
        )
    result = run_cli(settings, "provision", "current")
    assert result.returncode == 0, result.stderr
    detail, holder = migration_record(database, "current")
    assert detail == f"path=template head={HEAD}"
    assert sorted(references(database)) == sorted([(digest, "an older version"), (KEY, holder)])
