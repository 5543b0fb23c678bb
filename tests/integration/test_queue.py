"""Every queue operation against a real database, as the owner role.

Since control c005 the provisioning rows are the owner's to claim and settle (app_rw only
enqueues and reads them: tests/integration/test_boundary.py), so the queue runs as the owner.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from uuid import uuid4

import psycopg
import psycopg.types.json
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from provisioner import kinds, pool, queue
from provisioner.errors import InvalidInput, KeyConflict, LeaseLost, UnknownJob
from provisioner.kinds.provision import ensure_provision_job, ensure_provision_job_async
from provisioner.models import Job, JobStatus, TenantId
from tests.conftest import Database


def app(database: Database) -> psycopg.Connection:
    """The connection the provisioner worker drives the queue with: the owner's."""
    return psycopg.connect(database.owner_url, row_factory=dict_row)


def enqueue_tenant(conn: psycopg.Connection, name: str) -> Job:
    job = ensure_provision_job(conn, TenantId(name)).job
    conn.commit()
    return job


def row(database: Database, job_id) -> dict:
    with database.owner() as conn:
        found = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT *, available_at - now() AS delay FROM control.platform_jobs WHERE id = %s",
                (job_id,),
            )
            .fetchone()
        )
    assert found is not None
    return found


def test_enqueue_is_idempotent_on_its_key(database: Database) -> None:
    with app(database) as conn:
        first = ensure_provision_job(conn, TenantId("acme"))
        second = ensure_provision_job(conn, TenantId("acme"))
        conn.commit()
    assert first.created and not second.created
    assert first.job.id == second.job.id
    assert first.job.idempotency_key == "provision:acme"
    with database.owner() as conn:
        assert conn.execute("SELECT count(*) FROM control.platform_jobs").fetchone()[0] == 1


def test_enqueue_joins_the_callers_transaction(database: Database) -> None:
    with app(database) as conn:
        ensure_provision_job(conn, TenantId("acme"))
        conn.rollback()
    with database.owner() as conn:
        assert conn.execute("SELECT count(*) FROM control.platform_jobs").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM control.tenants").fetchone()[0] == 0


def test_enqueue_notifies_on_commit_only(database: Database) -> None:
    with psycopg.connect(database.app_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {queue.NOTIFY_CHANNEL}")
        with app(database) as conn:
            ensure_provision_job(conn, TenantId("acme"))
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
            conn.commit()
        got = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in got] == ["provision_tenant"]


def test_the_applications_enqueue_records_the_job_its_run_and_its_tenant(
    database: Database,
) -> None:
    """As ``app_rw``, through the row-level security policies: one statement inserts the
    tenant's row, the job and its wake-up, the next one the job's first run; enqueued again,
    nothing more is written."""
    with psycopg.connect(database.app_url, row_factory=dict_row) as conn:
        first = ensure_provision_job(conn, TenantId("acme"))
        again = ensure_provision_job(conn, TenantId("acme"))
        other = ensure_provision_job(conn, TenantId("globex"))
        conn.commit()
    assert first.created and not again.created and other.created
    assert again.job.id == first.job.id != other.job.id
    with database.owner() as conn:
        runs = conn.execute(
            "SELECT j.tenant_id, r.run, r.job_type, r.started_by FROM control.job_runs r "
            "JOIN control.platform_jobs j ON j.id = r.job_id ORDER BY j.tenant_id"
        ).fetchall()
        tenants = conn.execute(
            "SELECT tenant_id, schema_name, state FROM control.tenants ORDER BY tenant_id"
        ).fetchall()
    assert runs == [
        ("acme", 1, "provision_tenant", "enqueue"),
        ("globex", 1, "provision_tenant", "enqueue"),
    ]
    assert tenants == [("acme", "tenant_acme", "pending"), ("globex", "tenant_globex", "pending")]


def test_a_refused_enqueue_writes_nothing(database: Database) -> None:
    """A tenant row the policies refuse fails the one statement: no job, no run, no tenant."""
    with (
        psycopg.connect(database.app_url) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute(
            queue.ENSURE_TENANT_ENQUEUE_WOKEN,
            {
                "id": uuid4(),
                "tenant_id": "acme",
                "schema": "public",  # not tenant_acme: refused by app_registers_tenants
                "job_type": "provision_tenant",
                "payload": psycopg.types.json.Jsonb({}),
                "idempotency_key": "provision:acme",
                "max_attempts": 5,
                "channel": queue.NOTIFY_CHANNEL,
            },
        )
    with database.owner() as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM control.tenants), "
            "(SELECT count(*) FROM control.platform_jobs), (SELECT count(*) FROM control.job_runs)"
        ).fetchone()
    assert counts == (0, 0, 0)


