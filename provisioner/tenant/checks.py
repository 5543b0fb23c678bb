"""The last drift check of each tenant, kept in ``control.tenant_checks`` (control revision
``20261202_h28rest``), so that the console and the metrics can say how much of the fleet has
drifted without reading every tenant's catalog at each page load or scrape.

``provisioner check`` (one tenant, several, or ``--all``) records each tenant it checked in
one statement at its end; the ``repair_tenant`` job records what is left after it restored
what it could, in its step's transaction. One row per tenant, replaced by the next check. The
fleet's figures count the tenants that have not been purged by their last outcome, and those
never checked, in one statement.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from provisioner.tenant import catalog
from provisioner.tenant.catalog import Difference

Conn = psycopg.Connection[Any]

#: What the fleet's figures call a tenant with no recorded check.
NEVER_CHECKED = "never checked"

#: Outcomes a check records (``provisioner.fleet.drift.TenantCheck`` but ``deleted``).
OUTCOMES = ("clean", "drifted", "behind", "not provisioned")

#: The longest summary stored: the counts and the first findings, not the whole report.
SUMMARY_LIMIT = 300

# Each checked tenant's result, replacing its earlier one.
RECORD = """
INSERT INTO control.tenant_checks
       (tenant_id, checked_at, outcome, missing, extra, altered, summary, checked_by)
SELECT u.t, now(), u.o, u.m, u.e, u.a, u.s, %(by)s
  FROM unnest(%(tenants)s::text[], %(outcomes)s::text[], %(missing)s::int[],
              %(extra)s::int[], %(altered)s::int[], %(summaries)s::text[]) AS u(t, o, m, e, a, s)
ON CONFLICT (tenant_id) DO UPDATE
   SET checked_at = EXCLUDED.checked_at, outcome = EXCLUDED.outcome,
       missing = EXCLUDED.missing, extra = EXCLUDED.extra, altered = EXCLUDED.altered,
       summary = EXCLUDED.summary, checked_by = EXCLUDED.checked_by
"""

# The tenants not purged, by their last check's outcome (never checked: no row), and when the
# newest of those checks ran.
FIGURES = f"""
SELECT coalesce(c.outcome, '{NEVER_CHECKED}') AS outcome, count(*) AS n,
       max(c.checked_at) AS last
  FROM control.tenants t LEFT JOIN control.tenant_checks c ON c.tenant_id = t.tenant_id
 WHERE t.state <> 'deleted'
 GROUP BY 1
"""

# One tenant's last check.
GET = "SELECT * FROM control.tenant_checks WHERE tenant_id = %(tenant)s"

# Whether this connection's role may read the checks: the owner may, app_rw may not (it is
# asked first, as reading a table without the privilege fails the whole transaction).
READABLE = "SELECT has_table_privilege('control.tenant_checks', 'SELECT')"

# The named tenants' last checks (``tenants list --drifted`` reads these, checks nothing).
GET_MANY = "SELECT * FROM control.tenant_checks WHERE tenant_id = ANY(%(tenants)s::text[])"


@dataclass(frozen=True)
class CheckRecord:
    """One tenant's check as stored: its outcome, what differs by change, a short summary."""

    tenant_id: str
    outcome: str
    missing: int = 0
    extra: int = 0
    altered: int = 0
    summary: str = ""
    checked_at: datetime | None = None
    checked_by: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> CheckRecord:
        return cls(
            row["tenant_id"],
            row["outcome"],
            int(row["missing"]),
            int(row["extra"]),
            int(row["altered"]),
            row["summary"],
            row["checked_at"],
            row["checked_by"],
        )


def summarize(differences: list[Difference]) -> tuple[dict[str, int], str]:
    """The counts by change (what belongs to a missing or extra table is counted with it) and
    a one-line summary: the counts, then the first findings, at most :data:`SUMMARY_LIMIT`."""
    folded = catalog.fold(differences)
    found = Counter(d.change for d, _ in folded)
    counts = {c: found[c] for c in (catalog.MISSING, catalog.EXTRA, catalog.ALTERED)}
    head = ", ".join(f"{n} {change}" for change, n in counts.items() if n)
    named = "; ".join(f"{d.change} {d.kind} {d.name}" for d, _ in folded[:5])
    text = f"{head}: {named}" if named else head
    if len(text) > SUMMARY_LIMIT:
        text = text[: SUMMARY_LIMIT - 4].rstrip() + " ..."
    return counts, text


def of_differences(tenant_id: str, differences: list[Difference]) -> CheckRecord:
    """A checked tenant's record: clean, or drifted with its counts and summary."""
    if not differences:
        return CheckRecord(tenant_id, "clean")
    counts, text = summarize(differences)
    return CheckRecord(
        tenant_id,
        "drifted",
        counts[catalog.MISSING],
        counts[catalog.EXTRA],
        counts[catalog.ALTERED],
        text,
    )


def record(conn: Conn, records: list[CheckRecord], checked_by: str) -> None:
    """Store each tenant's check (one statement, whatever their number)."""
    if not records:
        return
    with conn.cursor() as cur:
        cur.execute(
            RECORD,
            {
                "by": checked_by,
                "tenants": [r.tenant_id for r in records],
                "outcomes": [r.outcome for r in records],
                "missing": [r.missing for r in records],
                "extra": [r.extra for r in records],
                "altered": [r.altered for r in records],
                "summaries": [r.summary for r in records],
            },
        )


def last(conn: Conn, tenant_id: str) -> CheckRecord | None:
    """The tenant's last check (None: never checked)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(GET, {"tenant": tenant_id})
        row = cur.fetchone()
    return CheckRecord.from_row(row) if row else None


def last_if_readable(conn: Conn, tenant_id: str) -> CheckRecord | None:
    """The tenant's last check when this connection's role may read it (the owner), else None:
    ``status`` through the application role simply has none to show."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(READABLE)
        row = cur.fetchone()
    return last(conn, tenant_id) if row and row[0] else None


def last_of(conn: Conn, tenant_ids: list[str]) -> dict[str, CheckRecord]:
    """The named tenants' last checks, by tenant id (a tenant never checked is absent)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(GET_MANY, {"tenants": tenant_ids})
        rows = cur.fetchall()
    return {str(r["tenant_id"]): CheckRecord.from_row(r) for r in rows}


@dataclass(frozen=True)
class DriftFigures:
    """The fleet (purged tenants aside) by last check outcome, and the newest check's time."""

    #: every outcome of :data:`OUTCOMES` and :data:`NEVER_CHECKED`, 0 when none
    tenants: dict[str, int] = field(default_factory=dict)
    last_checked_at: datetime | None = None

    @property
    def drifted(self) -> int:
        return self.tenants.get("drifted", 0)

    @property
    def never_checked(self) -> int:
        return self.tenants.get(NEVER_CHECKED, 0)


def figures(conn: Conn) -> DriftFigures:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(FIGURES)
        rows = cur.fetchall()
    found = {str(r["outcome"]): int(r["n"]) for r in rows}
    stamps = [r["last"] for r in rows if r["last"] is not None]
    return DriftFigures(
        {outcome: found.get(outcome, 0) for outcome in (*OUTCOMES, NEVER_CHECKED)},
        max(stamps) if stamps else None,
    )
