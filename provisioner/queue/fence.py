"""A run's fencing token for the tenant's server (:mod:`provisioner.servers.journal`).

The token is the transaction id of a write to the job row fenced by the lease: a run that took
the job over (recovery, a take-over) writes after the run it replaced did, so its token is
larger, and the tenant server's fence refuses the older one. Transaction ids are 64-bit and
never reused; the write commits durably (whatever the session's commit mode), so a server crash
cannot hand the same id to a later run.
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


def fence_token(conn: Conn, lease: Lease) -> int:
    """This run's token; :class:`LeaseLost` when the job is no longer ours. ``conn`` in
    autocommit, or the caller commits."""
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