def test_warm_plans_the_statements_without_running_them(database: Database) -> None:
    """The warm-up plans a claim, the steps' ends and a take (EXPLAIN): the queued job stays
    queued, no journal row is written, no spare is taken."""
    with app(database) as conn:
        job = enqueue_tenant(conn, "acme")
    with psycopg.connect(database.owner_url, autocommit=True) as conn:
        queue.warm(conn, (*queue.STEP_PLANS, *pool.TAKE_PLANS))
        journal = conn.execute("SELECT count(*) FROM control.job_step_runs").fetchone()
    assert row(database, job.id)["status"] == "queued"
    assert journal == (0,)


def test_unsupported_job_types_are_refused_by_the_kind_registry() -> None:
    # The queue knows nothing about kinds; its callers check names against the registry.
    with pytest.raises(InvalidInput, match="unsupported job type"):
        kinds.BUILTIN.check(["provision_tenant", "mine_bitcoin"])
    with pytest.raises(InvalidInput, match="unsupported job type"):
        kinds.BUILTIN["mine_bitcoin"]
    with pytest.raises(InvalidInput, match="at least one job type"):
        kinds.BUILTIN.check([])


def test_claim_takes_oldest_ready_job_of_allowed_types_and_commits(database: Database) -> None:
    with app(database) as conn:
        first = enqueue_tenant(conn, "first")
        second = enqueue_tenant(conn, "second")
        queue.enqueue(conn, "send_email", idempotency_key="mail:1")
        conn.commit()
        claimed = queue.claim_next(conn, ["provision_tenant"], "w1")
    assert claimed is not None and claimed.id == first.id
    stored = row(database, first.id)  # visible from another connection: committed
    assert stored["status"] == "running"
    assert stored["attempts"] == 1
    assert stored["locked_by"] == "w1"
    assert stored["locked_at"] is not None
    with app(database) as conn:
        again = queue.claim_next(conn, ["provision_tenant"], "w2")
        assert again is not None and again.id == second.id
        assert queue.claim_next(conn, ["provision_tenant"], "w2") is None  # email job not ours


def test_claim_respects_available_at(database: Database) -> None:
    with app(database) as conn:
        job = enqueue_tenant(conn, "later")
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET available_at = now() + interval '1 hour'")
    with app(database) as conn:
        assert queue.claim_next(conn, ["provision_tenant"], "w1") is None
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET available_at = now()")
    with app(database) as conn:
        claimed = queue.claim_next(conn, ["provision_tenant"], "w1")
        assert claimed is not None and claimed.id == job.id


def test_two_connections_claiming_at_once_never_get_the_same_row(database: Database) -> None:
    with app(database) as conn:
        ids = {enqueue_tenant(conn, f"t{i}").id for i in range(40)}
    claimed: dict[str, list] = {"a": [], "b": []}
    barrier = threading.Barrier(2)

    def drain(name: str) -> None:
        with app(database) as conn:
            barrier.wait()
            while (job := queue.claim_next(conn, ["provision_tenant"], name)) is not None:
                claimed[name].append(job.id)

    threads = [threading.Thread(target=drain, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    a, b = set(claimed["a"]), set(claimed["b"])
    assert not a & b
    assert a | b == ids
    assert len(claimed["a"]) + len(claimed["b"]) == len(ids)


def tenant_locks_held(conn: psycopg.Connection) -> int:
    """Advisory locks of the claim's class (tenants it tried) held by ``conn``'s session."""
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
        " AND pid = pg_backend_pid()",
        (queue.TENANT_JOB_LOCK_CLASS,),
    ).fetchone()
    return int(row["count"])


@pytest.mark.parametrize("plan", ["auto", "force_generic_plan", "force_custom_plan"])
def test_a_claim_locks_no_tenant_of_a_job_it_may_not_take(database: Database, plan: str) -> None:
    """The try-lock that keeps two claimants off one tenant is taken only on a job of the
    claimant's kinds: never on another kind's job (a generic plan filters in cost order, and
    the lock was once tried before the kind), and never by a claim of no kind at all (the
    warm-up's). Such a lock, held to the end of the claim's transaction, would make another
    kind's worker pass that job by."""
    with app(database) as conn:
        mail = queue.ensure_tenant_job(conn, TenantId("acme"), "send_email", "mail:1").job
        conn.commit()
        conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Literal(plan)))
        conn.commit()
        for _ in range(7):  # past psycopg's prepare threshold and the server's custom plans
            assert queue.claim_next_with_state(conn, ["provision_tenant"], "w1") is None
            assert tenant_locks_held(conn) == 0
            conn.rollback()
        queue.plan_claim(conn, "w1")
        assert tenant_locks_held(conn) == 0
        conn.rollback()
    assert row(database, mail.id)["status"] == "queued"


