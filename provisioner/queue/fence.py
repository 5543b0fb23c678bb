"""A run's fencing token for the tenant's server (:mod:`provisioner.servers.journal`).

The token is the id of a transaction of ``control`` that wrote the job row under its lease.
Invariant: it is larger than the token of every earlier run of the job and of every earlier
job of its tenant, and no later run can be given it again. Three things make it so:

* **Assigned after the claim could see the job as claimable.** The transaction (or
  subtransaction) that owns the token takes its id with the write that claims the job (or
  renews its lease), after its statement's snapshot was taken. A run the job was taken from,
  or an earlier job of the tenant, took its own token in a transaction that had committed
  before that snapshot (the claim sees the job queued, and no job of the tenant running, only
  once they were settled); transaction ids are handed out in increasing order, so ours is
  larger. A transaction whose id was assigned before its claim (a job's last step, which
  claims the holder's next job: :mod:`provisioner.queue.handoff`) claims in a savepoint of its
  own, and the token is that subtransaction's id (:data:`CLAIM_FENCE`: the claimed row's
  ``xmin``, widened to 64 bits).
* **Durable before it is used.** A transaction id committed asynchronously can be handed out
  again after a server crash (ids restart from what the WAL shows). The claim of a job whose
  tenant lives on a tenant server waits for the disk (the claim reads the tenant's server:
  ``CLAIM_NEXT``); a hand-off's claim commits with the last step of the job before it, which
  waits for the disk anyway (``RECORD_LAST_STEP``); :data:`RUN_FENCE` waits too.
* **Never reused.** Transaction ids are 64-bit here (``pg_current_xact_id``): no wrap-around.

The engine takes the token from its own claim (:attr:`provisioner.queue.Claim.fence`, for a
claim made by :meth:`provisioner.engine.Engine.claim`: alone on the autocommit control session,
or in a hand-off's savepoint). A run claimed otherwise (a one-off command's claim of a given
job, a move's) takes one with :func:`fence_token`: its own lease-fenced write and commit.
"""

from __future__ import annotations

from provisioner.errors import LeaseLost
from provisioner.models import Lease
from provisioner.queue.rows import Conn, fetch_one

# The lease renewed (a fenced write, as RECORD_STEP's) and the writing transaction's id
# returned, committed durably.
RUN_FENCE = """
UPDATE control.platform_jobs SET locked_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE id = %(id)s AND status = 'running' AND locked_by = %(worker)s AND attempts = %(attempts)s
RETURNING pg_current_xact_id()::text::bigint AS token,
          set_config('synchronous_commit', 'on', true) AS commit_waits
"""

# The claim's token, in the claiming statement: the 64-bit id of the (sub)transaction that wrote
# the claimed row (``claimed.claim_xmin``, its 32-bit ``xmin``), from the top transaction's
# 64-bit id (assigned no later than it, and less than 2^31 ids before it).
CLAIM_FENCE = """pg_current_xact_id()::text::bigint
       + ((claimed.claim_xmin::text::bigint - pg_current_xact_id()::text::bigint) & 4294967295)"""

# The claim's commit waits for the disk when the claimed job's tenant lives on a tenant server
# (its token is used there); otherwise the session's commit mode stands.
CLAIM_DURABLE_IF_PLACED = """CASE WHEN t.server IS NOT NULL
            THEN set_config('synchronous_commit', 'on', true) END"""

# What a claim inside a longer transaction (a hand-off's) runs in, so that its token is its own.
CLAIM_SAVEPOINT = "SAVEPOINT claim_token"
CLAIM_RELEASE = "RELEASE SAVEPOINT claim_token"


def fence_token(conn: Conn, lease: Lease) -> int:
    """This run's token from a write of its own; :class:`LeaseLost` when the job is no longer
    ours. ``conn`` in autocommit, or the caller commits."""
    row = fetch_one(
        conn,
        RUN_FENCE,
        {"id": lease.job_id, "worker": lease.locked_by, "attempts": lease.attempts},
    )
    if row is None:
        raise LeaseLost(
            f"job {lease.job_id} is no longer held by {lease.locked_by} (attempt "
            f"{lease.attempts}): it was recovered, re-claimed or cancelled"
        )
    return int(row["token"])
