"""Whether the database the worker writes to has a synchronous standby.

What a failover can lose depends on it. A job's ``succeeded`` (its last commit, the one that
waits for the disk) survives the primary's loss only when that commit also waited for a
standby: with asynchronous replication, the commits the standby had not received yet are gone
after a failover although their callers were told they succeeded (see
docs/high-availability.md). ``provisioner health`` reports it; readiness does not depend on it.

Any role can read both signs: ``synchronous_standby_names`` is a plain setting, and
``pg_stat_replication`` shows every role its rows (their details only to privileged roles).
pg_auto_failover empties ``synchronous_standby_names`` when the primary is left alone, so
writes go on without a standby and the empty setting is what to look at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

SYNCHRONOUS_STANDBYS = """
SELECT current_setting('synchronous_standby_names') AS names,
       (SELECT count(*) FROM pg_stat_replication) AS standbys
"""


@dataclass(frozen=True)
class Replication:
    """``synchronous_standby_names`` and the number of standbys streaming from the server."""

    synchronous_names: str
    standbys: int

    @property
    def synchronous(self) -> bool:
        return bool(self.synchronous_names.strip()) and self.standbys > 0

    @property
    def detail(self) -> str:
        if self.synchronous:
            return f"synchronous standby ({self.synchronous_names}; {self.standbys} streaming)"
        why = (
            "synchronous_standby_names is empty"
            if not self.synchronous_names.strip()
            else "no standby is streaming"
        )
        return f"no synchronous standby ({why}): a failover may lose jobs reported succeeded"

    def view(self) -> dict[str, Any]:
        return {"synchronous_standby": self.synchronous, "detail": self.detail}


def replication(conn: psycopg.Connection[Any]) -> Replication:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SYNCHRONOUS_STANDBYS)
        row = cur.fetchone()
    assert row is not None
    return Replication(str(row["names"] or ""), int(row["standbys"]))
