"""The catalog fingerprint of a tenant schema: its shape in one statement, with its own name
abstracted, so that two schemas built the same way compare equal.

The verified replays (:mod:`provisioner.templates.replay`, :mod:`provisioner.templates.upgrade`)
prove their result against a stored reference with it, drift checks compare tenants with it,
and resumes of the migration step lean on it. Like every catalog read of
:mod:`provisioner.tenant.schema`, it finds the schema's relations through ``pg_depend`` (indexed)
rather than scanning ``pg_class`` by namespace, so it stays flat at thousands of tenants.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.string import TextLoader

from provisioner.db.plans import PlanAhead
from provisioner.tenant.schema import SCHEMA_RELATIONS_CTE, versions_query

Conn = psycopg.Connection[Any]

#: How the fingerprint renders the catalog; part of the key of every stored reference
#: (:mod:`provisioner.templates.reference`, :mod:`provisioner.templates.upgrade`), so a reference
#: stored by a version that rendered it another way is never compared with this rendering.
#: v2: read under the session's default ``search_path`` (v1: under the tenant schema's own, as
#: Alembic leaves it), which names the schema's objects qualified, ``<tenant>.members(id)``.
FINGERPRINT_FORMAT = "fingerprint-v2"

# The schema's shape in ONE statement (one plan, one round trip), each section a JSON array of
# rows in a fixed order. Every lookup goes by oid through the schema's pg_depend entries.
#
# How pg_get_constraintdef, pg_get_indexdef, pg_get_expr and format_type print a name depends on
# the search_path (qualified unless visible), so two fingerprints compare only when taken under
# the same one: the verified replays and the references take theirs under the session default.
# Planning its dozen joins costs as much as running it: a long-lived session has psycopg prepare
# it, and the server reuses a cached plan only under the search_path it was planned for.
FINGERPRINT = (
    SCHEMA_RELATIONS_CTE
    + """
, idx AS (
    SELECT t.relkind AS table_kind, i.oid, i.relname, i.relkind, i.relacl
      FROM rels t JOIN pg_index x ON x.indrelid = t.oid JOIN pg_class i ON i.oid = x.indexrelid
)
SELECT
  -- tables, sequences, views and indexes, with their ACLs
  (SELECT coalesce(json_agg(json_build_array(relname, kind, acl) ORDER BY relname), '[]')
     FROM (SELECT relname, relkind::text AS kind, coalesce(relacl::text, '') AS acl
             FROM rels WHERE relkind IN ('r', 'p', 'S', 'v', 'm')
           UNION ALL
           SELECT relname, relkind::text, coalesce(relacl::text, '')
             FROM idx WHERE relkind = 'i') s) AS relations,
  -- columns of the tables, in column order
  (SELECT coalesce(json_agg(json_build_array(
              c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
              coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity::text)
            ORDER BY c.relname, a.attnum), '[]')
     FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid
     LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped) AS columns,
  -- what pg_indexes shows: index name and definition
  (SELECT coalesce(json_agg(json_build_array(relname, pg_get_indexdef(oid)) ORDER BY relname),
                   '[]')
     FROM idx WHERE table_kind IN ('r', 'm', 'p') AND relkind IN ('i', 'I')) AS indexes,
  (SELECT coalesce(json_agg(json_build_array(c.relname, k.conname, pg_get_constraintdef(k.oid))
                            ORDER BY c.relname, k.conname), '[]')
     FROM rels c JOIN pg_constraint k ON k.conrelid = c.oid AND k.connamespace = c.nsp)
    AS constraints,
  (SELECT coalesce(json_agg(json_build_array(pg_get_userbyid(nspowner),
                                             coalesce(nspacl::text, ''))), '[]')
     FROM pg_namespace WHERE nspname = %(schema)s) AS schema,
  -- role by role: pg_default_acl is indexed by (role, schema, type), not by schema
  (SELECT coalesce(json_agg(json_build_array(r.rolname::text, d.defaclobjtype::text,
                                             d.defaclacl::text)
                            ORDER BY r.rolname, d.defaclobjtype), '[]')
     FROM pg_namespace n CROSS JOIN pg_roles r
     JOIN pg_default_acl d ON d.defaclrole = r.oid AND d.defaclnamespace = n.oid
    WHERE n.nspname = %(schema)s) AS default_privileges
