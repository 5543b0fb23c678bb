"""The engine's pooled sessions are in autocommit mode and every transaction begins explicitly
(with its first statement when it has one): a transaction is still one unit of work."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import pq, sql
from psycopg.conninfo import make_conninfo
from sqlalchemy.pool import NullPool

from provisioner import db
from provisioner.db.conninfo import KEEPALIVES
from tests.conftest import Database

SETTING = sql.SQL("SELECT set_config('provisioner.test', 'inside', true)")


def tenant_rows(database: Database, tenant: str) -> int:
    with database.owner() as conn:
        row = conn.execute(
            "SELECT count(*) FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def insert_tenant(tx: db.Transaction, tenant: str) -> None:
    tx.pg.execute(
        "INSERT INTO control.tenants (tenant_id, schema_name) VALUES (%s, %s)",
        (tenant, f"tenant_{tenant}"),
    )


@pytest.mark.parametrize("first", [None, SETTING], ids=["begin", "begin-with-first"])
def test_a_transaction_rolls_back_as_one_unit(
    database: Database, first: sql.Composable | None
) -> None:
    with db.Database(database.owner_url) as owner:

        def fail_after_a_write() -> None:
            with owner.transaction(first) as tx:
                insert_tenant(tx, "undone")
                assert tx.pg.info.transaction_status is pq.TransactionStatus.INTRANS
                raise RuntimeError("the step failed after its first write")

        with pytest.raises(RuntimeError):
            fail_after_a_write()
        assert tenant_rows(database, "undone") == 0
        with owner.transaction(first) as tx:
            insert_tenant(tx, "kept")
            assert tenant_rows(database, "kept") == 0  # not before the commit
    assert tenant_rows(database, "kept") == 1


def test_the_first_statement_runs_inside_the_transaction(database: Database) -> None:
    with db.Database(database.owner_url) as owner:
        with owner.transaction(SETTING) as tx:
            row = tx.pg.execute("SELECT current_setting('provisioner.test', true)").fetchone()
            assert row == ("inside",)
        with owner.transaction() as tx:  # transaction-local: gone with the commit
            row = tx.pg.execute("SELECT current_setting('provisioner.test', true)").fetchone()
            assert row in ((None,), ("",))


def test_a_failing_first_statement_rolls_back_and_the_session_serves_the_next(
    database: Database,
) -> None:
    with db.Database(database.owner_url) as owner:
        with (
            pytest.raises(db.DatabaseError, match="division by zero"),
            owner.transaction(sql.SQL("SELECT 1 / 0")),
        ):
            pytest.fail("the block must not run")
        with owner.transaction() as tx:
            insert_tenant(tx, "after")
    assert tenant_rows(database, "after") == 1


def backend_pid(tx: db.Transaction) -> int:
    row = tx.pg.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def test_a_session_runs_its_transactions_on_one_server_session_each_its_own_unit(
    database: Database,
) -> None:
    with db.Database(database.owner_url) as owner, owner.session() as session:
        with session.transaction(SETTING) as tx:
            insert_tenant(tx, "first")
            pid = backend_pid(tx)
        with pytest.raises(RuntimeError), session.transaction() as tx:  # noqa: PT012
            insert_tenant(tx, "second")
            assert backend_pid(tx) == pid
            raise RuntimeError("the second step failed")
        with session.transaction() as tx:
            assert backend_pid(tx) == pid
            row = tx.pg.execute("SELECT current_setting('provisioner.test', true)").fetchone()
            assert row in ((None,), ("",))
    assert (tenant_rows(database, "first"), tenant_rows(database, "second")) == (1, 0)


def test_a_session_the_server_dropped_reconnects_at_its_next_transaction(
    database: Database,
) -> None:
    with db.Database(database.owner_url) as owner, owner.session() as session:
        with session.transaction() as tx:
            pid = backend_pid(tx)
        with psycopg.connect(database.admin_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(db.DatabaseUnavailable), session.transaction() as tx:
            insert_tenant(tx, "lost")
        with session.transaction() as tx:
            assert backend_pid(tx) != pid
            insert_tenant(tx, "after")
    assert (tenant_rows(database, "lost"), tenant_rows(database, "after")) == (0, 1)


LOCK = sql.SQL("SELECT pg_advisory_xact_lock(4242, 1)")
OTHER = sql.SQL("SELECT pg_advisory_xact_lock(4242, 2)")


def transaction_start(tx: db.Transaction) -> float:
    """When the server began the transaction (``now()``), as epoch seconds."""
    row = tx.pg.execute("SELECT extract(epoch FROM now())::float8").fetchone()
    assert row is not None
    return float(row[0])


def server_clock(database: Database) -> float:
    with database.owner() as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def lock_free(database: Database, key: int) -> bool:
    """Whether another session can take the advisory lock (4242, key) at once."""
    with database.owner() as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(4242, %s)", (key,)).fetchone()
    assert row is not None
    return bool(row[0])


def test_a_commit_begins_the_next_transaction_with_its_first_statement(
    database: Database,
) -> None:
    """``then``: the commit also begins the session's next transaction, with its first
    statement (the lock is held from that commit on), and the next transaction asked for
    with that first statement is that one; the first one's work is committed all the same."""
    with db.Database(database.owner_url) as owner, owner.session() as session:
        with session.transaction(LOCK, then=LOCK) as tx:
            insert_tenant(tx, "first")
        assert tenant_rows(database, "first") == 1
        assert not lock_free(database, 1)  # the next transaction holds it already
        asked = server_clock(database)
        with session.transaction(LOCK) as tx:
            assert transaction_start(tx) < asked  # begun by the commit, not now
            insert_tenant(tx, "second")
        assert tenant_rows(database, "second") == 1
        assert lock_free(database, 1)


