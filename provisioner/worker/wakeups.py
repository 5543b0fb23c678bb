"""Which idle engine process the parent asks to claim: one at a time, not every idle one.

Why: the parent learns that work may be waiting from a NOTIFY (one per enqueueing
transaction, however many jobs it queued), a poll, a job's end or a recovery, never how many
jobs wait. Asking every idle child at each of them (a thundering herd) makes one sign-up cost
as many claims as there are idle children, all but one finding nothing after a round trip, a
``SKIP LOCKED`` scan and the tenants' try-locks. So a reason to claim (``Worker._pending``) is
consumed by one ask; the claim that answers it says whether another ready job was queued
(:data:`provisioner.queue.CLAIM_NEXT`'s ``more``), and only then is the next idle child asked:
a burst brings every child in, one claim apart, and a lone sign-up costs one claim.

Invariant: while a reason is pending, at most one claim the parent asked for is in flight
(:func:`next_to_ask` returns nobody while a child claims); a claim that took a job and saw
another queued re-arms the reason, and so does every job's end and every wake-up that
arrives meanwhile, so a ready job never waits for the poll while a child is idle. Tested by
``tests/integration/test_worker.py::test_one_sign_up_wakes_one_of_the_idle_children``
and the burst tests there (every job claimed once, none lost).
"""

from __future__ import annotations

from collections.abc import Sequence

from provisioner.worker.processes import EngineProcess


def next_to_ask(children: Sequence[EngineProcess]) -> EngineProcess | None:
    """The idle child to ask now, or None: none is idle, or a claim is already in flight (its
    answer says whether to ask another)."""
    if any(child.asking is not None for child in children):
        return None
    return next((child for child in children if child.idle), None)