"""
)

FINGERPRINT_SECTIONS = (
    "relations",
    "columns",
    "indexes",
    "constraints",
    "schema",
    "default_privileges",
)

Fingerprint = dict[str, list[tuple[Any, ...]]]

#: The catalog query planned ahead (:func:`provisioner.db.plans.prepare_ahead`) on a session
#: that is to read a fingerprint for tenant after tenant: a worker child's steps session and
#: its sessions on the tenant servers, before it says it is ready. A fresh session otherwise
#: plans it at each of its first runs (psycopg prepares it at the sixth): ~4 ms at the first,
#: ~1 ms at the next four, inside a fleet upgrade's or a burst's first jobs on each database.
#: The name is one no schema has (zero-length), so it reads nothing.
PLAN_AHEAD: PlanAhead = (FINGERPRINT, {"schema": ""})


def fingerprint(
    conn: Conn,
    schema: str,
    *,
    versions: Iterable[str] | None = None,
    prepare: bool | None = None,
) -> Fingerprint:
    """The schema's shape, with its own name abstracted: tables, columns, indexes,
    constraints, grants, default privileges and alembic version. Two tenants built the same way
    and read under the same ``search_path`` have equal fingerprints.

    ``versions``: the rows of the schema's ``alembic_version`` when the caller has just read them
    (a verified replay reads them in the replay's own round trip); else they are read here, one
    more round trip when the table exists. psycopg prepares the catalog query on a session that
    runs it often (``prepare_threshold``, 5 by default): a worker's long-lived session then plans
    it once instead of once per tenant (see :func:`provisioner.templates.replay.replay_verified`).
    ``prepare=True`` prepares it at its first run (planning it costs ~4 ms, running its plan ~1
    ms): a pool builder's session, opened for one refill, plans it once, not once per spare.
    Not for a session through a transaction-mode pooler (a prepared statement lives on one
    server connection).
    """

    with conn.cursor(row_factory=dict_row) as cur:
        cur.adapters.register_loader("json", TextLoader)  # parsed below, after abstraction
        cur.execute(FINGERPRINT, {"schema": schema}, prepare=prepare)
        found = cur.fetchone()
    assert found is not None
    out = {name: _abstracted(found[name], f"{schema}.") for name in FINGERPRINT_SECTIONS}
    if versions is None:
        versions = _alembic_versions(conn, schema, out["relations"])
    out["alembic_version"] = sorted((v,) for v in versions)
    return out


#: A qualifier PostgreSQL's JSON spells as it reads, that cannot match outside a string.
_PLAIN_QUALIFIER = re.compile(r"[a-z_][a-z0-9_]*\.")


def _abstracted(section: str, qualifier: str) -> list[tuple[Any, ...]]:
    """A section's rows (JSON text), with ``qualifier`` (the schema's ``name.``) replaced by
    ``<tenant>.`` in every string.

    PostgreSQL's JSON escapes only quotes, backslashes and control characters: in a text
    without a backslash every string is spelled as it reads, and a plain qualifier (lower-case
    letters, digits, ``_``) can only occur inside a string. Replacing it in the text is then
    the same as replacing it in each string, and four times cheaper; otherwise each string is
    treated on its own.
    """
    if "\\" not in section and _PLAIN_QUALIFIER.fullmatch(qualifier):
        return [tuple(row) for row in json.loads(section.replace(qualifier, "<tenant>."))]
    return [
        tuple(v.replace(qualifier, "<tenant>.") if isinstance(v, str) else v for v in row)
        for row in json.loads(section)
    ]


def _alembic_versions(conn: Conn, schema: str, relations: list[tuple[Any, ...]]) -> list[str]:
    """The schema's alembic_version rows; [] when the fingerprint found no such table."""
    if not any(row[0] == "alembic_version" and row[1] in ("r", "p") for row in relations):
        return []
    with conn.cursor(row_factory=tuple_row) as cur:
        # One text per schema: never worth preparing.
        cur.execute(versions_query(schema), prepare=False)
        return [str(row[0]) for row in cur.fetchall()]
