"""A tenant's move between servers, as ``control.tenant_moves`` records it (control revision
``20261203_h31move``), and how the owner reaches either end of it.

The row is what the tool owns during and after a move: while ``moving``, the copy on the
target is the move's (``move --abort`` drops it); once ``switched`` (the directory names the
target), the old copy on the source is the move's (``move --finish`` drops it). One row per
tenant: a move starts only when the tenant's last one is ``finished`` or ``aborted``, which is
how a second move of the same tenant is refused, whatever process asks. The directory's
switch (:data:`SWITCH`) changes ``control.tenants.server`` and the row's phase in one
statement; the servers' ``placed`` counts follow in the same transaction (the trigger of
revision ``20261202_h29servers``).

A server's end is reached as :func:`provisioner.servers.reach.owner_address` reaches it (the
reference names no password: libpq's own sources give it); the control database's end is the
owner URL, whose password is kept apart (:attr:`End.password`) so that it can be handed to a
child process in its environment, never on a command line.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from provisioner import db
from provisioner.errors import InvalidInput
from provisioner.models import TenantId
from provisioner.servers.directory import CONTROL, get
from provisioner.servers.reach import owner_address

Conn = psycopg.Connection[Any]


class MovePhase(enum.StrEnum):
    """Where a move stands: ``moving`` (the source serves or is frozen; the target's copy, if
    any, is the move's), ``switched`` (the target serves; the source's copy is the move's),
    ``finished`` (the source's copy dropped), ``aborted`` (the target's copy dropped, the
    source serves again)."""

    MOVING = "moving"
    SWITCHED = "switched"
    FINISHED = "finished"
    ABORTED = "aborted"

    @property
    def open(self) -> bool:
        """True while the move holds a copy a later command must deal with."""
        return self in (MovePhase.MOVING, MovePhase.SWITCHED)


# A new move of the tenant, unless one is open (no row returned: refused). A finished or
# aborted row is replaced; two requests at once queue on the row, and the second finds it open.
START = """
INSERT INTO control.tenant_moves AS m (tenant_id, source, target)
VALUES (%(tenant_id)s, %(source)s, %(target)s)
ON CONFLICT (tenant_id) DO UPDATE
   SET source = excluded.source, target = excluded.target, phase = 'moving', job_id = NULL,
       started_at = now(), switched_at = NULL, ended_at = NULL
 WHERE m.phase IN ('finished', 'aborted')
RETURNING *
"""

# The target's row, locked until the caller's transaction ends: a move takes its room there
# (placed + moves under way < capacity) under the same row lock as the placement of a new
# tenant (control.place_tenant), which counts the same moves (revision 20261204_h32room), so
# two moves at once, or a move and a sign-up, into the last free place queue on the row. The
# moves under way are counted by a statement of their own, once the lock is held: its
# snapshot, taken then, sees the move that held the lock before (read committed; a subquery of
# the locking statement would read the snapshot taken before the wait, and miss it).
LOCK_ROOM = """
SELECT status, capacity, placed FROM control.tenant_servers WHERE name = %(name)s FOR UPDATE
"""

COMING = """
SELECT count(*) AS coming FROM control.tenant_moves WHERE target = %(name)s AND phase = 'moving'
"""

# The move's job, once queued (in the same transaction as START).
SET_JOB = "UPDATE control.tenant_moves SET job_id = %(job_id)s WHERE tenant_id = %(tenant_id)s"

GET = "SELECT * FROM control.tenant_moves WHERE tenant_id = %(tenant_id)s"

#: The job payload's key for the copy's method the move was asked for (``auto``, ``dump``,
#: ``logical``: :class:`provisioner.kinds.move_logical.MoveMethod`); kept by every run.
METHOD_KEY = "move_method"

#: The job payload's key for why ``auto`` fell back to the dump after its logical replication
#: failed (one phrase, no secret): every later run of the move copies by dump. A new move
#: (:func:`set_method`) starts without it.
FALLBACK_KEY = "move_fallback"

SET_METHOD = """
UPDATE control.platform_jobs
   SET payload = (payload - %(fallback)s::text)
                 || jsonb_build_object(%(key)s::text, %(method)s::text)
 WHERE id = %(job_id)s
"""

SET_FALLBACK = """
UPDATE control.platform_jobs
   SET payload = payload || jsonb_build_object(%(key)s::text, %(reason)s::text)
 WHERE id = %(job_id)s
"""

GET_METHOD = "SELECT payload ->> %(key)s FROM control.platform_jobs WHERE id = %(job_id)s"

# The directory's switch: the tenant's server becomes the target (the placed counts follow by
# trigger) and the move is switched, in one statement; only from ``moving`` and only while
# the tenant still lives on the source. No row: already switched (or not this move's). Its
# time is the statement's, not its transaction's: the freeze's transaction, which the switch
# ends, began as long before as the copy and the verification took (the grace period of
# ``move --finish`` counts from it).
SWITCH = """
WITH moved AS (
    UPDATE control.tenant_moves SET phase = 'switched', switched_at = clock_timestamp()
     WHERE tenant_id = %(tenant_id)s AND phase = 'moving'
    RETURNING tenant_id, source, target
)
UPDATE control.tenants t SET server = moved.target, updated_at = now()
  FROM moved
 WHERE t.tenant_id = moved.tenant_id AND t.server IS NOT DISTINCT FROM moved.source
RETURNING t.server
"""

# When a switched move's grace period ends, and whether it has, by the database's clock (the
# command's machine may disagree with it).
GRACE = """
SELECT switched_at + make_interval(secs => %(grace)s) AS due,
       clock_timestamp() >= switched_at + make_interval(secs => %(grace)s) AS over
  FROM control.tenant_moves WHERE tenant_id = %(tenant_id)s AND phase = 'switched'
"""

# The move's end: ``finished`` (from switched) or ``aborted`` (from moving).
END = """
UPDATE control.tenant_moves SET phase = %(phase)s, ended_at = now()
 WHERE tenant_id = %(tenant_id)s AND phase = %(from_phase)s
RETURNING *
"""

# Where the tenant lives now (NULL: the control database) and its state, for the checks.
TENANT_SERVER = "SELECT server, state FROM control.tenants WHERE tenant_id = %(tenant_id)s"


@dataclass(frozen=True)
class Move:
    """A row of ``control.tenant_moves``; ``source``/``target`` None: the control database."""

    tenant_id: str
    source: str | None
    target: str | None
    phase: MovePhase
    job_id: UUID | None
    started_at: datetime
    switched_at: datetime | None
    ended_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Move:
        return cls(
            tenant_id=row["tenant_id"],
            source=row["source"],
            target=row["target"],
            phase=MovePhase(row["phase"]),
            job_id=row["job_id"],
            started_at=row["started_at"],
            switched_at=row["switched_at"],
            ended_at=row["ended_at"],
        )

    def view(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "from": self.source or CONTROL,
            "to": self.target or CONTROL,
            "phase": self.phase.value,
            "job_id": None if self.job_id is None else str(self.job_id),
            "started_at": self.started_at.isoformat(),
            "switched_at": None if self.switched_at is None else self.switched_at.isoformat(),
            "ended_at": None if self.ended_at is None else self.ended_at.isoformat(),
        }


@dataclass(frozen=True)
class End:
    """One end of a move, as the owner reaches it: ``address`` holds no password; ``password``
    (the owner URL's, for the control database) goes to a child's environment only."""

    server: str
    address: str
    password: str | None = field(default=None, repr=False)

    def connect(self, *, application_name: str = "provisioner-move") -> psycopg.Connection[Any]:
        """An owner session on this end (autocommit), password from :attr:`password` or
        libpq's own sources. Its commits wait for the disk whatever the server's default: the
        move's checkpoint in control follows each (a revoke, a grant, a drop), and a server's
        crash must not undo what control recorded done; each such commit also makes the
        copy's restore before it durable."""
        url = self.address
        if self.password is not None:
            url = make_conninfo(url, password=self.password)
        return db.connect(
            url,
            application_name=application_name,
            autocommit=True,
            session_options={"synchronous_commit": "on"},
        )


def end(conn: Conn, server: str | None, owner_url: str) -> End:
    """The end named ``server`` (None: the control database, reached by the owner URL)."""
    if server is None:
        params = conninfo_to_dict(db.libpq_address(owner_url))
        password = params.pop("password", None)
        return End(
            CONTROL, make_conninfo("", **params), None if password is None else str(password)
        )
    return End(server, owner_address(get(conn, server), owner_url))


def start(conn: Conn, tenant: TenantId, source: str | None, target: str | None) -> Move:
    """A new move's row, in the caller's transaction; InvalidInput while another is open."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(START, {"tenant_id": tenant.value, "source": source, "target": target})
        row = cur.fetchone()
    if row is not None:
        return Move.from_row(row)
    found = get_move(conn, tenant)
    assert found is not None, "the insert conflicted with a row"
    raise InvalidInput(refusal(found))


def take_room(conn: Conn, target: str) -> None:
    """In the caller's transaction (the one that records the move): lock the target's row and
    refuse (InvalidInput) unless it is active with room for one more tenant, counting the
    moves under way to it. UnknownServer when there is no such server."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(LOCK_ROOM, {"name": target})
        row = cur.fetchone()
        if row is None:
            get(conn, target)  # raises UnknownServer
            raise AssertionError("a server without a row")
        cur.execute(COMING, {"name": target})
        counted = cur.fetchone()
    assert counted is not None
    row["coming"] = counted["coming"]
    if row["status"] != "active":
        raise InvalidInput(
            f"tenant server {target} is {row['status']}: it takes no tenants (`provisioner "
            f"servers activate {target}` first)"
        )
    capacity, taken = row["capacity"], row["placed"] + row["coming"]
    if capacity is not None and taken >= capacity:
        coming = f", {row['coming']} of them moving there" if row["coming"] else ""
        raise InvalidInput(
            f"tenant server {target} is at its capacity ({capacity}: {taken} tenants{coming})"
        )


def refusal(move: Move) -> str:
    """Why a new move of the tenant is refused while ``move`` is open (one line)."""
    where = f"from {move.source or CONTROL} to {move.target or CONTROL}"
    if move.phase is MovePhase.SWITCHED:
        return (
            f"tenant {move.tenant_id}'s move {where} is not finished: `provisioner move "
            f"{move.tenant_id} --finish` drops the old copy first"
        )
    return f"tenant {move.tenant_id} is being moved {where} (job {move.job_id})"


def set_job(conn: Conn, tenant: TenantId, job_id: UUID) -> None:
    conn.execute(SET_JOB, {"tenant_id": tenant.value, "job_id": job_id})


def set_method(conn: Conn, job_id: UUID, method: str) -> None:
    """Record the copy's method the move was asked for in its job's payload (a job reopened
    for a new move forgets its last move's fallback)."""
    conn.execute(
        SET_METHOD,
        {"key": METHOD_KEY, "fallback": FALLBACK_KEY, "method": method, "job_id": job_id},
    )


def set_fallback(conn: Conn, job_id: UUID, reason: str) -> None:
    """Record in the move's job that its logical replication failed (``reason``: one phrase,
    no secret), so that no later run of the move tries it again."""
    conn.execute(SET_FALLBACK, {"key": FALLBACK_KEY, "reason": reason, "job_id": job_id})


def requested_method(conn: Conn, job_id: UUID | None) -> str | None:
    """The copy's method the move was asked for (None: not recorded)."""
    return _payload(conn, job_id, METHOD_KEY)


def fallback(conn: Conn, job_id: UUID | None) -> str | None:
    """Why the move's logical replication failed (None: it did not, or was not tried)."""
    return _payload(conn, job_id, FALLBACK_KEY)


def _payload(conn: Conn, job_id: UUID | None, key: str) -> str | None:
    """One text value of the move's job payload (None: no job, or no such key)."""
    if job_id is None:
        return None
    with conn.cursor() as cur:
        cur.execute(GET_METHOD, {"key": key, "job_id": job_id})
        row = cur.fetchone()
    if row is None:
        return None
    value = row[0] if isinstance(row, tuple) else next(iter(row.values()))
    return None if value is None else str(value)


def get_move(conn: Conn, tenant: TenantId) -> Move | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(GET, {"tenant_id": tenant.value})
        row = cur.fetchone()
    return None if row is None else Move.from_row(row)


def switch(conn: Conn, tenant: TenantId) -> bool:
    """The directory names the move's target, in the caller's transaction; False when it had
    already switched."""
    with conn.cursor() as cur:
        cur.execute(SWITCH, {"tenant_id": tenant.value})
        return cur.fetchone() is not None


def grace_over(conn: Conn, tenant: TenantId, grace_seconds: float) -> tuple[datetime, bool]:
    """When the grace period of the tenant's switched move ends, and whether it has, by the
    database's clock (:data:`GRACE`)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(GRACE, {"tenant_id": tenant.value, "grace": grace_seconds})
        row = cur.fetchone()
    assert row is not None, "the caller found the move switched"
    return row["due"], bool(row["over"])


def end_move(conn: Conn, tenant: TenantId, phase: MovePhase) -> Move | None:
    """The move ended as ``phase`` (finished from switched, aborted from moving); None when it
    was not in the phase it ends from."""
    before = MovePhase.SWITCHED if phase is MovePhase.FINISHED else MovePhase.MOVING
    params = {"tenant_id": tenant.value, "phase": phase.value, "from_phase": before.value}
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(END, params)
        row = cur.fetchone()
    return None if row is None else Move.from_row(row)


def tenant_server(conn: Conn, tenant: TenantId) -> tuple[str | None, str] | None:
    """(the tenant's server, None for the control database; its state), or None: no row."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(TENANT_SERVER, {"tenant_id": tenant.value})
        row = cur.fetchone()
    return None if row is None else (row["server"], str(row["state"]))
