"""Two ``provisioner move`` commands at the same instant into a tenant server with room for
one: the room is taken under the server's row lock, counting the moves under way, so one
starts and the other is refused (issue 29). Two real clusters (:mod:`tests.move_server`), each
command a real child process."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from provisioner import servers, service
from provisioner.settings import Settings
from tests.conftest import Database, settings_env
from tests.move_server import TenantServer

# The sessions queued behind the test's lock on the server's row (pg_locks shows every role's):
# the first waits for the test's transaction, the second for the row, behind the first.
WAITING = """
SELECT count(*) FROM pg_locks
 WHERE NOT granted
   AND (locktype = 'transactionid' AND transactionid = xid(pg_current_xact_id())
        OR locktype = 'tuple' AND relation = 'control.tenant_servers'::regclass)
"""


def test_two_moves_at_once_into_the_last_place_do_not_both_start(
    settings: Settings, database: Database, tenant_server: TenantServer
) -> None:
    for tenant in ("one", "two"):
        service.provision(settings, tenant)
    with database.owner() as conn:
        servers.add(conn, "east", tenant_server.reference, capacity=1)
    env = {**settings_env(settings), **tenant_server.env}
    with database.owner() as hold:
        # Both commands pass their early checks, then queue on the server's row: released
        # together, they take the room at the same instant.
        with hold.transaction():
            hold.execute("SELECT 1 FROM control.tenant_servers WHERE name = 'east' FOR UPDATE")
            children = [
                subprocess.Popen(
                    [sys.executable, "-m", "provisioner", "move", tenant, "--to", "east", "--json"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                for tenant in ("one", "two")
            ]
            deadline = time.monotonic() + 60
            while hold.execute(WAITING).fetchone() != (2,):
                assert all(c.poll() is None for c in children), "a move did not wait"
                assert time.monotonic() < deadline, "the moves did not queue on the row"
                time.sleep(0.02)
        outs = [child.communicate(timeout=120) for child in children]
    codes = [child.returncode for child in children]
    assert sorted(codes) == [0, 2], outs
    winner, loser = ("one", "two") if codes[0] == 0 else ("two", "one")
    _, refused = outs[codes.index(2)]
    assert "tenant server east is at its capacity (1: 1 tenants" in refused, refused
    assert refused.count("\n") == 1
    assert json.loads(outs[codes.index(0)][0])["phase"] == "switched"
    assert service.locate(settings, winner).server == "east"
    assert service.locate(settings, loser).server == "control"
    with database.owner() as conn:
        assert conn.execute("SELECT placed FROM control.tenant_servers").fetchone() == (1,)
        rows = conn.execute("SELECT tenant_id, phase FROM control.tenant_moves").fetchall()
        jobs = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE job_type = 'move_tenant'"
        ).fetchone()
    assert rows == [(winner, "switched")] and jobs == (1,)
    with tenant_server.owner() as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tenant_%' ORDER BY 1"
        ).fetchall()
    assert schemas == [(f"tenant_{winner}",)]
