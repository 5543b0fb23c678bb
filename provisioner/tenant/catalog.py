"""A tenant schema's inventory: every object a template can create, named, with what defines it.

``provisioner check`` and ``provisioner repair`` compare a tenant with what the template head
builds. The replay fingerprint (:func:`provisioner.tenant.fingerprint.fingerprint`) covers what the
shipped template creates and is kept small because it runs on every provisioning; the inventory
is the complete one, read only by drift: tables, views, materialized views, sequences (and
their options), columns, constraints (of tables and domains), indexes, functions, triggers,
types (enum, composite, domain, range), row-level security flags, policies, rules, owners, and
every privilege as one object each (schema, table, sequence, column, function and type grants,
and default privileges).

It is read in ONE statement per schema. Every lookup goes by oid: the schema's own objects
through its ``pg_depend`` entries (indexed by the referenced namespace; ``pg_class`` has no
index on ``relnamespace``), and what hangs off a table (columns, indexes, constraints,
triggers, policies, rules) through the catalogs' indexes on the table's oid. The rows come
back as JSON text; the schema's own name is replaced by ``<tenant>`` before parsing, so two
tenants built the same way have equal inventories.

An object is ``(kind, name)`` -> its attributes (a dict of strings, booleans and numbers). A
privilege's name reads as the GRANT that gives it (``SELECT ON TABLE members TO app_rw``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.string import TextLoader

from provisioner.roles import AppRoles

Conn = psycopg.Connection[Any]

#: What stands for the schema's own name in every name and definition.
TENANT = "<tenant>"

#: (kind, name) of one object.
Key = tuple[str, str]
#: Every object of a schema, by (kind, name), with its attributes.
Inventory = dict[Key, dict[str, Any]]

# The whole inventory of one schema; no row when the schema does not exist.
INVENTORY = """
WITH nsp AS (SELECT oid, nspowner, nspacl FROM pg_namespace WHERE nspname = %(schema)s),
deps AS (
    SELECT d.classid, d.objid FROM nsp
      JOIN pg_depend d ON d.refclassid = 'pg_namespace'::regclass AND d.refobjid = nsp.oid
),
rels AS (
    SELECT c.oid, c.relname, c.relkind, c.relacl, c.relowner, c.relrowsecurity,
           c.relforcerowsecurity, c.relpersistence, c.reloptions
      FROM deps d JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
      JOIN nsp ON c.relnamespace = nsp.oid
     WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
),
procs AS (
    SELECT p.oid, p.proname, p.prokind, p.proowner, p.proacl,
           p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS signature
      FROM deps d JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
),
types AS (
    SELECT t.oid, t.typname, t.typtype, t.typowner, t.typacl, t.typrelid, t.typbasetype,
           t.typtypmod, t.typnotnull, t.typdefault
      FROM deps d JOIN pg_type t ON d.classid = 'pg_type'::regclass AND t.oid = d.objid
),
acls AS (
    SELECT 'SCHEMA' AS on_kind, '<tenant>'::text AS on_name, NULL::text AS parent,
           coalesce(nspacl, acldefault('n', nspowner)) AS acl FROM nsp
    UNION ALL
    SELECT CASE relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, relname, relname,
           coalesce(relacl,
                    acldefault(CASE relkind WHEN 'S' THEN 's' ELSE 'r' END::"char", relowner))
      FROM rels
    UNION ALL
    SELECT 'COLUMN', c.relname || '.' || a.attname, c.relname, a.attacl
      FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid
     WHERE a.attnum > 0 AND NOT a.attisdropped AND a.attacl IS NOT NULL
    UNION ALL
    SELECT 'FUNCTION', signature, NULL, coalesce(proacl, acldefault('f', proowner)) FROM procs
    UNION ALL
    SELECT 'TYPE', typname, NULL, coalesce(typacl, acldefault('T', typowner)) FROM types
),
objects AS (
    SELECT 'schema'::text AS kind, '<tenant>'::text AS name,
           json_build_object('owner', pg_get_userbyid(nspowner)) AS attrs FROM nsp
    UNION ALL
    SELECT CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                          WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table'
                          ELSE 'table' END,
           c.relname,
           json_strip_nulls(json_build_object(
               'owner', pg_get_userbyid(c.relowner),
               'partitioned', CASE WHEN c.relkind = 'p' THEN true END,
               'row security', CASE WHEN c.relkind IN ('r', 'p') THEN c.relrowsecurity END,
               'forced row security',
                   CASE WHEN c.relkind IN ('r', 'p') THEN c.relforcerowsecurity END,
               'unlogged', CASE WHEN c.relpersistence = 'u' THEN true END,
               'options', array_to_string(c.reloptions, ', '),
               'definition', CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END,
               'type', format_type(s.seqtypid, NULL),
               'start', s.seqstart, 'increment', s.seqincrement, 'minvalue', s.seqmin,
               'maxvalue', s.seqmax, 'cache', s.seqcache, 'cycle', s.seqcycle))
      FROM rels c LEFT JOIN pg_sequence s ON s.seqrelid = c.oid
    UNION ALL
    SELECT 'column', c.relname || '.' || a.attname,
           json_strip_nulls(json_build_object(
               'table', c.relname,
               'type', format_type(a.atttypid, a.atttypmod),
               'not null', a.attnotnull,
               'default', pg_get_expr(d.adbin, d.adrelid),
               'identity', nullif(a.attidentity::text, ''),
               'generated', nullif(a.attgenerated::text, '')))
      FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE c.relkind IN ('r', 'p', 'f') AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'constraint', c.relname || '.' || k.conname,
           json_build_object('table', c.relname, 'definition', pg_get_constraintdef(k.oid))
      FROM rels c JOIN pg_constraint k ON k.conrelid = c.oid
    UNION ALL
    SELECT 'constraint', t.typname || '.' || k.conname,
           json_build_object('type', t.typname, 'definition', pg_get_constraintdef(k.oid))
      FROM types t JOIN pg_constraint k ON k.contypid = t.oid
    UNION ALL
    SELECT 'index', i.relname,
           json_strip_nulls(json_build_object(
               'table', c.relname, 'definition', pg_get_indexdef(i.oid),
               'constraint', (SELECT k.conname FROM pg_constraint k
                               WHERE k.conrelid = c.oid AND k.conindid = i.oid
                                 AND k.contype IN ('p', 'u', 'x'))))
      FROM rels c JOIN pg_index x ON x.indrelid = c.oid JOIN pg_class i ON i.oid = x.indexrelid
    UNION ALL
    SELECT 'function', signature,
           json_strip_nulls(json_build_object(
               'owner', pg_get_userbyid(proowner), 'kind', prokind,
               'definition', CASE WHEN prokind <> 'a' THEN pg_get_functiondef(oid) END))
      FROM procs
    UNION ALL
    SELECT 'trigger', c.relname || '.' || g.tgname,
           json_build_object('table', c.relname, 'definition', pg_get_triggerdef(g.oid),
                             'enabled', g.tgenabled)
      FROM rels c JOIN pg_trigger g ON g.tgrelid = c.oid AND NOT g.tgisinternal
    UNION ALL
    SELECT 'policy', c.relname || '.' || p.polname,
           json_strip_nulls(json_build_object(
               'table', c.relname, 'command', p.polcmd, 'permissive', p.polpermissive,
               'roles', (SELECT string_agg(CASE WHEN r = 0 THEN 'PUBLIC'
                                                ELSE pg_get_userbyid(r)::text END, ', '
                                           ORDER BY 1)
                           FROM unnest(p.polroles) AS r),
               'using', pg_get_expr(p.polqual, p.polrelid),
               'with check', pg_get_expr(p.polwithcheck, p.polrelid)))
      FROM rels c JOIN pg_policy p ON p.polrelid = c.oid
    UNION ALL
    SELECT 'rule', c.relname || '.' || r.rulename,
           json_build_object('table', c.relname, 'definition', pg_get_ruledef(r.oid))
      FROM rels c JOIN pg_rewrite r ON r.ev_class = c.oid AND r.rulename <> '_RETURN'
    UNION ALL
    SELECT 'type', typname,
           json_strip_nulls(json_build_object(
               'owner', pg_get_userbyid(typowner),
               'kind', CASE typtype WHEN 'e' THEN 'enum' WHEN 'c' THEN 'composite'
                                    WHEN 'd' THEN 'domain' WHEN 'r' THEN 'range'
                                    WHEN 'm' THEN 'multirange' ELSE 'base' END,
               'labels', CASE WHEN typtype = 'e' THEN
                   (SELECT string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
                      FROM pg_enum e WHERE e.enumtypid = t.oid) END,
               'attributes', CASE WHEN typtype = 'c' THEN
                   (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod),
                                      ', ' ORDER BY a.attnum)
                      FROM pg_attribute a
                     WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) END,
               'base type', CASE WHEN typtype = 'd' THEN format_type(typbasetype, typtypmod) END,
               'not null', CASE WHEN typtype = 'd' THEN typnotnull END,
               'default', typdefault))
      FROM types t
    UNION ALL
    SELECT 'privilege',
           a.privilege_type || ' ON ' || acls.on_kind || ' ' || acls.on_name || ' TO '
               || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee)::text END
               || CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END,
           json_strip_nulls(json_build_object(
               'on', acls.on_kind, 'object', acls.on_name, 'table', acls.parent,
               'privilege', a.privilege_type,
               'grantee', CASE WHEN a.grantee = 0 THEN NULL
                               ELSE pg_get_userbyid(a.grantee)::text END,
               'grantable', a.is_grantable))
      FROM acls CROSS JOIN aclexplode(acls.acl) a
    UNION ALL
    SELECT 'default privilege',
           a.privilege_type || ' ON ' || CASE d.defaclobjtype WHEN 'r' THEN 'TABLES'
               WHEN 'S' THEN 'SEQUENCES' WHEN 'f' THEN 'FUNCTIONS' WHEN 'T' THEN 'TYPES'
               ELSE 'SCHEMAS' END
               || ' TO ' || CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                 ELSE pg_get_userbyid(a.grantee)::text END
               || ' (FOR ROLE ' || r.rolname || ')',
           json_strip_nulls(json_build_object(
               'for role', r.rolname::text, 'on', d.defaclobjtype::text,
               'privilege', a.privilege_type,
               'grantee', CASE WHEN a.grantee = 0 THEN NULL
                               ELSE pg_get_userbyid(a.grantee)::text END))
      -- role by role: pg_default_acl is indexed by (role, schema, type), not by schema
      FROM nsp CROSS JOIN pg_roles r
      JOIN pg_default_acl d ON d.defaclrole = r.oid AND d.defaclnamespace = nsp.oid
     CROSS JOIN aclexplode(d.defaclacl) a
)
SELECT coalesce(json_agg(json_build_array(kind, name, attrs)), '[]') FROM objects
 WHERE EXISTS (SELECT FROM nsp)