def test_a_transaction_begun_ahead_for_another_statement_is_rolled_back(
    database: Database,
) -> None:
    """A next transaction asked for with another first statement (a hand-back between
    steps), or none, or the end of the session: the one begun ahead is rolled back."""
    with db.Database(database.owner_url) as owner:
        with owner.session() as session:
            with session.transaction(LOCK, then=LOCK) as tx:
                insert_tenant(tx, "stepped")
            asked = server_clock(database)
            with session.transaction(OTHER) as tx:
                assert transaction_start(tx) >= asked
                assert tx.pg.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND pid = pg_backend_pid() AND objid = 1"
                ).fetchone() == (0,)
            with session.transaction(LOCK, then=LOCK):
                pass
            assert not lock_free(database, 1)
        assert lock_free(database, 1)  # the session's end rolled it back
    assert tenant_rows(database, "stepped") == 1


def test_a_next_first_statement_that_fails_leaves_the_commit_and_fails_its_own_transaction(
    database: Database,
) -> None:
    failing = sql.SQL("SELECT 1 / 0")
    with db.Database(database.owner_url) as owner, owner.session() as session:
        with session.transaction(LOCK, then=failing) as tx:
            insert_tenant(tx, "committed")
        assert tenant_rows(database, "committed") == 1
        with (
            pytest.raises(db.DatabaseError, match="division by zero"),
            session.transaction(failing),
        ):
            pass
        with session.transaction(LOCK) as tx:  # the session serves the next one
            insert_tenant(tx, "after")
    assert tenant_rows(database, "after") == 1


def test_a_commit_that_fails_begins_nothing(database: Database) -> None:
    """A deferred constraint that fails at the commit: the error is raised as a plain commit
    would raise it, nothing of the transaction stays, and the next one begins afresh."""
    with database.owner() as conn:
        conn.execute(
            "CREATE TABLE public.deferred_once (id int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.commit()

    def violate_at_commit(session: db.Session) -> None:
        with session.transaction(LOCK, then=LOCK) as tx:
            insert_tenant(tx, "lost")
            tx.pg.execute("INSERT INTO public.deferred_once VALUES (1), (1)")

    with db.Database(database.owner_url) as owner, owner.session() as session:
        with pytest.raises(db.DatabaseError, match="duplicate key"):
            violate_at_commit(session)
        assert tenant_rows(database, "lost") == 0
        assert lock_free(database, 1)
        asked = server_clock(database)
        with session.transaction(LOCK) as tx:
            assert transaction_start(tx) >= asked


def test_a_last_statement_rides_on_the_commit(database: Database) -> None:
    """``end_with``: the statement and the COMMIT go as one simple query (one round trip, the
    tenant server's journal row and fence); both are committed."""
    with db.Database(database.owner_url) as owner, owner.session() as session:
        with session.transaction(LOCK) as tx:
            insert_tenant(tx, "work")
            tx.end_with(insert_tenant_statement("last"))
        assert session.driver.pgconn.transaction_status == pq.TransactionStatus.IDLE
    assert (tenant_rows(database, "work"), tenant_rows(database, "last")) == (1, 1)
    assert lock_free(database, 1)


def test_a_last_statement_that_fails_commits_nothing(database: Database) -> None:
    """A last statement that fails skips the COMMIT: the error leaves the block translated,
    nothing of the transaction stays, and the session serves the next transaction."""

    def fail_at_the_end(session: db.Session) -> None:
        with session.transaction(LOCK) as tx:
            insert_tenant(tx, "lost")
            tx.end_with(sql.SQL("SELECT 1 / 0"))

    with db.Database(database.owner_url) as owner, owner.session() as session:
        with pytest.raises(db.DatabaseError, match="division by zero"):
            fail_at_the_end(session)
        assert tenant_rows(database, "lost") == 0
        assert lock_free(database, 1)
        with session.transaction(LOCK) as tx:
            insert_tenant(tx, "next")
    assert tenant_rows(database, "next") == 1


def insert_tenant_statement(tenant: str) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO control.tenants (tenant_id, schema_name) VALUES ({}, {}) RETURNING tenant_id"
    ).format(sql.Literal(tenant), sql.Literal(f"tenant_{tenant}"))