def test_a_locked_row_is_skipped_not_waited_for(database: Database) -> None:
    with app(database) as conn:
        first = enqueue_tenant(conn, "first")
        second = enqueue_tenant(conn, "second")
    with app(database) as holder, app(database) as other:
        holder.execute("SELECT 1 FROM control.platform_jobs WHERE id = %s FOR UPDATE", (first.id,))
        other.execute("SET lock_timeout = '2s'")
        got = queue.claim_next(other, ["provision_tenant"], "w2")
        assert got is not None and got.id == second.id
        holder.rollback()


def claim(database: Database, name: str = "acme", worker: str = "w1") -> Job:
    with app(database) as conn:
        enqueue_tenant(conn, name)
        job = queue.claim_next(conn, ["provision_tenant"], worker)
    assert job is not None
    return job


def test_complete_is_fenced_by_the_lease(database: Database) -> None:
    job = claim(database)
    with app(database) as conn:
        done = queue.complete(conn, job.lease)
        conn.commit()
        assert done.status is JobStatus.SUCCEEDED and done.progress == 100
        with pytest.raises(LeaseLost):
            queue.complete(conn, job.lease)
    stored = row(database, job.id)
    assert stored["locked_by"] is None and stored["finished_at"] is not None


def test_fail_or_retry_backs_off_exponentially_then_fails(database: Database) -> None:
    job = claim(database)
    with app(database) as conn:
        retried = queue.fail_or_retry(conn, job.lease, "boom")
        conn.commit()
    assert retried.status is JobStatus.QUEUED
    delay = row(database, job.id)["delay"]
    assert timedelta(seconds=1) <= delay <= timedelta(seconds=2)  # 2 ** 1 after attempt 1
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET available_at = now(), attempts = 4")
    with app(database) as conn:
        again = queue.claim_next(conn, ["provision_tenant"], "w1")
        assert again is not None and again.attempts == 5
        failed = queue.fail_or_retry(conn, again.lease, "boom again")
        conn.commit()
    assert failed.status is JobStatus.FAILED
    assert failed.error_detail == "boom again"
    assert row(database, job.id)["finished_at"] is not None


def test_backoff_exponent_stops_at_eight(database: Database) -> None:
    """min(300, 2 ** min(attempts, 8)): from the 8th attempt on, the delay stays 256 s."""
    job = claim(database)
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET attempts = 9, max_attempts = 20")
    lease = job.lease.__class__(job.id, job.locked_by or "", 9)
    with app(database) as conn:
        queue.fail_or_retry(conn, lease, "x")
        conn.commit()
    delay = row(database, job.id)["delay"]
    assert timedelta(seconds=254) <= delay <= timedelta(seconds=256)


def test_an_attempt_the_database_cut_is_retried_at_once_and_counted(database: Database) -> None:
    """``at_once`` (the session was lost under the step): queued again without a backoff, the
    attempt still counted, so a database that keeps failing still ends the job's tries."""
    job = claim(database)
    with app(database) as conn:
        retried = queue.fail_or_retry(conn, job.lease, "the connection is lost", at_once=True)
        conn.commit()
    assert retried.status is JobStatus.QUEUED and retried.attempts == 1
    assert row(database, job.id)["delay"] <= timedelta(0)
    with app(database) as conn:
        again = queue.claim_next(conn, ["provision_tenant"], "w1")
        assert again is not None and again.id == job.id and again.attempts == 2
        conn.execute("UPDATE control.platform_jobs SET max_attempts = 2")
        failed = queue.fail_or_retry(conn, again.lease, "lost again", at_once=True)
        conn.commit()
    assert failed.status is JobStatus.FAILED


