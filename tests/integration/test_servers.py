"""The directory of tenant servers and placement (issue 29, steps 1-3), on the real control
database: ``provisioner servers`` and ``locate`` as child processes, placement through the
library's enqueue as the application role, capacities under concurrent enqueues from several
real processes.

Placement needs no tenant server to be reachable: it is a row in the directory and a column of
the tenant's control row, chosen in the enqueue's transaction. The servers' references here
name ports nothing listens on, on purpose."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import provisioner
from provisioner import servers
from provisioner.errors import ConfigurationError
from provisioner.servers import journal, moves
from provisioner.servers.reach import owner_address
from provisioner.settings import Settings
from tests.conftest import Database, run_cli, settings_env
from tests.workers import wait_until

A = "host=127.0.0.1 port=1 dbname=tenants_a"
B = "host=127.0.0.1 port=2 dbname=tenants_b"


def add(database: Database, name: str, reference: str, **flags: int) -> None:
    with database.owner() as conn:
        servers.add(conn, name, reference, **flags)


def placed(database: Database) -> dict[str | None, int]:
    """Tenants not purged per server (None: the control database), and the directory's own
    counts agree with them."""
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT server, count(*) FROM control.tenants WHERE state <> 'deleted' GROUP BY 1"
        ).fetchall()
        counted = dict(conn.execute("SELECT name, placed FROM control.tenant_servers").fetchall())
    found = {server: n for server, n in rows}
    assert counted == {name: found.get(name, 0) for name in counted}
    return found


def rows_of(database: Database, tenant: str) -> tuple[int, int]:
    with database.owner() as conn:
        tenants = conn.execute(
            "SELECT count(*) FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
        jobs = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert tenants is not None and jobs is not None
    return tenants[0], jobs[0]


def enqueue(database: Database, tenant: str, server: str | None = None) -> None:
    """The library's enqueue as the application role, committed."""
    with psycopg.connect(database.app_url) as conn:
        provisioner.enqueue(conn, tenant, server=server)


def test_with_no_server_every_tenant_stays_on_the_control_database(database: Database) -> None:
    enqueue(database, "acme")
    assert placed(database) == {None: 1}
    with database.app() as conn:
        found = provisioner.locate("acme", conn=conn)
    assert (found.server, found.conninfo) == ("control", None)