def test_a_statement_before_a_transaction_commits_on_its_own(database: Database) -> None:
    """``before``: committed before the transaction begins (the step journal's first row),
    so it stays when the transaction rolls back; its row comes back with the transaction. A
    transaction begun ahead for the same first statement is rolled back for it, and a
    ``before`` that fails begins nothing."""

    def fail_after_work(session: db.Session) -> None:
        with session.transaction(LOCK, before=insert_tenant_statement("journal")) as tx:
            assert tx.before_row == ("journal",)
            assert not lock_free(database, 1)
            insert_tenant(tx, "work")
            raise ZeroDivisionError

    with db.Database(database.owner_url) as owner, owner.session() as session:
        with session.transaction(LOCK, then=LOCK):
            pass
        with pytest.raises(ZeroDivisionError):
            fail_after_work(session)
        assert (tenant_rows(database, "journal"), tenant_rows(database, "work")) == (1, 0)
        assert lock_free(database, 1)
        duplicate = insert_tenant_statement("journal")
        with (
            pytest.raises(db.DatabaseError, match="duplicate key"),
            session.transaction(LOCK, before=duplicate),
        ):
            pass
        assert lock_free(database, 1)
        with session.transaction(LOCK) as tx:  # the session serves the next one
            assert tx.before_row is None
            insert_tenant(tx, "after")
    assert tenant_rows(database, "after") == 1


def test_a_kept_alive_transaction_outlasts_its_idle_timeout_and_only_then(
    database: Database,
) -> None:
    """db/keepalive.py: while the block runs (2.5 s of work elsewhere), the transaction's
    session pings it and the 1 s idle timeout does not end it; once the block is left the
    pings have stopped (the thread joined), and the next 2 s idle end it as before. With no
    timeout set, nothing is started."""
    options = "-c idle_in_transaction_session_timeout=1000"
    with psycopg.connect(database.owner_url, options=options) as conn:
        began = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        with db.kept_alive(conn):
            time.sleep(2.5)
        assert not [t for t in threading.enumerate() if t.name == "provisioner-keepalive"]
        assert conn.execute("SELECT pg_current_xact_id()::text").fetchone() == began
        time.sleep(2.0)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            conn.execute("SELECT 3")
    with psycopg.connect(database.owner_url) as conn:
        conn.execute("SELECT 1")
        with db.kept_alive(conn):
            assert not [t for t in threading.enumerate() if t.name == "provisioner-keepalive"]


def test_a_pooled_session_is_replaced_after_its_uses(database: Database) -> None:
    """db/sessions.py: a pooled session serves ``recycle_after`` uses (checkouts), then is
    closed as it is handed back, its server process with it, and the next use opens a new
    one; a transaction begun ahead on it is rolled back first, never left open."""
    with db.Database(database.owner_url, recycle_after=3) as owner:
        pids = []
        for _ in range(7):
            with owner.transaction() as tx:
                row = tx.pg.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                pids.append(int(row[0]))
        assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5] != pids[6]
        with owner.session() as session:
            for _ in range(2):
                session.used()  # a worker child's jobs on a session it holds on
            assert session.spent
            with session.transaction(LOCK, then=LOCK):
                pass  # its commit begins the next transaction, with the lock
        assert lock_free(database, 1)  # rolled back as the spent session was closed
    with database.owner() as conn:

        def alive() -> int:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids[:6],)
            ).fetchone()
            return int(row[0]) if row else -1

        deadline = time.monotonic() + 10  # a closed session's process exits at once, or nearly
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive() == 0  # the spent sessions' server processes are gone


def test_every_connection_of_the_package_has_tcp_keepalives(database: Database) -> None:
    """db/conninfo.py KEEPALIVES, as libpq holds them on live connections: a command's
    (``db.connect``), the engine's pooled sessions (``db.Database``) and Alembic's
    (``db.engine``); an address's own value wins."""
    wanted = {key: str(value) for key, value in KEEPALIVES.items()}

    def held(conn: psycopg.Connection) -> dict[str, str]:
        params = conn.info.get_parameters()
        return {key: params.get(key, "") for key in KEEPALIVES}

    with db.connect(database.owner_url) as conn:
        assert held(conn) == wanted
    with db.Database(database.owner_url) as owner, owner.transaction() as tx:
        assert held(tx.pg) == wanted
    engine = db.engine(database.owner_url, poolclass=NullPool)
    with engine.connect() as alembic:
        driver = alembic.connection.driver_connection
        assert isinstance(driver, psycopg.Connection) and held(driver) == wanted
    engine.dispose()
    own = make_conninfo(database.owner_url, keepalives_idle=60)
    with db.connect(own) as conn:
        assert held(conn) == {**wanted, "keepalives_idle": "60"}