def test_permanent_failure_skips_the_retries(database: Database) -> None:
    job = claim(database)
    with app(database) as conn:
        failed = queue.fail_or_retry(conn, job.lease, "bucket missing", permanent=True)
        conn.commit()
    assert failed.status is JobStatus.FAILED and failed.attempts == 1


def test_error_detail_is_bounded_and_redacted(database: Database) -> None:
    job = claim(database)
    secret = "postgresql://owner:hunter2@db/x AccountKey=abcdef== " + "x" * 9000
    with app(database) as conn:
        stored = queue.fail_or_retry(conn, job.lease, secret)
        conn.commit()
    assert stored.error_detail is not None
    assert len(stored.error_detail) <= queue.ERROR_DETAIL_LIMIT
    assert "hunter2" not in stored.error_detail
    assert "abcdef" not in stored.error_detail


def test_recover_stale_requeues_expired_leases_only(database: Database) -> None:
    stale = claim(database, "stale", "dead-worker")
    fresh = claim(database, "fresh", "live-worker")
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.platform_jobs SET locked_at = now() - interval '20 minutes' "
            "WHERE id = %s",
            (stale.id,),
        )
    with app(database) as conn:
        recovered = queue.recover_stale(conn, 900)
        conn.commit()
    assert [j.id for j in recovered] == [stale.id]
    stored = row(database, stale.id)
    assert stored["status"] == "queued"
    assert stored["error_detail"] == "Recovered after worker lease expired."
    assert stored["locked_by"] is None
    assert row(database, fresh.id)["status"] == "running"
    with app(database) as conn, pytest.raises(LeaseLost):
        queue.complete(conn, stale.lease)  # the dead worker can no longer finish it


def test_recover_stale_without_locked_at_uses_updated_at(database: Database) -> None:
    job = claim(database)
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.platform_jobs SET locked_at = NULL, "
            "updated_at = now() - interval '1 hour'"
        )
    with app(database) as conn:
        assert [j.id for j in queue.recover_stale(conn, 900)] == [job.id]


def test_a_beat_and_a_recovery_pass_by_a_job_row_its_holder_holds_in_a_transaction(
    database: Database,
) -> None:
    """queue/lease.py RENEW_LEASES, queue/admin.py RECOVER_STALE: a running job whose row its
    holder's open transaction holds (a move's freeze holds its row until the switch) is in a
    live holder's hands. The worker's beat renews its other jobs without waiting for that
    transaction, and a recovery passes the row by; both used to wait for it, which stalled the
    heartbeat of every child of the worker behind one move's copy (here a 2 s lock timeout
    would fail them). Once the transaction ends, an expired lease is recovered as before."""
    held = claim(database, "held", "mover")
    other = claim(database, "other", "mover")
    with database.owner() as conn:  # both leases expired: a recovery's candidates
        conn.execute(
            "UPDATE control.platform_jobs SET locked_at = now() - interval '20 minutes' "
            "WHERE id = ANY(%s)",
            ([held.id, other.id],),
        )
    beat = queue.HolderBeat("worker", "instance", 30.0)
    with database.owner() as holder, database.owner() as worker:
        holder.autocommit = False
        holder.execute(
            "UPDATE control.platform_jobs SET progress = progress WHERE id = %s", (held.id,)
        )
        worker.execute("SET lock_timeout = '2s'")
        assert queue.beat_holders(worker, beat, ["mover"]) == 1  # the other job, renewed
        assert queue.recover_stale(worker, 900) == []  # held: passed by; other: renewed
        holder.rollback()
        assert [j.id for j in queue.recover_stale(worker, 900)] == [held.id]
    assert row(database, other.id)["status"] == "running"


def test_a_claim_in_a_long_transaction_stamps_the_job_with_its_own_time(
    database: Database,
) -> None:
    """queue/claim.py CLAIMING: a hand-off claims the next job in the last step's transaction,
    which may have begun long before (a move's freeze). The claimed job is stamped with the
    claim's time, not the transaction's start: stamped 1 s early here, it would count as 1 s
    without progress already (RECOVER_STALE's stuck-holder bound)."""
    with app(database) as conn:
        enqueue_tenant(conn, "late")
    with app(database) as tx:
        began = tx.execute("SELECT now() AS at").fetchone()["at"]
        time.sleep(1.0)
        job = queue.claim_next(tx, ["provision_tenant"], "w1")
        tx.commit()
    assert job is not None and job.updated_at is not None and job.locked_at is not None
    assert job.updated_at - began >= timedelta(seconds=1)