"""

#: The kinds of object an inventory names, in the order reports list them.
KINDS = (
    "schema",
    "table",
    "foreign table",
    "view",
    "materialized view",
    "sequence",
    "column",
    "constraint",
    "index",
    "type",
    "function",
    "trigger",
    "policy",
    "rule",
    "privilege",
    "default privilege",
)

#: Kinds whose objects are access, not structure: what a suspended tenant has none of.
PRIVILEGE_KINDS = ("privilege", "default privilege")


def read(conn: Conn, schema: str) -> Inventory | None:
    """The schema's inventory, its own name abstracted; None when there is no such schema."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.adapters.register_loader("json", TextLoader)  # parsed after abstraction
        cur.execute(INVENTORY, {"schema": schema})
        row = cur.fetchone()
    assert row is not None
    rows = _parsed(str(row[0]), schema)
    if not rows:
        return None  # a schema always yields its own row: no row means no schema
    return {(str(kind), str(name)): dict(attrs) for kind, name, attrs in rows}


#: A schema name PostgreSQL's JSON spells as it reads (no escapes), that cannot match a
#: longer name's tail (a qualifier always ends with the dot, a name is never preceded by one
#: of these characters in the abstracted places).
_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")


def _parsed(text: str, schema: str) -> list[list[Any]]:
    """The JSON rows, with ``schema.`` (and a quoted ``"schema".``) replaced by ``<tenant>.``,
    and the schema's name as a string literal (``SET search_path TO 'schema'``, which a
    function created with ``SET search_path FROM CURRENT`` carries) by ``'<tenant>'``.

    In a text without a backslash every JSON string reads as it is spelled, so a plain name can
    be replaced in the text directly; otherwise string by string."""
    replacements = (
        (f"{schema}.", f"{TENANT}."),
        (f'"{schema}".', f"{TENANT}."),
        (f"'{schema}'", f"'{TENANT}'"),
    )
    if "\\" not in text and _PLAIN.fullmatch(schema):
        for old, new in (replacements[0], replacements[2]):
            text = text.replace(old, new)
        return list(json.loads(text))

    def abstract(value: Any) -> Any:
        if isinstance(value, str):
            for old, new in replacements:
                value = value.replace(old, new)
            return value
        if isinstance(value, list):
            return [abstract(v) for v in value]
        if isinstance(value, dict):
            return {k: abstract(v) for k, v in value.items()}
        return value

    return list(abstract(json.loads(text)))


