"""Placement of a new tenant counts the moves under way into a server (control revision
``20261204_h32room``): a sign-up never takes the place a move holds, in the room it checks nor
in the load it orders by, and a move's room and an enqueue taken at the same instant never
overfill a server, whichever takes the server's row lock first.

Two real clusters (:mod:`tests.move_server`): the moves are real ``provisioner move`` child
processes (``--queue``: recorded, under way, run by no one, until the test runs or aborts
them); the enqueues run the library's enqueue as the application role, or the CLI as a child.
``west`` names a port nothing listens on: placement reaches no server."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest

import provisioner
from provisioner import servers, service
from provisioner.settings import Settings
from tests.conftest import Database, run_cli, settings_env
from tests.integration.test_servers import placed
from tests.move_server import TenantServer

WEST = "host=127.0.0.1 port=2 dbname=tenants_west"

NONE_TAKES = (
    "error: no tenant server takes new tenants (each is draining, full, retired or at its capacity)"
)

# The sessions queued behind the test's lock on the server's row (as test_move_room.py
# counts them): the first waits for the test's transaction, the next ones for the row.
WAITING = """
SELECT count(*) FROM pg_locks
 WHERE NOT granted
   AND (locktype = 'transactionid' AND transactionid = xid(pg_current_xact_id())
        OR locktype = 'tuple' AND relation = 'control.tenant_servers'::regclass)
"""


def enqueue(database: Database, tenant: str, server: str | None = None) -> None:
    """The library's enqueue as the application role, committed."""
    with psycopg.connect(database.app_url) as conn:
        provisioner.enqueue(conn, tenant, server=server)


def move(
    settings: Settings, tenant_server: TenantServer, *args: str
) -> subprocess.CompletedProcess[str]:
    return run_cli(settings, "move", *args, env=tenant_server.env)


def coming(database: Database, server: str) -> int:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT count(*) FROM control.tenant_moves WHERE target = %s AND phase = 'moving'",
            (server,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def nothing_of(database: Database, tenant: str) -> bool:
    """No control row and no job of the tenant: a refused enqueue created nothing."""
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT (SELECT count(*) FROM control.tenants WHERE tenant_id = %(t)s), "
            "(SELECT count(*) FROM control.platform_jobs WHERE tenant_id = %(t)s)",
            {"t": tenant},
        ).fetchone()
    return rows == (0, 0)