def test_servers_commands_add_list_drain_retire_with_json_and_exit_codes(
    settings: Settings, database: Database
) -> None:
    out = run_cli(settings, "servers", "add", "east", A, "--capacity", "5", "--json")
    assert (out.returncode, out.stderr) == (0, "")
    assert json.loads(out.stdout) == {
        "name": "east",
        "conninfo": A,
        "status": "active",
        "capacity": 5,
        "weight": 1,
        "tenants": 0,
    }
    out = run_cli(settings, "servers", "add", "west", "shard_west", "--weight", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "tenant server west added (service=shard_west), active\n"
    # what to do next, on stderr (the JSON form says nothing more)
    assert out.stderr.startswith("next: `provisioner migrate` (the tool's schema on west:")
    assert "`provisioner servers drain west`" in out.stderr
    enqueue(database, "acme", server="east")
    listed = run_cli(settings, "servers", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [
        (s["name"], s["status"], s["tenants"], s["conninfo"]) for s in json.loads(listed.stdout)
    ] == [
        ("control", "default", 0, None),
        ("east", "active", 1, A),
        ("west", "active", 0, "service=shard_west"),
    ]
    text = run_cli(settings, "servers", "list")
    assert text.returncode == 0 and "east" in text.stdout and "service=shard_west" in text.stdout

    drained = run_cli(settings, "servers", "drain", "east", "--json")
    assert drained.returncode == 0 and json.loads(drained.stdout)["status"] == "draining"
    refused = run_cli(settings, "servers", "retire", "east")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: tenant server east still holds 1 tenant(s): drain it and move them before "
        "retiring it"
    )
    assert run_cli(settings, "servers", "retire", "west").returncode == 0
    assert run_cli(settings, "servers", "activate", "east").returncode == 0
    assert run_cli(settings, "servers", "full", "east").returncode == 0
    with database.owner() as conn:
        states = dict(conn.execute("SELECT name, status FROM control.tenant_servers").fetchall())
    assert states == {"east": "full", "west": "retired"}

    unknown = run_cli(settings, "servers", "drain", "north")
    assert (unknown.returncode, unknown.stderr.strip()) == (
        3,
        "error: no tenant server named north in the directory",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add", "East", A), "invalid server name 'East'"),
        (("add", "control", A), "invalid server name 'control'"),
        (("add", "east", "host=h password=hunter2 dbname=x"), "holds a secret (password)"),
        (("add", "east", "postgresql://u:hunter2@h/x"), "holds a secret (password)"),
        (("add", "east", "host=h sslpassword=hunter2"), "holds a secret (sslpassword)"),
        (("add", "east", "postgresql://h/x?sslpassword=hunter2"), "holds a secret (sslpassword)"),
        (("add", "east", "host=h oauth_client_secret=hunter2"), "(oauth_client_secret)"),
        # libpq 18 would write the TLS keys of every session opened with it to that file
        (("add", "east", "host=h sslkeylogfile=/tmp/hunter2"), "sets sslkeylogfile"),
        (("add", "east", "postgresql://h/x?sslkeylogfile=/tmp/hunter2"), "sets sslkeylogfile"),
        # a line of its own in pgbouncer.ini, `servers list` and `locate` (never shown back)
        (
            ("add", "east", "host=127.0.0.1 dbname='x\nhunter2 = host=attacker.example'"),
            "holds a control character",
        ),
        (("add", "east", "host=h\tdbname=hunter2"), "holds a control character"),
        (("add", "east", "host=h dbname=x\x7fhunter2"), "holds a control character"),
        (("add", "east", "postgresql://h/x%0Ahunter2"), "dbname holds a control character"),
        (("add", "east", "host='unterminated"), "neither a libpq service name nor a conninfo"),
        (("add", "east", A, "--weight", "0"), "Invalid value for '--weight'"),
        (("drain", "Bad Name"), "invalid server name"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_created(
    settings: Settings, database: Database, args: tuple[str, ...], message: str
) -> None:
    out = run_cli(settings, "servers", *args)
    assert out.returncode == 2, out
    assert message in out.stderr and "hunter2" not in out.stderr + out.stdout
    assert len([line for line in out.stderr.splitlines() if line.startswith("error")]) <= 1
    if args[0] == "add" and not args[-1].isdigit():  # the library's refusals: one line
        assert len(out.stderr.splitlines()) == 1, out.stderr
    with database.owner() as conn:
        assert conn.execute("SELECT count(*) FROM control.tenant_servers").fetchone() == (0,)


def test_a_duplicate_name_is_refused(settings: Settings, database: Database) -> None:
    add(database, "east", A)
    out = run_cli(settings, "servers", "add", "east", B)
    assert (out.returncode, out.stderr.strip()) == (
        2,
        "error: a tenant server named east is already in the directory",
    )
    with database.owner() as conn:
        assert conn.execute("SELECT conninfo FROM control.tenant_servers").fetchall() == [(A,)]


def test_the_directory_refuses_a_password_even_written_directly(database: Database) -> None:
    with database.owner() as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO control.tenant_servers (name, conninfo) VALUES ('x', %s)",
            ("host=h password=hunter2",),
        )


def test_two_thousand_tenants_are_placed_evenly_over_two_servers(database: Database) -> None:
    add(database, "east", A)
    add(database, "west", B)
    with psycopg.connect(database.app_url) as conn:
        for n in range(2000):
            provisioner.enqueue(conn, f"t{n}")
            conn.commit()
    counts = placed(database)
    assert set(counts) == {"east", "west"}
    assert abs(counts["east"] - 1000) <= 10 and abs(counts["west"] - 1000) <= 10


def test_weights_share_new_tenants(database: Database) -> None:
    add(database, "small", A, weight=1)
    add(database, "large", B, weight=3)
    with psycopg.connect(database.app_url) as conn:
        for n in range(400):
            provisioner.enqueue(conn, f"t{n}")
            conn.commit()
    assert placed(database) == {"small": 100, "large": 300}


def test_explicit_placement_goes_there_and_never_moves(
    settings: Settings, database: Database
) -> None:
    add(database, "east", A)
    add(database, "west", B)
    out = run_cli(settings, "enqueue", "acme", "--server", "west", "--json")
    assert out.returncode == 0, out.stderr
    with database.app() as conn:
        assert provisioner.locate("acme", conn=conn).server == "west"
    # Asked again, for the server it lives on: the same job; for another: refused, nothing new.
    again = run_cli(settings, "enqueue", "acme", "--server", "west", "--json")
    assert (
        again.returncode == 0
        and json.loads(again.stdout)["job_id"] == json.loads(out.stdout)["job_id"]
    )
    elsewhere = run_cli(settings, "enqueue", "acme", "--server", "east")
    assert (elsewhere.returncode, elsewhere.stderr.strip()) == (
        2,
        "error: tenant acme lives on west, not on east: a tenant is placed once (nothing was "
        "queued)",
    )
    # Re-enqueued without a server (a retry): it stays where it is, even once west drains.
    with database.owner() as conn:
        servers.set_status(conn, "west", servers.ServerStatus.DRAINING)
    assert run_cli(settings, "enqueue", "acme").returncode == 0
    assert placed(database) == {"west": 1}
    located = run_cli(settings, "locate", "acme", "--json")
    assert json.loads(located.stdout) == {"tenant_id": "acme", "server": "west", "conninfo": B}
    unknown = run_cli(settings, "locate", "nobody")
    assert (unknown.returncode, unknown.stderr.strip()) == (3, "error: unknown tenant nobody")


@pytest.mark.parametrize("status", ["draining", "full", "retired"])
def test_only_active_servers_get_new_tenants(
    settings: Settings, database: Database, status: str
) -> None:
    add(database, "east", A)
    add(database, "west", B)
    with database.owner() as conn:
        servers.set_status(conn, "east", servers.ServerStatus(status))
    for n in range(6):
        enqueue(database, f"t{n}")
    assert placed(database) == {"west": 6}
    refused = run_cli(settings, "enqueue", "named", "--server", "east")
    assert refused.returncode == 2
    assert (
        refused.stderr.strip() == f"error: tenant server east is {status}: it takes no new tenants"
    )
    assert rows_of(database, "named") == (0, 0)


def test_no_server_with_room_refuses_the_tenant_and_creates_nothing(
    settings: Settings, database: Database
) -> None:
    add(database, "east", A, capacity=1)
    add(database, "west", B)
    with database.owner() as conn:
        servers.set_status(conn, "west", servers.ServerStatus.DRAINING)
    enqueue(database, "first")
    full = run_cli(settings, "enqueue", "second")
    assert (full.returncode, full.stderr.strip()) == (
        2,
        "error: no tenant server takes new tenants (each is draining, full, retired or at its "
        "capacity)",
    )
    named = run_cli(settings, "enqueue", "third", "--server", "east")
    assert named.stderr.strip() == "error: tenant server east is at its capacity"
    nowhere = run_cli(settings, "enqueue", "fourth", "--server", "north")
    assert (nowhere.returncode, nowhere.stderr.strip()) == (
        2,
        "error: no tenant server named north",
    )
    with psycopg.connect(database.app_url) as conn, pytest.raises(provisioner.ProvisionerError):
        provisioner.enqueue(conn, "fifth")
    for tenant in ("second", "third", "fourth", "fifth"):
        assert rows_of(database, tenant) == (0, 0)
    assert placed(database) == {"east": 1}
    # Every server retired: the control database takes new tenants again, as with none.
    with database.owner() as conn:
        conn.execute("UPDATE control.tenant_servers SET status = 'retired' WHERE name = 'west'")
        conn.execute("DELETE FROM control.tenants")
        servers.set_status(conn, "east", servers.ServerStatus.RETIRED)
    enqueue(database, "sixth")
    assert placed(database) == {None: 1}


def test_the_application_role_cannot_move_a_tenant_or_touch_the_directory(
    database: Database,
) -> None:
    add(database, "east", A)
    add(database, "west", B)
    enqueue(database, "acme", server="east")
    with database.app() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE control.tenants SET server = 'west' WHERE tenant_id = 'acme'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE control.tenant_servers SET capacity = 0")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO control.tenant_servers (name, conninfo) VALUES ('x', 'y')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM control.tenant_servers")
        # ... but learns where a tenant lives, for routing (the documented query).
        found = conn.execute("SELECT * FROM control.tenant_location('acme')").fetchall()
        assert found == [("east", A)]
        assert conn.execute("SELECT * FROM control.tenant_location('nobody')").fetchall() == []


def test_the_count_follows_tenants_purged_deleted_and_moved(database: Database) -> None:
    add(database, "east", A, capacity=3)
    add(database, "west", B)
    for tenant in ("a1", "a2", "a3"):
        enqueue(database, tenant, server="east")
    enqueue(database, "a4")
    assert placed(database) == {"east": 3, "west": 1}  # a4: east is at its capacity
    with database.owner() as conn:
        conn.execute("UPDATE control.tenants SET server = 'west' WHERE tenant_id = 'a1'")
        conn.execute("DELETE FROM control.tenants WHERE tenant_id = 'a2'")
        conn.execute("UPDATE control.tenants SET state = 'deleted' WHERE tenant_id = 'a3'")
    assert placed(database) == {"west": 2}
    enqueue(database, "a5", server="east")  # the purged tenant's place is free again
    with database.owner() as conn:
        conn.execute("UPDATE control.tenants SET state = 'pending' WHERE tenant_id = 'a3'")
    assert placed(database) == {"east": 2, "west": 2}


CHILD = """
import sys, time
from pathlib import Path
import psycopg
import provisioner

url, prefix, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
with psycopg.connect(url) as conn:
    Path(sys.argv[5]).touch()  # connected: waiting for the others
    while not go.exists():
        time.sleep(0.005)
    refused = 0
    for n in range(count):
        try:
            provisioner.enqueue(conn, f"{prefix}{n}")
            conn.commit()
        except provisioner.ConfigurationError:
            conn.rollback()
            refused += 1
print(refused)
"""


def test_concurrent_enqueues_from_several_processes_never_exceed_a_capacity(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    add(database, "east", A, capacity=25)
    add(database, "west", B, capacity=35)
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(4)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, database.app_url, f"p{i}_", "20", str(go), str(mark)],
            stdout=subprocess.PIPE,
            text=True,
            env=settings_env(settings),
        )
        for i, mark in enumerate(ready)
    ]
    # every child connected and waiting before any enqueues (waited for, not slept on)
    wait_until(lambda: all(mark.exists() for mark in ready), 120, "the children to connect")
    go.touch()
    refused = 0
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        refused += int(out)
    assert placed(database) == {"east": 25, "west": 35}
    assert refused == 80 - 60