def test_recover_stale_fails_jobs_whose_attempts_are_spent(database: Database) -> None:
    job = claim(database)
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.platform_jobs SET attempts = max_attempts, "
            "locked_at = now() - interval '1 hour'"
        )
    with app(database) as conn:
        (recovered,) = queue.recover_stale(conn, 900)
        conn.commit()
    assert recovered.id == job.id
    assert recovered.status is JobStatus.FAILED
    assert recovered.error_detail == "Recovered after worker lease expired."


def test_retry_terminal_requeues_failed_with_attempts_reset(database: Database) -> None:
    job = claim(database)
    with app(database) as conn:
        queue.fail_or_retry(conn, job.lease, "nope", permanent=True)
        conn.commit()
        plain = ensure_provision_job(conn, TenantId("acme"))
        assert plain.job.status is JobStatus.FAILED and not plain.requeued
        again = ensure_provision_job(conn, TenantId("acme"), retry_terminal=True)
        conn.commit()
    assert again.requeued and again.job.id == job.id
    assert again.job.status is JobStatus.QUEUED and again.job.attempts == 0


def enqueue_async(database: Database, tenant: str, **kwargs: bool) -> queue.Enqueued:
    """The async enqueue on an async connection, committed."""

    async def go() -> queue.Enqueued:
        async with await psycopg.AsyncConnection.connect(database.owner_url) as conn:
            enqueued = await ensure_provision_job_async(conn, TenantId(tenant), **kwargs)
            await conn.commit()
            return enqueued

    return asyncio.run(go())


def test_the_async_enqueue_requeues_and_refuses_as_the_sync_one(database: Database) -> None:
    """A failed job is queued again with a new run and a wake-up; a key held by another kind's
    job is refused, nothing queued: the same statements as the sync enqueue, awaited."""
    job = claim(database)
    with app(database) as conn:
        queue.fail_or_retry(conn, job.lease, "nope", permanent=True)
        conn.commit()
    assert enqueue_async(database, "acme").job.status is JobStatus.FAILED
    with psycopg.connect(database.owner_url, autocommit=True) as listener:
        queue.listen(listener)
        again = enqueue_async(database, "acme", retry_terminal=True)
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert woken == ["provision_tenant"]
    assert again.requeued and again.job.id == job.id and again.job.run == 2
    assert again.job.status is JobStatus.QUEUED and again.job.attempts == 0
    with database.owner() as conn:
        runs = conn.execute(
            "SELECT run FROM control.job_runs WHERE job_id = %s ORDER BY run", (job.id,)
        ).fetchall()
        queue.ensure_tenant_job(conn, TenantId("b"), "send_email", "provision:b")
    assert runs == [(1,), (2,)]
    with pytest.raises(KeyConflict, match=r"\(send_email of tenant b\)"):
        enqueue_async(database, "b")
    with database.owner() as conn:
        kinds_of_b = conn.execute(
            "SELECT job_type FROM control.platform_jobs WHERE tenant_id = 'b'"
        ).fetchall()
    assert kinds_of_b == [("send_email",)]


def test_cancel_and_retry(database: Database) -> None:
    job = claim(database)
    with app(database) as conn:
        cancelled = queue.cancel(conn, job.id)
        conn.commit()
        assert cancelled.status is JobStatus.CANCELLED
        with pytest.raises(LeaseLost):  # the running holder is fenced out
            queue.record_step(conn, job.lease, ["create_schema"], 16)
        conn.rollback()
        with pytest.raises(InvalidInput, match="already finished"):
            queue.cancel(conn, job.id)
        conn.rollback()
        retried = queue.retry(conn, job.id)
        conn.commit()
        assert retried.status is JobStatus.QUEUED and retried.attempts == 0
        with pytest.raises(InvalidInput, match="only failed or cancelled"):
            queue.retry(conn, job.id)
        conn.rollback()
        with pytest.raises(UnknownJob):
            queue.cancel(conn, uuid4())


def test_release_hands_the_job_back_without_counting_the_attempt(database: Database) -> None:
    job = claim(database)
    with app(database) as conn:
        released = queue.release(conn, job.lease)
        conn.commit()
    assert released.status is JobStatus.QUEUED and released.attempts == 0