def without_access_of(inventory: Inventory, roles: AppRoles) -> Inventory:
    """What ``inventory`` looks like once ``roles`` lost every privilege in the schema: a
    suspended or archived tenant's expected shape (the lifecycle steps revoke them by design)."""
    names = {role.name for role in roles}
    return {
        key: attrs
        for key, attrs in inventory.items()
        if not (key[0] in PRIVILEGE_KINDS and attrs.get("grantee") in names)
    }


def in_tenant(text: str, schema: str) -> str:
    """A definition read from the expected schema, spelled for the tenant's schema."""
    return text.replace(f"{TENANT}.", f"{schema}.").replace(f"'{TENANT}'", f"'{schema}'")


@dataclass(frozen=True)
class Difference:
    """One object that is missing, extra, or altered (``changes``: attribute -> (expected,
    found)) in a tenant."""

    change: str
    kind: str
    name: str
    expected: dict[str, Any] | None
    found: dict[str, Any] | None
    changes: tuple[tuple[str, Any, Any], ...] = ()

    @property
    def table(self) -> str | None:
        """The table (or view) the object belongs to, when it belongs to one."""
        attrs = self.expected or self.found or {}
        table = attrs.get("table")
        return str(table) if table is not None else None

    @property
    def parent(self) -> str | None:
        """The object this one belongs to (:data:`CONTAINERS`): a column's or an index's table,
        a domain constraint's type, a privilege's table, view, sequence, function or type."""
        attrs = self.expected or self.found or {}
        if self.kind in CONTAINERS:
            return None
        for name in ("table", "type"):
            if attrs.get(name) is not None:
                return str(attrs[name])
        if self.kind == "privilege" and attrs.get("on") in ("FUNCTION", "TYPE"):
            return str(attrs["object"])
        return None

    def within(self, whole: set[tuple[str, str]]) -> bool:
        """True when it belongs to an object that is itself missing (or extra) as a whole."""
        return self.parent is not None and (self.parent, self.change) in whole