def test_a_move_under_way_holds_its_place_against_new_tenants(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    service.provision(settings, "mover")
    with database.owner() as conn:
        servers.add(conn, "east", tenant_server.reference, capacity=3)
        servers.add(conn, "west", WEST)
    enqueue(database, "first", "east")
    enqueue(database, "w1", "west")
    queued = move(settings, tenant_server, "mover", "--to", "east", "--queue")
    assert queued.returncode == 0, queued.stderr
    assert coming(database, "east") == 1

    # The load: east holds 1 tenant and 1 move, west 1 tenant: the new tenant goes west
    # (counting the tenants alone, the tie would go to east, by name).
    enqueue(database, "second")
    assert service.locate(settings, "second").server == "west"

    # The room: east's capacity 3 holds 2 tenants and the move; a new tenant is refused there,
    # named or not, as placement refuses a server at its capacity, and nothing is created.
    enqueue(database, "third", "east")
    named = run_cli(settings, "enqueue", "fourth", "--server", "east")
    assert (named.returncode, named.stderr.strip()) == (
        2,
        "error: tenant server east is at its capacity",
    )
    with database.owner() as conn:
        servers.set_status(conn, "west", servers.ServerStatus.DRAINING)
    anywhere = run_cli(settings, "enqueue", "fifth")
    assert (anywhere.returncode, anywhere.stderr.strip()) == (2, NONE_TAKES)
    assert nothing_of(database, "fourth") and nothing_of(database, "fifth")
    assert placed(database) == {None: 1, "east": 2, "west": 2}

    # The move aborted: its place is free again, and the next tenant takes it.
    aborted = move(settings, tenant_server, "mover", "--abort")
    assert aborted.returncode == 0, aborted.stderr
    assert coming(database, "east") == 0
    enqueue(database, "sixth")
    assert service.locate(settings, "sixth").server == "east"
    assert placed(database) == {None: 1, "east": 3, "west": 2}


def test_a_switched_move_counts_once_among_the_tenants(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    """Once switched the tenant is one of the server's tenants, and no longer a move under
    way: it holds one place, not two."""
    service.provision(settings, "mover")
    with database.owner() as conn:
        servers.add(conn, "east", tenant_server.reference, capacity=3)
    enqueue(database, "first", "east")
    done = move(settings, tenant_server, "mover", "--to", "east")
    assert done.returncode == 0, done.stderr
    assert placed(database) == {"east": 2} and coming(database, "east") == 0
    enqueue(database, "second", "east")
    refused = run_cli(settings, "enqueue", "third", "--server", "east")
    assert (refused.returncode, refused.stderr.strip()) == (
        2,
        "error: tenant server east is at its capacity",
    )
    assert placed(database) == {"east": 3} and nothing_of(database, "third")


@pytest.mark.parametrize(
    ("first", "spare"),
    [("move", False), ("enqueue", False), ("move", True)],
    ids=["move-first", "enqueue-first", "move-first-spare-server"],
)
def test_a_move_and_an_enqueue_at_the_same_instant_never_overfill_a_server(
    settings: Settings, database: Database, tenant_server: TenantServer, first: str, spare: bool
) -> None:
    """The move and the enqueue queue on the row of a server with one place left, in a known
    order; released, the first takes the place and the second is refused. Move first is the
    case a room counted by the enqueue's locking statement alone misses: that statement's
    snapshot predates the move's commit, and the row it waited for was locked, not updated.
    With a spare server (as loaded, second by name), the enqueue passes the full one over and
    places the tenant there."""
    service.provision(settings, "mover")
    with database.owner() as conn:
        servers.add(conn, "east", tenant_server.reference, capacity=2)
        if spare:
            servers.add(conn, "west", WEST)
    enqueue(database, "first", "east")
    if spare:
        enqueue(database, "w1", "west")
    commands = {
        "move": ["move", "mover", "--to", "east", "--queue"],
        "enqueue": ["enqueue", "newcomer"],
    }
    order = [first, "enqueue" if first == "move" else "move"]
    env = {**settings_env(settings), **tenant_server.env}
    children: dict[str, subprocess.Popen[str]] = {}
    with database.owner() as hold:
        with hold.transaction():
            hold.execute("SELECT 1 FROM control.tenant_servers WHERE name = 'east' FOR UPDATE")
            for waiting, name in enumerate(order, start=1):
                children[name] = subprocess.Popen(
                    [sys.executable, "-m", "provisioner", *commands[name]],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                _wait_for(hold, waiting, list(children.values()))
        outs = {name: child.communicate(timeout=120) for name, child in children.items()}
    codes = {name: child.returncode for name, child in children.items()}
    second = order[1]
    if spare:
        assert codes == {"move": 0, "enqueue": 0}, outs
        assert service.locate(settings, "newcomer").server == "west"
        assert placed(database) == {None: 1, "east": 1, "west": 2}
        assert coming(database, "east") == 1
        return
    assert codes == {first: 0, second: 2}, outs
    refused = outs[second][1].strip()
    if second == "enqueue":
        assert refused == NONE_TAKES
        assert nothing_of(database, "newcomer")
        assert placed(database) == {None: 1, "east": 1} and coming(database, "east") == 1
    else:
        assert refused == "error: tenant server east is at its capacity (2: 2 tenants)"
        assert placed(database) == {None: 1, "east": 2} and coming(database, "east") == 0


def _wait_for(hold: psycopg.Connection, count: int, children: list[subprocess.Popen[str]]) -> None:
    """Until ``count`` sessions queue on the held row, each child still running."""
    deadline = time.monotonic() + 60
    while hold.execute(WAITING).fetchone() != (count,):
        assert all(c.poll() is None for c in children), "a command did not wait"
        assert time.monotonic() < deadline, "the commands did not queue on the row"
        time.sleep(0.02)