def test_renew_leases_touches_only_the_holders_jobs(database: Database) -> None:
    mine = claim(database, "mine", "me")
    theirs = claim(database, "theirs", "them")
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET locked_at = now() - interval '1 hour'")
    with app(database) as conn:
        assert queue.renew_leases(conn, ["me"]) == 1
        conn.commit()
        recovered = queue.recover_stale(conn, 900)
    assert [j.id for j in recovered] == [theirs.id]
    assert row(database, mine.id)["status"] == "running"


def test_recording_a_step_renews_the_lease_as_of_the_record_not_the_transaction_start(
    database: Database,
) -> None:
    job = claim(database)
    with app(database) as conn:
        conn.execute("SELECT pg_sleep(1.2)")  # a long step, in the transaction that records it
        queue.record_step(conn, job.lease, ["create_schema"], 16)
        conn.commit()
        assert queue.recover_stale(conn, 1.0) == []
    assert row(database, job.id)["status"] == "running"


def test_app_role_cannot_delete_or_truncate_jobs(database: Database) -> None:
    claim(database)
    with database.app() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM control.platform_jobs")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("TRUNCATE control.platform_jobs")


def test_the_engine_claim_returns_the_tenants_state(database: Database) -> None:
    with app(database) as conn:
        job = enqueue_tenant(conn, "paused")
        conn.execute("UPDATE control.tenants SET state = 'suspended' WHERE tenant_id = 'paused'")
        conn.commit()
        claimed = queue.claim_next_with_state(conn, ["provision_tenant"], "w1")
        conn.commit()
    assert claimed is not None and claimed.job.id == job.id
    assert claimed.tenant_state == "suspended"
    assert row(database, job.id)["status"] == "running"


def step_run(conn: psycopg.Connection, job: Job) -> int:
    opened = conn.execute(queue.step_run_opening(job.lease, job.tenant_id, "activate_onboarding"))
    run_id = int(opened.fetchone()["id"])
    conn.commit()
    return run_id


def test_the_last_step_completes_its_job_and_claims_the_next_in_one_transaction(
    database: Database,
) -> None:
    job = claim(database, "first")
    with app(database) as conn:
        second = enqueue_tenant(conn, "second")
        run_id = step_run(conn, job)
        began = conn.execute("SELECT now() AS began, pg_sleep(0.05)").fetchone()["began"]
        # A step's transaction begins with asynchronous commit (the engine's lock statement).
        conn.execute("SELECT set_config('synchronous_commit', 'off', true)")
        closed = queue.close_step(
            conn, run_id, "ok", job.lease, list(kinds.BUILTIN["provision_tenant"].step_names),
            100, last=True, claim_next=["provision_tenant"],
        )  # fmt: skip
        # Completing the job made the commit wait for the disk again.
        assert conn.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "on"
        done, following = closed.job, closed.claimed
        assert closed.next_run_id is None  # the last step opens no run after it
        assert done.status is JobStatus.SUCCEEDED and done.locked_by is None
        assert following is not None and following.job.id == second.id
        assert following.tenant_state == "pending"  # read by the claim itself
        # Nothing is visible before the step's transaction commits.
        assert row(database, job.id)["status"] == "running"
        assert row(database, second.id)["status"] == "queued"
        conn.commit()
    assert row(database, job.id)["status"] == "succeeded"
    assert row(database, job.id)["progress"] == 100
    # The job finished when its last step did, not when that step's transaction began.
    assert row(database, job.id)["finished_at"] - began >= timedelta(seconds=0.05)
    stored = row(database, second.id)
    assert (stored["status"], stored["locked_by"], stored["attempts"]) == ("running", "w1", 1)
    with database.owner() as conn:
        outcome = conn.execute(
            "SELECT outcome, detail FROM control.job_step_runs WHERE id = %s", (run_id,)
        ).fetchone()
    assert outcome == ("succeeded", "ok")


def test_a_hand_off_claims_a_job_queued_after_its_transaction_began(database: Database) -> None:
    """queue/claim.py: a job is ready when its ``available_at`` has passed by the claiming
    statement's clock, not by its transaction's start. The hand-off claims in the last step's
    transaction, which may have begun long before (a move's copy): a job enqueued meanwhile
    (``available_at``: its enqueue's time, after that start) was passed by, and the child went
    idle with a ready job queued."""
    job = claim(database, "first")
    with app(database) as conn:
        run_id = step_run(conn, job)
        conn.execute("SELECT 1")  # the step's transaction begins
        with app(database) as other:
            later = enqueue_tenant(other, "later")
        assert (
            row(database, later.id)["available_at"]
            > conn.execute("SELECT now() AS began").fetchone()["began"]
        )
        closed = queue.close_step(
            conn, run_id, "ok", job.lease, list(kinds.BUILTIN["provision_tenant"].step_names),
            100, last=True, claim_next=["provision_tenant"],
        )  # fmt: skip
        conn.commit()
    assert closed.claimed is not None and closed.claimed.job.id == later.id