def test_pgbouncer_databases_from_the_directory(settings: Settings, database: Database) -> None:
    add(database, "east", A)
    add(database, "west", "shard_west")
    add(database, "old", B)
    # A value with a space, a quote and a backslash: single-quoted, the quote doubled, as
    # PgBouncer's connection-string parser reads it (tests/integration/test_pgbouncer.py).
    add(database, "spaced", r"host=127.0.0.1 port=3 dbname='it\'s a b\\c'")
    with database.owner() as conn:
        servers.set_status(conn, "old", servers.ServerStatus.RETIRED)
        # A reference written before control characters were refused (by the library, and by
        # the directory's trigger, control revision 20261208_h38keylog: a row stored before it
        # stays): never a line of its own in pgbouncer.ini. The trigger is set aside to store
        # it so.
        conn.execute("ALTER TABLE control.tenant_servers DISABLE TRIGGER tenant_servers_no_keylog")
        conn.execute(
            "INSERT INTO control.tenant_servers (name, conninfo) VALUES ('s7', %s)",
            ("host=127.0.0.1 dbname='x\nevil = host=attacker.example'",),
        )
        conn.execute("ALTER TABLE control.tenant_servers ENABLE TRIGGER tenant_servers_no_keylog")
    out = run_cli(settings, "servers", "pgbouncer")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[databases]" and lines[1].startswith("control = host=")
    assert "password" not in out.stdout and "attacker" not in out.stdout
    assert lines[2:] == [
        "east = host=127.0.0.1 port=1 dbname=tenants_a",
        "; s7: its dbname cannot be written for PgBouncer (empty, or a control character): "
        "write this entry by hand",
        "spaced = host=127.0.0.1 port=3 dbname='it''s a b\\c'",
        "; west: libpq service shard_west (PgBouncer reads no service file)",
    ]


