"""What ``repair`` restores in a drifted tenant, and what it leaves alone, with the reason.

A plan is made from the differences between the tenant's inventory and the template head's
(:func:`provisioner.tenant.catalog.compare`). The rules, in one place:

* **Privileges are restored exactly**: a missing grant is granted, an extra one is revoked (on
  the schema, its tables, sequences and columns), and the owner's default privileges likewise.
  They are access, not data; the template's access is the contract.
* **Objects the template defines and that hold no data are re-created** from the head's own
  definition: indexes, constraints, views, functions, triggers, policies, rules, enum types,
  a missing nullable (or defaulted) column; an altered one is put back (a function or view
  replaced, a trigger, policy or index dropped and created again, a sequence's options, a
  table's row-level security flags, a column's default, an owner).
* **Nothing is dropped, and no data is changed**: an extra object is named and left alone
  (with whether it holds data), and so is a missing table, a column whose type or
  nullability changed, an identity column, a changed constraint or enum.

Each action runs under its own savepoint: one that fails (a constraint the data violates) is
reported, and the others still apply. Every statement comes from the catalog's own rendering
of the head's objects (``pg_get_indexdef``, ``pg_get_functiondef``...) or is composed with
``psycopg.sql`` from names and literals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from provisioner import db
from provisioner.errors import DatabaseError
from provisioner.tenant import catalog
from provisioner.tenant.catalog import ALTERED, EXTRA, MISSING, Difference

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Action:
    """One restoring statement, and what it restores (``missing index members_email_key``)."""

    what: str
    statement: sql.SQL | sql.Composed
    #: run earlier when lower: revokes, then objects, then the grants on them
    order: int = 5


@dataclass(frozen=True)
class LeftAlone:
    """An object repair will not touch, and why."""

    what: str
    reason: str


@dataclass(frozen=True)
class Plan:
    actions: list[Action] = field(default_factory=list)
    left_alone: list[LeftAlone] = field(default_factory=list)


def describe(difference: Difference) -> str:
    return f"{difference.change} {difference.kind} {difference.name}"


def plan(conn: Conn, schema: str, differences: list[Difference], *, owner: str) -> Plan:
    """The actions that bring ``schema`` back to the head's shape where it is safe, and what is
    left alone. ``owner``: the role that runs them (the default privileges it may restore are
    its own). Reads the catalog only to say whether an extra table or column holds data."""
    out = Plan()
    # What belongs to an object missing or extra as a whole goes with it: left alone with it,
    # or given back by its creation (a new view has its owner's default privileges; whatever
    # else it lacks, the job's second pass sees).
    whole = catalog.wholes(differences)
    for difference in differences:
        if difference.within(whole):
            continue
        rule = RULES.get((difference.kind, difference.change))
        result = rule(conn, schema, difference, owner) if rule else None
        if result is None:
            result = LeftAlone(describe(difference), _default_reason(difference))
        for item in result if isinstance(result, list) else [result]:
            if isinstance(item, LeftAlone):
                out.left_alone.append(item)
            else:
                out.actions.append(item)
    out.actions.sort(key=lambda a: a.order)
    return out


def _default_reason(difference: Difference) -> str:
    if difference.change == EXTRA:
        return "not the template's: drop it by hand if it is unwanted"
    if difference.change == MISSING:
        return "not re-created automatically: restore it by hand"
    return "changing it back could change data: review it by hand"


# -- helpers ------------------------------------------------------------------------------------


def _id(schema: str, name: str) -> sql.Identifier:
    return sql.Identifier(schema, name)


def _grantee(attrs: dict[str, Any]) -> sql.Composable:
    grantee = attrs.get("grantee")
    return sql.SQL("PUBLIC") if grantee is None else sql.Identifier(str(grantee))


def _text(schema: str, definition: Any) -> sql.SQL:
    """A definition the catalog rendered for the head's schema, for the tenant's."""
    return sql.SQL(catalog.in_tenant(str(definition), schema))


def _holds_data(conn: Conn, statement: sql.Composed) -> bool:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(statement)
        row = cur.fetchone()
    return bool(row and row[0])


#: a rule's answer: actions (and, for what part of an object it cannot restore, LeftAlone
#: entries), one LeftAlone, or None for the default reason
Result = list[Action | LeftAlone] | LeftAlone | None
Rule = Callable[[Conn, str, Difference, str], Result]

# -- privileges ---------------------------------------------------------------------------------

#: The privilege keywords a GRANT may name (aclexplode's privilege_type values).
PRIVILEGES = frozenset(
    {
        "SELECT",
        "INSERT",
        "UPDATE",
        "DELETE",
        "TRUNCATE",
        "REFERENCES",
        "TRIGGER",
        "USAGE",
        "CREATE",
        "EXECUTE",
        "TEMPORARY",
        "CONNECT",
        "MAINTAIN",
    }
)


def _privilege_target(schema: str, attrs: dict[str, Any]) -> tuple[sql.Composable, str] | None:
    """(the privilege's object in GRANT syntax, its column or ''); None for kinds left alone."""
    on, name = str(attrs["on"]), str(attrs["object"])
    if on == "SCHEMA":
        return sql.SQL("SCHEMA {}").format(sql.Identifier(schema)), ""
    if on in ("TABLE", "SEQUENCE"):
        return sql.SQL(on + " {}").format(_id(schema, name)), ""
    if on == "COLUMN":
        table, _, column = name.partition(".")
        return sql.SQL("TABLE {}").format(_id(schema, table)), column
    return None


def _privilege(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    attrs = d.expected or d.found or {}
    target = _privilege_target(schema, attrs)
    if target is None:
        return LeftAlone(describe(d), "a function's or type's privilege: change it by hand")
    on, column = target
    if attrs.get("privilege") not in PRIVILEGES:
        return LeftAlone(describe(d), "a privilege this version does not know: by hand")
    privilege: sql.Composable = sql.SQL(str(attrs["privilege"]))
    if column:
        privilege = sql.SQL("{} ({})").format(privilege, sql.Identifier(column))
    if d.change == MISSING:
        option = sql.SQL(" WITH GRANT OPTION" if attrs.get("grantable") else "")
        statement = sql.SQL("GRANT {} ON {} TO {}{}").format(privilege, on, _grantee(attrs), option)
        return [Action(describe(d), statement, order=9)]
    statement = sql.SQL("REVOKE {} ON {} FROM {}").format(privilege, on, _grantee(attrs))
    return [Action(describe(d), statement, order=0)]


_DEFAULT_OBJECTS = {"r": "TABLES", "S": "SEQUENCES", "f": "FUNCTIONS", "T": "TYPES"}


def _default_privilege(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    attrs = d.expected or d.found or {}
    objects = _DEFAULT_OBJECTS.get(str(attrs.get("on")))
    if (
        attrs.get("for role") != owner
        or objects is None
        or attrs.get("privilege") not in PRIVILEGES
    ):
        return LeftAlone(describe(d), f"another role's default privileges: only {owner}'s are")
    verb = "GRANT {} ON {} TO {}" if d.change == MISSING else "REVOKE {} ON {} FROM {}"
    statement = sql.SQL(
        "ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER IN SCHEMA {} " + verb
    ).format(
        sql.Identifier(schema),
        sql.SQL(str(attrs["privilege"])),
        sql.SQL(objects),
        _grantee(attrs),
    )
    return [Action(describe(d), statement, order=1 if d.change == EXTRA else 9)]


# -- objects ------------------------------------------------------------------------------------


def _extra_table(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    query = sql.SQL("SELECT EXISTS (SELECT FROM {})").format(_id(schema, d.name))
    held = "it holds rows" if _holds_data(conn, query) else "it is empty"
    return LeftAlone(describe(d), f"not the template's ({held}): drop it by hand if it is unwanted")


def _extra_column(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    table, _, column = d.name.partition(".")
    query = sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE {} IS NOT NULL)").format(
        _id(schema, table), sql.Identifier(column)
    )
    held = "it holds values" if _holds_data(conn, query) else "it holds no value"
    return LeftAlone(describe(d), f"not the template's ({held}): drop it by hand if it is unwanted")


def _missing_column(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    attrs = d.expected or {}
    if attrs.get("identity") or attrs.get("generated"):
        return LeftAlone(describe(d), "an identity or generated column: restore it by hand")
    table, _, column = d.name.partition(".")
    parts = [
        sql.SQL("ALTER TABLE {} ADD COLUMN {} ").format(_id(schema, table), sql.Identifier(column)),
        _text(schema, attrs["type"]),
    ]
    if attrs.get("default") is not None:
        parts += [sql.SQL(" DEFAULT "), _text(schema, attrs["default"])]
    if attrs.get("not null"):
        parts.append(sql.SQL(" NOT NULL"))
    return [Action(describe(d), sql.Composed(parts), order=3)]


def _altered_column(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    if {name for name, _, _ in d.changes} != {"default"}:
        return LeftAlone(describe(d), "its type or nullability changed: the data would change")
    table, _, column = d.name.partition(".")
    want = (d.expected or {}).get("default")
    head = sql.SQL("ALTER TABLE {} ALTER COLUMN {} ").format(
        _id(schema, table), sql.Identifier(column)
    )
    tail = (
        sql.SQL("DROP DEFAULT") if want is None else sql.SQL("SET DEFAULT ") + _text(schema, want)
    )
    return [Action(describe(d), head + tail, order=3)]


_TABLE_FLAGS = {
    "row security": ("ENABLE ROW LEVEL SECURITY", "DISABLE ROW LEVEL SECURITY"),
    "forced row security": ("FORCE ROW LEVEL SECURITY", "NO FORCE ROW LEVEL SECURITY"),
}


def _altered_relation(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    """A table's row-level security flags and a relation's owner; the rest is left alone."""
    keyword = {"table": "TABLE", "view": "VIEW", "sequence": "SEQUENCE"}[d.kind]
    actions: list[Action | LeftAlone] = []
    rest: list[str] = []
    for name, want, _ in d.changes:
        if name in _TABLE_FLAGS and d.kind == "table":
            clause = _TABLE_FLAGS[name][0 if want else 1]
            statement = sql.SQL("ALTER TABLE {} " + clause).format(_id(schema, d.name))
            actions.append(Action(f"{describe(d)}: {name}", statement, order=2))
        elif name == "owner" and want is not None:
            statement = sql.SQL("ALTER " + keyword + " {} OWNER TO {}").format(
                _id(schema, d.name), sql.Identifier(str(want))
            )
            actions.append(Action(f"{describe(d)}: owner", statement, order=2))
        elif d.kind == "sequence" or (d.kind == "view" and name == "definition"):
            continue  # below
        else:
            rest.append(name)
    if d.kind == "sequence" and any(n not in ("owner",) for n, _, _ in d.changes):
        actions.append(_sequence_options(schema, d))
    if d.kind == "view" and any(n == "definition" for n, _, _ in d.changes):
        view = _view(conn, schema, d, owner)
        actions += view if isinstance(view, list) else []
    if rest:
        actions.append(LeftAlone(describe(d), f"{', '.join(rest)} changed: review it by hand"))
    return actions


def _sequence_options(schema: str, d: Difference) -> Action:
    want = d.expected or {}
    statement = sql.SQL(
        "ALTER SEQUENCE {} AS {} INCREMENT BY {} MINVALUE {} MAXVALUE {} START WITH {} CACHE {} {}"
    ).format(
        _id(schema, d.name),
        _text(schema, want["type"]),
        sql.Literal(int(want["increment"])),
        sql.Literal(int(want["minvalue"])),
        sql.Literal(int(want["maxvalue"])),
        sql.Literal(int(want["start"])),
        sql.Literal(int(want["cache"])),
        sql.SQL("CYCLE" if want.get("cycle") else "NO CYCLE"),
    )
    return Action(f"{describe(d)}: options", statement, order=2)


def _view(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    definition = (d.expected or {}).get("definition")
    if definition is None:
        return None
    statement = sql.SQL("CREATE OR REPLACE VIEW {} AS ").format(_id(schema, d.name))
    return [Action(describe(d), statement + _text(schema, definition), order=6)]


def _index(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    attrs = d.expected or {}
    if attrs.get("constraint"):
        if d.change == MISSING:
            return []  # the missing constraint's own action builds it
        return LeftAlone(describe(d), f"it backs constraint {attrs['constraint']}: by hand")
    actions: list[Action | LeftAlone] = []
    if d.change == ALTERED:
        drop = sql.SQL("DROP INDEX {}").format(_id(schema, d.name))
        actions.append(Action(f"{describe(d)}: dropped", drop, order=5))
    actions.append(Action(describe(d), _text(schema, attrs["definition"]), order=5))
    return actions


def _missing_constraint(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    attrs = d.expected or {}
    if "table" not in attrs:
        return LeftAlone(describe(d), "a domain's constraint: restore it by hand")
    name = d.name.partition(".")[2]
    statement = sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(
        _id(schema, str(attrs["table"])), sql.Identifier(name)
    )
    return [Action(describe(d), statement + _text(schema, attrs["definition"]), order=4)]


def _function(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    definition = (d.expected or {}).get("definition")
    if definition is None:
        return LeftAlone(describe(d), "an aggregate: restore it by hand")
    if d.change == ALTERED and {n for n, _, _ in d.changes} != {"definition"}:
        return LeftAlone(describe(d), "its owner or kind changed: review it by hand")
    return [Action(describe(d), _text(schema, definition), order=4)]


def _drop_and_create(kind: str) -> Rule:
    """Triggers and policies: created from the head's definition (dropped first if altered)."""

    def rule(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
        attrs = d.expected or {}
        table, _, name = d.name.partition(".")
        actions: list[Action | LeftAlone] = []
        if d.change == ALTERED:
            drop = sql.SQL("DROP " + kind + " {} ON {}").format(
                sql.Identifier(name), _id(schema, table)
            )
            actions.append(Action(f"{describe(d)}: dropped", drop, order=7))
        create: sql.SQL | sql.Composed = (
            _policy(schema, table, name, attrs)
            if kind == "POLICY"
            else _text(schema, attrs["definition"])
        )
        actions.append(Action(describe(d), create, order=7))
        return actions

    return rule


def _policy(schema: str, table: str, name: str, attrs: dict[str, Any]) -> sql.Composed:
    commands = {"r": "SELECT", "a": "INSERT", "w": "UPDATE", "d": "DELETE", "*": "ALL"}
    roles = [r.strip() for r in str(attrs.get("roles", "PUBLIC")).split(",")]
    parts: list[sql.Composable] = [
        sql.SQL("CREATE POLICY {} ON {} AS {} FOR {} TO {}").format(
            sql.Identifier(name),
            _id(schema, table),
            sql.SQL("PERMISSIVE" if attrs.get("permissive") else "RESTRICTIVE"),
            sql.SQL(commands[str(attrs["command"])]),
            sql.SQL(", ").join(
                sql.SQL("PUBLIC") if r == "PUBLIC" else sql.Identifier(r) for r in roles
            ),
        )
    ]
    if attrs.get("using") is not None:
        parts += [sql.SQL(" USING ("), _text(schema, attrs["using"]), sql.SQL(")")]
    if attrs.get("with check") is not None:
        parts += [sql.SQL(" WITH CHECK ("), _text(schema, attrs["with check"]), sql.SQL(")")]
    return sql.Composed(parts)


def _rule(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    definition = str((d.expected or {})["definition"])
    if definition.startswith("CREATE RULE "):
        definition = "CREATE OR REPLACE RULE " + definition[len("CREATE RULE ") :]
    return [Action(describe(d), _text(schema, definition.rstrip(";")), order=7)]


def _missing_type(conn: Conn, schema: str, d: Difference, owner: str) -> Result:
    attrs = d.expected or {}
    if attrs.get("kind") != "enum":
        return LeftAlone(describe(d), f"a missing {attrs.get('kind')} type: restore it by hand")
    labels = [label.strip() for label in str(attrs.get("labels", "")).split(", ") if label]
    statement = sql.SQL("CREATE TYPE {} AS ENUM ({})").format(
        _id(schema, d.name), sql.SQL(", ").join(sql.Literal(label) for label in labels)
    )
    return [Action(describe(d), statement, order=2)]


RULES: dict[tuple[str, str], Rule] = {
    ("privilege", MISSING): _privilege,
    ("privilege", EXTRA): _privilege,
    ("default privilege", MISSING): _default_privilege,
    ("default privilege", EXTRA): _default_privilege,
    ("table", EXTRA): _extra_table,
    ("table", ALTERED): _altered_relation,
    ("sequence", ALTERED): _altered_relation,
    ("view", ALTERED): _altered_relation,
    ("view", MISSING): _view,
    ("column", EXTRA): _extra_column,
    ("column", MISSING): _missing_column,
    ("column", ALTERED): _altered_column,
    ("index", MISSING): _index,
    ("index", ALTERED): _index,
    ("constraint", MISSING): _missing_constraint,
    ("function", MISSING): _function,
    ("function", ALTERED): _function,
    ("trigger", MISSING): _drop_and_create("TRIGGER"),
    ("trigger", ALTERED): _drop_and_create("TRIGGER"),
    ("policy", MISSING): _drop_and_create("POLICY"),
    ("policy", ALTERED): _drop_and_create("POLICY"),
    ("rule", MISSING): _rule,
    ("rule", ALTERED): _rule,
    ("type", MISSING): _missing_type,
}


@dataclass(frozen=True)
class Applied:
    """How a plan's actions went: restored, and failed (with the server's one-line reason)."""

    restored: list[str]
    failed: list[tuple[str, str]]


def apply(conn: Conn, actions: list[Action]) -> Applied:
    """Run each action under its own savepoint, in the caller's transaction."""
    restored: list[str] = []
    failed: list[tuple[str, str]] = []
    for action in actions:
        try:
            with db.translated(), conn.transaction(), conn.cursor() as cur:
                cur.execute(action.statement)
        except DatabaseError as exc:  # the statement failed; a lost connection goes up
            failed.append((action.what, str(exc).strip().splitlines()[0]))
        else:
            restored.append(action.what)
    return Applied(restored, failed)