def give_the_lease_away(database: Database, job: Job) -> None:
    """What recovery does meanwhile: the job is someone else's now."""
    with database.owner() as conn:
        conn.execute("UPDATE control.platform_jobs SET locked_by = 'w2' WHERE id = %s", (job.id,))


def test_a_lost_lease_at_the_last_step_claims_nothing(database: Database) -> None:
    job = claim(database, "first")
    with app(database) as conn:
        second = enqueue_tenant(conn, "second")
        run_id = step_run(conn, job)
    give_the_lease_away(database, job)
    with app(database) as conn:
        with pytest.raises(LeaseLost):
            queue.close_step(
                conn, run_id, "ok", job.lease, ["create_schema"], 16,
                last=True, claim_next=["provision_tenant"],
            )  # fmt: skip
        conn.rollback()  # what the engine's transaction does with the error
    assert row(database, second.id)["status"] == "queued"
    assert row(database, job.id)["locked_by"] == "w2"


def step_runs(database: Database, job: Job) -> list[dict]:
    with database.owner() as conn:
        return (
            conn.cursor(row_factory=dict_row)
            .execute("SELECT * FROM control.job_step_runs WHERE job_id = %s ORDER BY id", (job.id,))
            .fetchall()
        )


def test_a_step_that_is_not_the_last_opens_the_next_steps_run_with_its_checkpoint(
    database: Database,
) -> None:
    job = claim(database, "first")
    with app(database) as conn:
        run_id = step_run(conn, job)
        closed = queue.close_step(
            conn, run_id, "ok", job.lease, ["create_schema"], 16, last=False,
            open_next=queue.NextStep(job.tenant_id, "run_tenant_migrations"),
        )  # fmt: skip
        assert closed.job.steps_completed == ["create_schema"] and closed.claimed is None
        assert closed.next_run_id is not None
        assert len(step_runs(database, job)) == 1  # nothing is visible before the commit
        conn.commit()
    first, second = step_runs(database, job)
    assert (first["id"], first["outcome"]) == (run_id, "succeeded")
    assert second["id"] == closed.next_run_id
    assert (second["step"], second["outcome"], second["finished_at"]) == (
        "run_tenant_migrations",
        "running",
        None,
    )
    lease = job.lease
    assert (second["tenant_id"], second["run"], second["attempt"], second["worker"]) == (
        job.tenant_id,
        lease.run,
        lease.attempts,
        lease.locked_by,
    )
    # The next run starts the instant the previous one finished: one clock reading for both.
    assert second["started_at"] == first["finished_at"]
    # A step that never began goes with the hand-back (the engine's release between steps).
    with app(database) as conn:
        queue.discard_step_run(conn, second["id"])
        queue.release(conn, lease)
        conn.commit()
    assert [r["id"] for r in step_runs(database, job)] == [run_id]


def test_a_lost_lease_opens_no_run_for_the_next_step(database: Database) -> None:
    job = claim(database, "first")
    with app(database) as conn:
        run_id = step_run(conn, job)
    give_the_lease_away(database, job)
    with app(database) as conn:
        with pytest.raises(LeaseLost):
            queue.close_step(
                conn, run_id, "ok", job.lease, ["create_schema"], 16, last=False,
                open_next=queue.NextStep(job.tenant_id, "run_tenant_migrations"),
            )  # fmt: skip
        conn.rollback()
    assert [(r["id"], r["outcome"]) for r in step_runs(database, job)] == [(run_id, "running")]


def test_jobs_a_dead_holder_never_reported_go_back_untouched(database: Database) -> None:
    reported = claim(database, "reported", worker="w1")
    unreported = claim(database, "unreported", worker="w1")
    other = claim(database, "other", worker="w2")
    with app(database) as conn:
        released = queue.release_unreported(conn, "w1", [reported.id])
        conn.commit()
    assert [j.id for j in released] == [unreported.id]
    stored = row(database, unreported.id)
    assert (stored["status"], stored["attempts"], stored["locked_by"]) == ("queued", 0, None)
    assert row(database, reported.id)["status"] == "running"
    assert row(database, other.id)["locked_by"] == "w2"