def test_tenants_list_and_health_show_the_servers(settings: Settings, database: Database) -> None:
    enqueue(database, "home")  # before any server: on the control database
    add(database, "east", A, capacity=10)
    enqueue(database, "acme")
    listed = run_cli(settings, "tenants", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {t["tenant_id"]: t["server"] for t in json.loads(listed.stdout)} == {
        "acme": "east",
        "home": "control",
    }
    text = run_cli(settings, "tenants", "list")
    assert "SERVER" in text.stdout.splitlines()[0]
    assert [line.split()[-1] for line in text.stdout.splitlines()[1:3]] == ["east", "control"]
    health = run_cli(settings, "health", "--json")
    assert health.returncode == 1  # no worker runs: not ready, but the servers are shown
    (east,) = json.loads(health.stdout)["servers"]
    assert {k: east[k] for k in ("name", "status", "capacity", "tenants", "reachable")} == {
        "name": "east",
        "status": "active",
        "capacity": 10,
        "tenants": 1,
        "reachable": False,  # nothing listens on its port: reported, not fatal
    }
    assert "database unavailable" in east["problem"]
    shown = run_cli(settings, "health").stdout
    assert "tenant server east: active, 1 of 10 tenants, DOWN (" in shown


def test_with_no_server_the_lists_are_as_they_were(settings: Settings, database: Database) -> None:
    enqueue(database, "home")
    listed = run_cli(settings, "tenants", "list", "--json")
    assert "server" not in json.loads(listed.stdout)[0]
    assert "SERVER" not in run_cli(settings, "tenants", "list").stdout
    assert "servers" not in json.loads(run_cli(settings, "health", "--json").stdout)


def schema_exists(database: Database, schema: str) -> bool:
    with database.owner() as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return found is not None


def test_a_tenant_on_a_tenant_server_is_never_built_on_the_control_database(
    settings: Settings, database: Database
) -> None:
    """A job runs on the tenant's own server or not at all: with that server down, provisioning
    fails (to be retried), and nothing is created on the control database; a worker refuses to
    start while an active server cannot be reached (tests/integration/test_server_jobs.py runs
    jobs on a real second server)."""
    add(database, "east", A)
    out = run_cli(settings, "provision", "acme", "--json")
    assert out.returncode == 1
    job = json.loads(out.stdout)
    assert (job["status"], job["steps_completed"], job["attempts"]) == ("queued", [], 1)
    assert "database unavailable" in job["error_detail"]
    refused = run_cli(settings, "worker", "--once")
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: tenant server east: database unavailable")
    assert not schema_exists(database, "tenant_acme")


def test_servers_check_reaches_each_active_server_as_an_ordinary_owner(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    """The owner's password comes from libpq's own sources, never from the directory nor the
    owner URL; a superuser, an unreachable server and one without the tool's schema at this
    build's version are reported (exit 1)."""
    owner = psycopg.conninfo.conninfo_to_dict(database.owner_url)
    admin = psycopg.conninfo.conninfo_to_dict(database.admin_url)
    here = f"host={owner['host']} port={owner['port']} dbname={database.name}"
    add(database, "good", here)
    add(database, "root", f"{here} user={admin['user']}")
    add(database, "down", "host=127.0.0.1 port=1 dbname=nothing")
    add(database, "idle", "host=127.0.0.1 port=1 dbname=nothing")
    with database.owner() as conn:
        servers.set_status(conn, "idle", servers.ServerStatus.DRAINING)
    passfile = tmp_path / "pgpass"
    passfile.write_text("")
    passfile.chmod(0o600)
    out = run_cli(settings, "servers", "check", "--json", env={"PGPASSFILE": str(passfile)})
    assert out.returncode == 1
    found = {r["server"]: r for r in json.loads(out.stdout)}
    assert sorted(found) == ["down", "good", "root"]  # a draining server takes no new work
    assert not found["good"]["ok"] and "password" in found["good"]["problem"]
    secrets = {str(owner.get("password")), str(admin.get("password"))} - {"None"}
    assert not any(secret in out.stdout + out.stderr for secret in secrets)

    passfile.write_text(
        f"{owner['host']}:{owner['port']}:*:{owner['user']}:{owner.get('password', '')}\n"
        f"{admin['host']}:{admin['port']}:*:{admin['user']}:{admin.get('password', '')}\n"
    )
    out = run_cli(settings, "servers", "check", "--json", env={"PGPASSFILE": str(passfile)})
    assert out.returncode == 1
    found = {r["server"]: r for r in json.loads(out.stdout)}
    # reached as the owner, but without the tool's schema: the worker would refuse it
    assert (found["good"]["ok"], found["good"]["role"]) == (False, owner["user"])
    assert found["good"]["problem"] == (
        f"its tool schema is at version 0, this build needs {journal.VERSION}: "
        "run `provisioner migrate`"
    )
    with psycopg.connect(database.owner_url, autocommit=True) as conn:
        journal.migrate(conn)
    out = run_cli(settings, "servers", "check", "--json", env={"PGPASSFILE": str(passfile)})
    assert out.returncode == 1
    found = {r["server"]: r for r in json.loads(out.stdout)}
    assert (found["good"]["ok"], found["good"]["role"]) == (True, owner["user"])
    assert found["root"]["problem"] == (
        f"role {admin['user']} is a superuser: the owner must be an ordinary role"
    )
    assert not found["down"]["ok"] and "database unavailable" in found["down"]["problem"]
    assert not any(secret in out.stdout + out.stderr for secret in secrets)
    with database.owner() as conn:
        servers.set_status(conn, "root", servers.ServerStatus.FULL)
        servers.set_status(conn, "down", servers.ServerStatus.DRAINING)
    text = run_cli(settings, "servers", "check", env={"PGPASSFILE": str(passfile)})
    assert (text.returncode, text.stdout) == (0, f"good: ok (as {owner['user']})\n")


def test_placement_is_part_of_the_callers_transaction(database: Database) -> None:
    """A rolled-back enqueue placed nothing: no tenant, no job, the server's count unchanged;
    the async enqueue places as the sync one does."""
    add(database, "east", A, capacity=1)
    with psycopg.connect(database.app_url) as conn:
        provisioner.enqueue(conn, "acme", server="east")
        conn.rollback()
    assert rows_of(database, "acme") == (0, 0) and placed(database) == {}

    async def enqueue_async() -> None:
        async with await psycopg.AsyncConnection.connect(database.app_url) as conn:
            await provisioner.enqueue_async(conn, "acme", server="east")
            await conn.commit()
            with pytest.raises(provisioner.ConfigurationError, match="at its capacity"):
                await provisioner.enqueue_async(conn, "beta", server="east")

    asyncio.run(enqueue_async())
    assert placed(database) == {"east": 1} and rows_of(database, "beta") == (0, 0)


def test_tenants_list_by_server(settings: Settings, database: Database) -> None:
    enqueue(database, "home")
    add(database, "east", A)
    add(database, "west", B)
    enqueue(database, "acme", server="east")
    enqueue(database, "beta", server="west")

    def listed(server: str) -> list[str]:
        out = run_cli(settings, "tenants", "list", "--server", server, "--json")
        assert out.returncode == 0, out.stderr
        return [t["tenant_id"] for t in json.loads(out.stdout)]

    assert (listed("east"), listed("west"), listed("control")) == (["acme"], ["beta"], ["home"])
    bad = run_cli(settings, "tenants", "list", "--server", "No Such")
    assert bad.returncode == 2 and "invalid server name" in bad.stderr


def test_control_is_a_placement_while_placement_puts_the_tenant_there(
    settings: Settings, database: Database
) -> None:
    """``enqueue --server control`` (and the library's ``server="control"``, as the application
    role): taken while the tenant lives on the control database, or is new and the directory
    has no server but retired ones; else one line, exit 2, nothing written."""
    out = run_cli(settings, "enqueue", "home", "--server", "control", "--json")
    assert out.returncode == 0, out.stderr
    enqueue(database, "lib", server="control")
    add(database, "gone", B)
    with database.owner() as conn:
        servers.set_status(conn, "gone", servers.ServerStatus.RETIRED)
    enqueue(database, "late", server="control")  # a retired server places nobody
    assert placed(database) == {None: 3}
    add(database, "east", A)
    again = run_cli(settings, "enqueue", "home", "--server", "control", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["job_id"] == json.loads(out.stdout)["job_id"]
    refused = run_cli(settings, "enqueue", "qq1", "--server", "control")
    assert (refused.returncode, refused.stderr.splitlines()) == (
        2,
        [
            "error: a new tenant cannot be placed on control while the directory has tenant "
            "servers (placement chooses among them): enqueue qq1 without a server, then "
            "`provisioner move qq1 --to control` once it is provisioned (nothing was queued)"
        ],
    )
    with pytest.raises(provisioner.InvalidInput, match="cannot be placed on control"):
        enqueue(database, "qq2", server="control")

    async def enqueue_async() -> None:
        async with await psycopg.AsyncConnection.connect(database.app_url) as conn:
            with pytest.raises(provisioner.InvalidInput, match="cannot be placed on control"):
                await provisioner.enqueue_async(conn, "qq3", server="control")

    asyncio.run(enqueue_async())
    assert [rows_of(database, t) for t in ("qq1", "qq2", "qq3")] == [(0, 0)] * 3
    enqueue(database, "acme", server="east")
    elsewhere = run_cli(settings, "enqueue", "acme", "--server", "control")
    assert (elsewhere.returncode, elsewhere.stderr.strip()) == (
        2,
        "error: tenant acme lives on east, not on control: a tenant is placed once (nothing "
        "was queued)",
    )
    assert placed(database) == {None: 3, "east": 1}


# A reference stored with `sslkeylogfile` before `servers add` refused it (or written into the
# directory by hand: no CHECK refuses it) is reported for its server, in one line naming the key
# and never its value, and no session is ever opened with it.

#: What each reader reports for such a server (prefixed ``tenant server NAME: `` when raised).
KEYLOG_PROBLEM = (
    "its reference sets sslkeylogfile: libpq would write the TLS session keys to that file, so "
    "no session is opened with it; as the owner, UPDATE control.tenant_servers SET conninfo to "
    "the reference without it (no command changes a stored reference)"
)


@dataclass
class TlsListener:
    """A local port that answers libpq's SSLRequest and completes a TLS handshake, then hangs
    up: what a TLS server does first, and enough for libpq to write the session's keys to the
    file ``sslkeylogfile`` names. ``accepted``: how many connections it was asked for."""

    port: int
    accepted: list[str] = field(default_factory=list)


@pytest.fixture
def tls_listener(tmp_path: Path) -> Iterator[TlsListener]:
    """A :class:`TlsListener` with a throwaway self-signed certificate (P-256 key, ``CN=t``,
    valid for a day: ``sslmode=require`` checks neither its name nor its issuer)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    sock = socket.create_server(("127.0.0.1", 0))
    found = TlsListener(sock.getsockname()[1])

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed: the test is over
                return
            found.accepted.append("connection")
            with conn:
                try:
                    conn.recv(8)  # the SSLRequest
                    conn.sendall(b"S")
                    context.wrap_socket(conn, server_side=True).close()
                except (OSError, ssl.SSLError):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        sock.close()
        thread.join(10)


def store_keylog_reference(database: Database, name: str, reference: str) -> None:
    """``reference`` stored for server ``name`` as a row stored before the library and the
    directory refused it (control revision 20261208_h38keylog's trigger refuses it now)."""
    with pytest.raises(provisioner.InvalidInput, match="sets sslkeylogfile"):
        servers.connection_reference(reference)
    insert = "INSERT INTO control.tenant_servers (name, conninfo) VALUES (%s, %s)"
    with database.owner() as conn:
        with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
            conn.execute(insert, (name, reference))
        with conn.transaction():
            conn.execute(
                "ALTER TABLE control.tenant_servers DISABLE TRIGGER tenant_servers_no_keylog"
            )
            conn.execute(insert, (name, reference))
            conn.execute(
                "ALTER TABLE control.tenant_servers ENABLE TRIGGER tenant_servers_no_keylog"
            )


def keylog_reference(port: int, keys: Path) -> str:
    return f"host=127.0.0.1 port={port} dbname=tenants sslmode=require sslkeylogfile={keys}"


def test_a_stored_sslkeylogfile_is_reported_by_check_worker_and_migrate_never_used(
    settings: Settings, database: Database, tls_listener: TlsListener, tmp_path: Path
) -> None:
    """`servers check`, the worker's start and `migrate` report the server in one line naming
    the key, not the file; nothing connects, so libpq writes no key. The same reference given
    to libpq does write the session's keys there (the listener completes a TLS handshake)."""
    keys = tmp_path / "hunter2.keys"
    reference = keylog_reference(tls_listener.port, keys)
    store_keylog_reference(database, "leaky", reference)

    checked = run_cli(settings, "servers", "check", "--json")
    assert (tls_listener.accepted, keys.exists()) == ([], False)  # libpq wrote no key
    assert checked.returncode == 1, checked.stderr
    assert json.loads(checked.stdout) == [
        {
            "server": "leaky",
            "status": "active",
            "ok": False,
            "role": None,
            "problem": KEYLOG_PROBLEM,
        }
    ]
    text = run_cli(settings, "servers", "check")
    assert (text.returncode, text.stdout) == (1, f"leaky: NOT OK ({KEYLOG_PROBLEM})\n")
    worker = run_cli(settings, "worker", "--once")
    assert (worker.returncode, worker.stderr) == (
        2,
        f"error: tenant server leaky: {KEYLOG_PROBLEM}\n",
    )
    migrated = run_cli(settings, "migrate")
    assert migrated.returncode == 2, migrated.stderr
    assert migrated.stderr == f"error: tenant server leaky: {KEYLOG_PROBLEM}\n"
    shown = "".join(out.stdout + out.stderr for out in (checked, text, worker, migrated))
    assert "hunter2" not in shown and str(tmp_path) not in shown
    assert (tls_listener.accepted, keys.exists()) == ([], False)

    # what was done before: libpq, given the reference, writes the TLS session's keys there
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(reference, connect_timeout=10).close()
    assert tls_listener.accepted and "TRAFFIC_SECRET" in keys.read_text()


def test_no_owner_session_is_opened_with_a_stored_sslkeylogfile(
    settings: Settings, database: Database, tls_listener: TlsListener, tmp_path: Path
) -> None:
    """The owner's address of a server is made in one place (``owner_address``): a worker's
    pool, a move's end and the fan-out each refuse the reference there, the fan-out by
    reporting that server while the control database's work is done."""
    keys = tmp_path / "hunter2.keys"
    store_keylog_reference(database, "leaky", keylog_reference(tls_listener.port, keys))
    refused = f"^tenant server leaky: {KEYLOG_PROBLEM.replace('(', '[(]').replace(')', '[)]')}$"
    with database.owner() as control:
        leaky = servers.get(control, "leaky")
        with pytest.raises(ConfigurationError, match=refused):
            owner_address(leaky, database.owner_url)
        pools = servers.ServerSessions(
            database.owner_url, holder="test", idle_in_transaction_timeout_ms=10_000
        )
        with pytest.raises(ConfigurationError, match=refused):
            pools.database(control, "leaky")
        pools.close()
        with pytest.raises(ConfigurationError, match=refused):
            moves.end(control, "leaky", database.owner_url)
        found = servers.directory(control)
    reached = servers.fan_out(
        servers.targets(found, database.owner_url),
        lambda conn, target: conn.execute("SELECT 1 AS one").fetchone(),
        application_name="test",
    )
    assert {name: (r.result, r.problem) for name, r in reached.items()} == {
        servers.CONTROL: ({"one": 1}, None),
        "leaky": (None, KEYLOG_PROBLEM),
    }
    assert (tls_listener.accepted, keys.exists()) == ([], False)


def test_locate_gives_the_application_a_stored_reference_without_sslkeylogfile(
    settings: Settings, database: Database, tls_listener: TlsListener, tmp_path: Path
) -> None:
    """The application routes with ``locate``'s reference, or ``control.tenant_location``'s in
    SQL: a stored one that sets ``sslkeylogfile`` comes without it (the rest as stored), so the
    application's sessions write no TLS keys either, while the owner's commands report the
    server."""
    keys = tmp_path / "hunter2.keys"
    store_keylog_reference(database, "leaky", keylog_reference(tls_listener.port, keys))
    with database.owner() as conn:
        conn.execute(
            "INSERT INTO control.tenants (tenant_id, schema_name, server) "
            "VALUES ('routed', 'tenant_routed', 'leaky')"
        )
    found = provisioner.locate("routed", settings=settings)
    assert found.server == "leaky" and found.conninfo is not None
    with psycopg.connect(database.app_url) as app:  # the lookup in SQL gives the same
        in_sql = app.execute("SELECT * FROM control.tenant_location('routed')").fetchone()
    assert in_sql == (found.server, found.conninfo)
    assert "sslkeylogfile" not in found.conninfo and "hunter2" not in found.conninfo
    assert "port=" + str(tls_listener.port) in found.conninfo and "dbname=tenants" in found.conninfo
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(found.conninfo, connect_timeout=10).close()
    assert tls_listener.accepted and not keys.exists()  # reached, and no key written
