"""The engine's pooled sessions are in autocommit mode and every transaction begins explicitly
(with its first statement when it has one): a transaction is still one unit of work."""

from __future__ import annotations

import pytest
from psycopg import pq, sql

from provisioner import db
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
