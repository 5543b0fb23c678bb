"""An offboarded tenant stays offboarded: ``upgrade`` (``--all`` and named) and a worker leave a
deprovisioned or purged tenant alone even when its schema is behind the template's head."""

from __future__ import annotations

import json

import psycopg

from provisioner import service
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import Database, downgrade_tenant, run_cli


def versions(database: Database, tenant: str) -> list[str] | None:
    with psycopg.connect(database.owner_url) as conn:
        return sorted(migrations.tenant_versions(conn, f"tenant_{tenant}") or []) or None


def test_upgrade_all_after_a_deprovision_leaves_the_tenant_alone(
    settings: Settings, database: Database
) -> None:
    for tenant in ("kept", "gone", "purged"):
        service.provision(settings, tenant)
        downgrade_tenant(database, tenant, "t003")  # each one behind the head
    assert run_cli(settings, "deprovision", "gone").returncode == 0
    purge = run_cli(settings, "deprovision", "purged", "--purge", "--yes")
    assert purge.returncode == 0, purge.stderr

    dry = run_cli(settings, "upgrade", "--all", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert [b["tenant_id"] for b in report["behind"]] == ["kept"]
    # A purged tenant has left the fleet: listed among the skipped only when asked for.
    assert [(s["tenant_id"], s["state"]) for s in report["skipped"]] == [("gone", "archived")]
    full = run_cli(settings, "upgrade", "--all", "--dry-run", "--json", "--include-deleted")
    assert sorted((s["tenant_id"], s["state"]) for s in json.loads(full.stdout)["skipped"]) == [
        ("gone", "archived"),
        ("purged", "deleted"),
    ]

    named = run_cli(settings, "upgrade", "gone")
    assert named.returncode == 2
    assert named.stderr.strip() == "error: tenant gone is archived: an upgrade leaves it alone"

    assert run_cli(settings, "upgrade", "--all").returncode == 0
    drained = run_cli(settings, "worker", "--once")
    assert drained.returncode == 0, drained.stderr
    assert versions(database, "kept") == sorted(migrations.tenant_heads())
    assert versions(database, "gone") == ["t003"]  # data kept, schema as it was, no access
    with psycopg.connect(database.owner_url) as conn:
        purged = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = 'tenant_purged'"
        ).fetchone()
        states = dict(conn.execute("SELECT tenant_id, state FROM control.tenants").fetchall())
    assert purged is None  # nothing re-created the purged schema
    assert states == {"kept": "onboarding", "gone": "archived", "purged": "deleted"}
