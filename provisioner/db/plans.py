"""Every plan-cache trick of the package: generic plans, plans made ahead, prepared statements
kept across a replayed script.

PostgreSQL drops every cached plan of every session of a database when ``pg_namespace``
changes (a spare built, a schema renamed or granted on), and a session that fell too far behind
the shared invalidation queue empties its catalog caches too: the next statement of each
session plans again and reloads them. The sessions that serve a sign-up (the engine's control
and steps sessions) therefore

* keep **generic plans** (:data:`GENERIC_PLANS`, ``plan_cache_mode = force_generic_plan``): a
  statement prepared ahead is bound as it is, never planned again for the values of one call.
  Invariant: only sessions whose statements are fixed texts with bound parameters use it
  (``tests/integration/test_pool.py::test_a_take_binds_the_plans_made_before_it``);
* have their statements **planned ahead** while idle (:func:`prepare_ahead`, or
  :func:`explain_ahead` for a plan that need not be kept): each
  :data:`PlanAhead` runs once, prepared, with values that match nothing, so it takes and
  changes nothing. Invariant: a plan ahead's values select no row
  (``tests/integration/test_pool.py::test_the_warm_up_keeps_the_claims_plan_for_the_next_sign_up``);
* **prepare the checks between a build's batches** (:func:`preparing_again`): a spare's
  fingerprint and grants check run inside the replay's batches, where psycopg would prepare
  nothing, on a builder session opened for one refill; prepared at their first run, each is
  planned once per session (~4 ms), then bound (~1 ms) for every spare. Invariant: only
  statements that neither alter nor drop run there
  (``tests/integration/test_pool_builders.py::test_a_builders_checks_are_planned_once_per_session_not_per_spare``);
* **keep their prepared statements** through a replayed script, the grant step's
  ``ALTER DEFAULT PRIVILEGES`` and a rollout's reference build (Alembic on a scratch schema,
  rolled back) (:func:`keeping_prepared_statements`): psycopg would otherwise forget them all
  after any ``ALTER``, ``DROP`` or ``ROLLBACK``, at every sign-up. Invariant: the script
  changes only a tenant (or scratch) schema, which no prepared statement names
  (``tests/integration/test_fleet_upgrade.py::
  test_a_replay_keeps_the_sessions_prepared_statements_and_search_path``,
  ``tests/integration/test_provision.py::
  test_the_grant_step_leaves_the_sessions_prepared_statements_prepared``,
  ``tests/integration/test_fleet_upgrade.py::
  test_computing_the_upgrade_reference_keeps_the_sessions_prepared_statements``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg

#: Session options of a session that keeps generic plans (a server option, set at connect).
GENERIC_PLANS: Mapping[str, str] = {"plan_cache_mode": "force_generic_plan"}

#: A statement and parameters of the right types for it, values that match nothing: planned
#: ahead (prepared, or explained) and never allowed to change a row.
PlanAhead: TypeAlias = tuple[str, Mapping[str, Any]]


def prepare_ahead(conn: psycopg.Connection[Any], plans: Sequence[PlanAhead]) -> None:
    """Run each of ``plans`` prepared, on a session that keeps generic plans: its next run with
    real values binds the plan made now (one execution of the generic plan, no planning)."""
    with conn.cursor() as cur:
        for statement, params in plans:
            cur.execute(statement, params, prepare=True)


def explain_ahead(conn: psycopg.Connection[Any], plans: Sequence[PlanAhead]) -> None:
    """Plan each of ``plans`` without running it (``EXPLAIN``): every catalog cache entry its
    planning needs is loaded now, while the session is idle, not at its next real run."""
    with conn.cursor() as cur:
        for statement, params in plans:
            cur.execute("EXPLAIN " + statement, params)


#: psycopg's own ``prepare_threshold`` (runs of a query before it is prepared).
PSYCOPG_THRESHOLD = 5


@contextmanager
def preparing_again(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Inside :func:`keeping_prepared_statements`, run statements that are to be prepared as
    usual (a spare's fingerprint and grants check, between the replay's batches): with no
    threshold psycopg prepares nothing, not even ``prepare=True``, and a query it prepared
    before is sent unprepared, planned again. Only statements that neither alter nor drop
    run here (a result saying so would make psycopg forget every prepared statement)."""
    threshold = conn.prepare_threshold
    if threshold is None:
        conn.prepare_threshold = PSYCOPG_THRESHOLD
    try:
        yield
    finally:
        conn.prepare_threshold = threshold


@contextmanager
def keeping_prepared_statements(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Run a replayed script without psycopg forgetting the session's prepared statements.

    psycopg deallocates every prepared statement of the session (``DEALLOCATE ALL``) when a
    result it tracks says ``ALTER`` or ``DROP``, in case a prepared statement names a dropped
    object; a replayed revision says it for every tenant, and the fingerprint's query and the
    queue's statements would be planned again for every job. The script changes only the
    tenant schema, which no statement of the session prepares (the fingerprint reads the
    catalog, the queue the control schema), and the server itself re-plans a prepared statement
    whose tables changed. With no ``prepare_threshold`` psycopg leaves the query untracked.
    """
    threshold = conn.prepare_threshold
    conn.prepare_threshold = None
    try:
        yield
    finally:
        conn.prepare_threshold = threshold
