"""Fleet commands across servers (issue 29, item 5): ``check --all``, ``tenants list``,
``health`` and ``upgrade --all`` reach tenants on the control database and on two real tenant
servers (the run's extra clusters, :mod:`tests.extra_clusters`), report per server, and report
a server that is down (its address refusing connections, as a stopped server's does) while the
others proceed. The fan-out's bound (one session per server, a few servers at once) is observed
in ``pg_stat_activity`` of every cluster.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from provisioner import servers, service
from provisioner.fleet import progress
from provisioner.settings import Settings
from tests.conftest import Database, run_cli
from tests.extra_clusters import FleetServer as TenantServer
from tests.extra_clusters import place, register
from tests.integration.test_worker import downgrade_control_one_revision


def provision_here(settings: Settings, tenant: str) -> None:
    """``tenant`` on the control database (in process: the fleet commands are under test)."""
    result = service.provision(settings, tenant)
    assert result.job.status.value == "succeeded", result.job.error_detail


@pytest.fixture
def fleet(
    settings: Settings, database: Database, tenant_servers: dict[str, TenantServer]
) -> dict[str, TenantServer]:
    """Tenants on three servers: home1, home2 on the control database; e1, e2 on east; w1 on
    west (provisioned before any server was added, or named)."""
    provision_here(settings, "home1")
    provision_here(settings, "home2")
    register(database, *tenant_servers.values())
    place(settings, database, tenant_servers["east"], "e1")
    place(settings, database, tenant_servers["east"], "e2")
    place(settings, database, tenant_servers["west"], "w1")
    return tenant_servers


def test_check_all_reads_each_tenant_on_its_own_server_and_reports_drift_under_it(
    settings: Settings, database: Database, fleet: dict[str, TenantServer]
) -> None:
    clean = run_cli(settings, "check", "--all", "--json")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    report = json.loads(clean.stdout)
    assert report["counts"]["clean"] == 5 and report["unchecked"] == 0
    assert [(s["server"], s["reachable"], s["tenants"]) for s in report["servers"]] == [
        ("control", True, 2),
        ("east", True, 2),
        ("west", True, 1),
    ]
    # Drift made by hand on east's e2, where the tenant lives (the control database has no
    # tenant_e2 schema at all: were it read there, every tenant of east would be drifted).
    with fleet["east"].admin() as conn:
        conn.execute("DROP INDEX tenant_e2.audit_events_actor_idx")
    out = run_cli(settings, "check", "--all", "--json")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    drifted = [t for t in report["tenants"] if t["state"] == "drifted"]
    assert [t["tenant_id"] for t in drifted] == ["e2"]
    assert [f["name"] for f in drifted[0]["findings"]] == ["audit_events_actor_idx"]
    by_server = {s["server"]: s for s in report["servers"]}
    assert by_server["east"]["counts"]["drifted"] == 1
    assert by_server["control"]["counts"]["drifted"] == by_server["west"]["counts"]["drifted"] == 0
    text = run_cli(settings, "check", "--all").stdout.splitlines()
    east = text.index("server east: 2 tenant(s) checked: 1 clean, 1 drifted")
    assert text[east + 1].startswith("  e2: drifted (1 missing")
    with database.owner() as conn:
        stored = dict(
            conn.execute(
                "SELECT DISTINCT ON (tenant_id) tenant_id, outcome FROM control.tenant_checks"
                " ORDER BY tenant_id, checked_at DESC"
            ).fetchall()
        )
    assert stored == {
        "home1": "clean",
        "home2": "clean",
        "e1": "clean",
        "e2": "drifted",
        "w1": "clean",
    }


def test_a_server_that_is_down_is_reported_while_the_others_are_checked(
    settings: Settings, database: Database, fleet: dict[str, TenantServer]
) -> None:
    assert run_cli(settings, "check", "--all").returncode == 0
    with database.owner() as conn:
        before = conn.execute(
            "SELECT tenant_id, checked_at FROM control.tenant_checks WHERE tenant_id LIKE 'e%'"
            " ORDER BY 1, 2"
        ).fetchall()
    fleet["east"].stop()
    out = run_cli(settings, "check", "--all", "--json")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert sorted(t["tenant_id"] for t in report["tenants"]) == ["home1", "home2", "w1"]
    assert report["counts"]["clean"] == 3 and report["unchecked"] == 2
    east = next(s for s in report["servers"] if s["server"] == "east")
    assert (east["reachable"], east["unchecked"]) == (False, ["e1", "e2"])
    assert "password" not in (east["problem"] or "").lower() or "passfile" not in east["problem"]
    text = run_cli(settings, "check", "--all")
    assert text.returncode == 1
    assert "5 tenant(s)" not in text.stdout
    assert "3 tenant(s) checked: 3 clean; 2 unchecked (server down)" in text.stdout
    assert "server east: DOWN, 2 tenant(s) unchecked (" in text.stdout
    with database.owner() as conn:
        after = conn.execute(
            "SELECT tenant_id, checked_at FROM control.tenant_checks WHERE tenant_id LIKE 'e%'"
            " ORDER BY 1, 2"
        ).fetchall()
    assert after == before  # east's tenants keep their last stored check

    health = run_cli(settings, "health", "--json")
    found = {s["name"]: s for s in json.loads(health.stdout)["servers"]}
    assert (found["east"]["reachable"], found["west"]["reachable"]) == (False, True)
    assert "tenant server east: active, 2 tenants, DOWN (" in run_cli(settings, "health").stdout

    listed = run_cli(settings, "tenants", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {t["tenant_id"]: t for t in json.loads(listed.stdout)}
    assert rows["e1"]["server"] == "east" and rows["e1"]["server_reachable"] is False
    assert rows["w1"]["revision"] and rows["w1"]["server_reachable"] is True
    assert "server east: DOWN" in run_cli(settings, "tenants", "list").stderr


def test_tenants_list_reads_each_servers_versions_there(
    settings: Settings, fleet: dict[str, TenantServer]
) -> None:
    listed = run_cli(settings, "tenants", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {t["tenant_id"]: t for t in json.loads(listed.stdout)}
    head = rows["home1"]["revision"]
    assert head and all(rows[t]["revision"] == head for t in ("e1", "e2", "w1"))
    assert not any(t["behind"] for t in rows.values())


def test_upgrade_all_queues_the_tenants_behind_on_every_server_and_reports_per_server(
    settings: Settings, database: Database, fleet: dict[str, TenantServer]
) -> None:
    """The tenants at the head on a tenant server are read there (not queued); those behind
    are queued, counted under their server (their jobs run there: test_server_lifecycle.py)."""
    with fleet["west"].admin() as conn:
        conn.execute("UPDATE tenant_w1.alembic_version SET version_num = 'c0ffee'")
    out = run_cli(settings, "upgrade", "--all", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [t["tenant_id"] for t in report["behind"]] == ["w1"]
    per = {s["server"]: s for s in report["servers"]}
    assert (per["west"]["behind"], per["east"]["behind"], per["control"]["behind"]) == (1, 0, 0)
    assert per["east"]["reachable"] is True
    text = run_cli(settings, "upgrade", "--all", "--dry-run").stdout
    assert "server west: 1 tenant(s) checked, 1 behind" in text
    queued = run_cli(settings, "upgrade", "--all", "--json")
    assert queued.returncode == 0, queued.stderr
    report = json.loads(queued.stdout)
    assert report["rollout_id"] is not None
    assert [(t["tenant_id"], t["action"]) for t in report["behind"]] == [("w1", "queued")]
    assert progress(settings).servers == {"west": {"queued": 1}}  # --watch's frame
    fleet["east"].stop()
    down = run_cli(settings, "upgrade", "--all", "--dry-run", "--json")
    assert down.returncode == 1, down.stderr
    report = json.loads(down.stdout)
    per = {s["server"]: s for s in report["servers"]}
    assert per["east"]["reachable"] is False and per["east"]["unread"] == 2
    assert report["behind"] == [] and report["checked"] == 2  # w1's job is queued already


def test_a_lifecycle_batch_over_several_servers_is_reported_per_server(
    settings: Settings, fleet: dict[str, TenantServer]
) -> None:
    out = run_cli(settings, "suspend", "home1", "e1", "e2", "w1", "--queue", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["batch_size"] == 4
    assert [(s["server"], s["tenants"]) for s in report["servers"]] == [
        ("control", 1),
        ("east", 2),
        ("west", 1),
    ]
    alone = run_cli(settings, "suspend", "home1", "home2", "--queue", "--json")
    assert alone.returncode == 0, alone.stderr
    assert "servers" not in json.loads(alone.stdout)  # the control database alone: as it was


def test_the_fan_out_holds_one_session_per_server_and_a_few_servers_at_once(
    settings: Settings, database: Database, tenant_servers: dict[str, TenantServer]
) -> None:
    """Six servers (the control database, and three databases on east, two on west, each in
    the directory), three at once: the work, seen from inside once the three of a round have
    connected, finds exactly three sessions of the fan-out on all clusters together, and never
    two on one database."""
    register(database, *tenant_servers.values())
    extra = []
    for server, n in (
        (tenant_servers["east"], 2),
        (tenant_servers["east"], 3),
        (tenant_servers["west"], 2),
    ):
        name = f"{server.database}_{n}"
        with psycopg.connect(server.cluster.superuser_url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{server.database}"')
        extra.append((server, name))
        with database.owner() as conn:
            servers.add(conn, f"{server.name}{n}", server.reference.replace(server.database, name))
    with database.owner() as conn:
        plan = servers.targets(servers.directory(conn), settings.owner_url)
    assert len(plan) == 6
    admins = [s.cluster.superuser_url() for s in tenant_servers.values()]
    admins.append(database.admin_url)
    seen: list[list[tuple[str, int]]] = []
    lock = threading.Lock()
    round_of_three = threading.Barrier(3, timeout=60)

    def observe(conn: Any, target: servers.Target) -> str:
        round_of_three.wait()  # the round's three servers are connected
        sessions = []
        for url in admins:
            with psycopg.connect(url, autocommit=True) as admin:
                sessions += admin.execute(
                    "SELECT datname, count(*)::int FROM pg_stat_activity"
                    " WHERE application_name = 'fan-out-test' GROUP BY datname"
                ).fetchall()
        with lock:
            seen.append(sessions)
        round_of_three.wait()  # nobody leaves (and closes) before all three looked
        return target.name

    try:
        reached = servers.fan_out(plan, observe, application_name="fan-out-test", at_once=3)
    finally:
        for server, name in extra:
            with psycopg.connect(server.cluster.superuser_url(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert [r.result for r in reached.values()] == [t.name for t in plan]
    assert len(seen) == 6
    assert [sum(n for _, n in s) for s in seen] == [3] * 6  # three at once, never more
    assert all(n == 1 for s in seen for _, n in s)  # one session per database


def test_a_server_whose_reference_sets_sslkeylogfile_is_reported_and_never_read(
    settings: Settings, database: Database, fleet: dict[str, TenantServer], tmp_path: Path
) -> None:
    """A reference stored with ``sslkeylogfile`` (before ``servers add`` and the directory's
    trigger refused it) is never connected with: ``check --all``, ``health``, ``tenants list``
    and ``upgrade --all`` report that server, naming the key and not its file, while the other
    servers are read. East is up: only its reference keeps it from being read."""
    keys = tmp_path / "hunter2.keys"
    with database.owner() as conn, conn.transaction():
        conn.execute("ALTER TABLE control.tenant_servers DISABLE TRIGGER tenant_servers_no_keylog")
        changed = conn.execute(
            "UPDATE control.tenant_servers SET conninfo = %s WHERE name = 'east'",
            (f"{fleet['east'].reference} sslkeylogfile={keys}",),
        )
        assert changed.rowcount == 1
        conn.execute("ALTER TABLE control.tenant_servers ENABLE TRIGGER tenant_servers_no_keylog")
    problem = "its reference sets sslkeylogfile: libpq would write the TLS session keys to "

    checked = run_cli(settings, "check", "--all", "--json")
    assert checked.returncode == 1, checked.stderr
    report = json.loads(checked.stdout)
    assert sorted(t["tenant_id"] for t in report["tenants"]) == ["home1", "home2", "w1"]
    east = next(s for s in report["servers"] if s["server"] == "east")
    assert (east["reachable"], east["unchecked"]) == (False, ["e1", "e2"])
    assert east["problem"].startswith(problem)

    health = run_cli(settings, "health", "--json")
    found = {s["name"]: s for s in json.loads(health.stdout)["servers"]}
    assert (found["east"]["reachable"], found["west"]["reachable"]) == (False, True)
    assert found["east"]["problem"].startswith(problem)

    listed = run_cli(settings, "tenants", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {t["tenant_id"]: t for t in json.loads(listed.stdout)}
    assert rows["e1"]["server_reachable"] is False and rows["w1"]["revision"]
    assert f"server east: DOWN, 2 tenant(s) with no revision read ({problem}" in listed.stderr

    upgraded = run_cli(settings, "upgrade", "--all", "--dry-run", "--json")
    assert upgraded.returncode == 1, upgraded.stderr
    per = {s["server"]: s for s in json.loads(upgraded.stdout)["servers"]}
    assert (per["east"]["reachable"], per["west"]["reachable"]) == (False, True)

    shown = "".join(o.stdout + o.stderr for o in (checked, health, listed, upgraded))
    assert "hunter2" not in shown and str(tmp_path) not in shown
    assert not keys.exists()


def test_an_upgrade_refused_for_a_control_schema_behind_reaches_no_tenant_server(
    settings: Settings, database: Database
) -> None:
    """fleet/upgrade.py: the tenant servers' read of ``upgrade --all`` begins once the call
    found the control schema at head and read the placement on its own session; a call refused
    before (here control is one revision behind) connects to no tenant server, nor waits for
    one that never answers. Before, a thread of its own read the placement and reached the
    servers whatever the call's fate."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hushed:
        hushed.bind(("127.0.0.1", 0))
        hushed.listen(8)
        hushed.setblocking(False)
        with database.owner() as conn:
            servers.add(conn, "hushed", f"host=127.0.0.1 port={hushed.getsockname()[1]}")
            conn.execute(
                "INSERT INTO control.tenants (tenant_id, schema_name, server) "
                "VALUES ('h1', 'tenant_h1', 'hushed')"
            )
        downgrade_control_one_revision(database)
        refused = run_cli(settings, "upgrade", "--all")
        assert refused.returncode == 2 and "not at this release's head" in refused.stderr, (
            refused.stderr
        )
        with pytest.raises(BlockingIOError):
            hushed.accept()  # nobody knocked