def test_a_one_off_claim_reads_the_state_and_respects_a_live_holder(database: Database) -> None:
    """claim_job_with_state: the tenant's state comes with the claim; another job of the
    tenant running under a live holder keeps it queued, and under a dead one does not."""
    with app(database) as conn:
        first = enqueue_tenant(conn, "acme")
        second = queue.ensure_tenant_job(conn, TenantId("acme"), "suspend_tenant", None).job
        conn.commit()
        live = queue.claim_job_with_state(conn, first.id, "w1")
        assert live is not None and live.tenant_state == "pending"
        conn.execute("SET application_name = 'live-holder'")
        conn.execute(
            "UPDATE control.platform_jobs SET locked_by = 'live-holder' WHERE id = %s",
            (first.id,),
        )
        conn.commit()
        assert queue.claim_job_with_state(conn, second.id, "w2") is None  # a live holder runs
        conn.execute(
            "UPDATE control.platform_jobs SET locked_by = 'gone' WHERE id = %s", (first.id,)
        )
        conn.commit()
        claimed = queue.claim_job_with_state(conn, second.id, "w2")
    assert claimed is not None and claimed.job.id == second.id
    assert (claimed.job.job_type, claimed.tenant_state) == ("suspend_tenant", "pending")
    assert row(database, second.id)["status"] == "running"


def test_the_last_steps_claim_opens_the_next_jobs_first_step(database: Database) -> None:
    """queue/handoff.py: the claim that rides on a job's last step opens the journal row of the
    claimed job's first step not yet done, committed with the claim or not at all; a dead
    holder's unreported claim is handed back with that row."""
    steps = kinds.BUILTIN["provision_tenant"].step_names
    job = claim(database, "first")
    with app(database) as conn:
        second = enqueue_tenant(conn, "second")
        conn.execute(
            "UPDATE control.platform_jobs SET steps_completed = %s WHERE id = %s",
            (psycopg.types.json.Jsonb(list(steps[:2])), second.id),
        )
        conn.commit()
        run_id = step_run(conn, job)
        closed = queue.close_step(
            conn, run_id, "ok", job.lease, list(steps), 100, last=True,
            claim_next=["provision_tenant"], first_steps={"provision_tenant": steps},
        )  # fmt: skip
        assert closed.claimed is not None and closed.claimed.job.id == second.id
        assert closed.opened is not None and closed.opened.job_id == second.id
        assert closed.opened.step == steps[2]  # the first step not yet done
        assert step_runs(database, second) == []  # nothing visible before the commit
        conn.rollback()
    assert step_runs(database, second) == [] and row(database, second.id)["status"] == "queued"
    with app(database) as conn:
        run_id = step_run(conn, job)
        closed = queue.close_step(
            conn, run_id, "ok", job.lease, list(steps), 100, last=True,
            claim_next=["provision_tenant"], first_steps={"provision_tenant": steps},
        )  # fmt: skip
        conn.commit()
        assert closed.opened is not None
        (opened,) = step_runs(database, second)
        assert (opened["id"], opened["step"], opened["outcome"]) == (
            closed.opened.run_id,
            steps[2],
            "running",
        )
        assert (opened["worker"], opened["attempt"], opened["finished_at"]) == ("w1", 1, None)
        # The holder died before reporting the claim: handed back with its row.
        (released,) = queue.release_unreported(conn, "w1", [])
        conn.commit()
    assert released.id == second.id and released.status is JobStatus.QUEUED
    assert step_runs(database, second) == []


def test_a_claimed_job_with_no_step_left_opens_no_run(database: Database) -> None:
    steps = kinds.BUILTIN["provision_tenant"].step_names
    job = claim(database, "first")
    with app(database) as conn:
        second = enqueue_tenant(conn, "second")
        run_id = step_run(conn, job)
        closed = queue.close_step(
            conn, run_id, "ok", job.lease, list(steps), 100, last=True,
            claim_next=["provision_tenant"], first_steps={},  # a kind whose steps are unknown
        )  # fmt: skip
        conn.commit()
    assert closed.claimed is not None and closed.claimed.job.id == second.id
    assert closed.opened is None and step_runs(database, second) == []