MISSING, EXTRA, ALTERED = "missing", "extra", "altered"


def compare(expected: Inventory, found: Inventory) -> list[Difference]:
    """Every object that differs: in ``expected`` only (missing), in ``found`` only (extra), or
    in both with other attributes (altered); grouped in that order, then in :data:`KINDS`
    order, then by name."""
    out: list[Difference] = []
    for key in expected.keys() | found.keys():
        want, have = expected.get(key), found.get(key)
        if want == have:
            continue
        if have is None:
            out.append(Difference(MISSING, key[0], key[1], want, None))
        elif want is None:
            out.append(Difference(EXTRA, key[0], key[1], None, have))
        else:
            changes = tuple(
                (attr, want.get(attr), have.get(attr))
                for attr in sorted(want.keys() | have.keys())
                if want.get(attr) != have.get(attr)
            )
            out.append(Difference(ALTERED, key[0], key[1], want, have, changes))
    rank = {change: i for i, change in enumerate((MISSING, EXTRA, ALTERED))}
    kinds = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(
        out, key=lambda d: (rank[d.change], kinds.get(d.kind, len(KINDS)), d.kind, d.name)
    )


#: Kinds whose objects hold others (columns, indexes, privileges...).
CONTAINERS = ("table", "foreign table", "view", "materialized view", "sequence", "type", "function")


def wholes(differences: list[Difference]) -> set[tuple[str, str]]:
    """(name, change) of the objects missing or extra as a whole that may hold others."""
    return {(d.name, d.change) for d in differences if d.kind in CONTAINERS and d.change != ALTERED}


def fold(differences: list[Difference]) -> list[tuple[Difference, int]]:
    """The differences as a report lists them: what belongs to an object that is itself
    missing or extra (a table's columns, indexes, privileges...) counted on it, not listed."""
    whole = wholes(differences)
    within = Counter((d.parent, d.change) for d in differences if d.within(whole))
    return [
        (d, within[(d.name, d.change)] if d.kind in CONTAINERS else 0)
        for d in differences
        if not d.within(whole)
    ]
