"""The application during a move: writes one audit event after another to a tenant, as
``app_rw``, and records each acknowledged write.

usage: python tests/move_writer.py CONTROL_APP_URL TENANT ROUTES_JSON OUT STOP_FILE [stale]

ROUTES_JSON maps a server name (``control`` too) to the app role's URL there. Each write asks
``control.tenant_location`` where the tenant lives (``stale``: asks once, and keeps writing
there whatever the directory says later, as a cached route would). Writes ``ok N ID SERVER``
to OUT once a write committed, ``denied N SERVER`` when the server refused it, until
STOP_FILE exists.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psycopg


def main() -> None:
    control_url, tenant, routes_json, out_path, stop_path = sys.argv[1:6]
    stale = len(sys.argv) > 6 and sys.argv[6] == "stale"
    routes = json.loads(routes_json)
    stop = Path(stop_path)
    sessions: dict[str, psycopg.Connection] = {}
    insert = f"INSERT INTO tenant_{tenant}.audit_events (action) VALUES (%s) RETURNING id"
    with psycopg.connect(control_url, autocommit=True) as control, open(out_path, "w") as out:
        server = None
        n = 0
        while not stop.exists():
            if server is None or not stale:
                row = control.execute(
                    "SELECT server FROM control.tenant_location(%s)", (tenant,)
                ).fetchone()
                server = (row[0] if row else None) or "control"
            if server not in sessions:
                sessions[server] = psycopg.connect(routes[server], autocommit=True)
            n += 1
            try:
                got = sessions[server].execute(insert, (f"w{n}",)).fetchone()
            except psycopg.errors.InsufficientPrivilege:
                out.write(f"denied {n} {server}\n")
                out.flush()
                time.sleep(0.005)
                continue
            assert got is not None
            out.write(f"ok {n} {got[0]} {server}\n")
            out.flush()
    for conn in sessions.values():
        conn.close()


if __name__ == "__main__":
    main()
