"""The application role's rows can no longer break placement or the fleet's readers.

Two holes, each a row ``app_rw`` may write that the owner side then read on trust:

* **A heartbeat that makes every registration fail.** ``app_rw`` may write heartbeat rows
  (revision ``20261202_h27_approws``). Placement (``control.place_tenant``, revision
  ``20261206_h35beats``) believes only the owner side's, but its filter sat in the same
  ``WHERE`` as the cast of ``detail.pool.alive_seconds`` to a number, and PostgreSQL evaluates
  the cheap cast first: a row of the application's with ``"alive_seconds": "nope"`` (or
  ``1e300``) raised in every placement, so no tenant could be enqueued or registered while
  tenant servers kept spares, until someone deleted the row by hand. The preference now
  decides in a ``CASE`` (evaluated in order): a heartbeat the owner side did not write is never
  read further, and a lease that is not a JSON number, or outside 0 to a day, counts as none.
* **A tenant id no rule allows.** The application role's registration policy
  (``app_registers_tenants``) held the schema name to the recorded pattern, not the id itself:
  an id such as ``Evil"; x`` got in, and every fleet command that reads the tenants (``tenants
  list``, ``check --all``, ``repair --all``, the lifecycle commands by state) refused it and
  stopped, with no way for the application to take it back. The policy now holds the id to
  the rule ``provisioner migrate`` records (``control.tenant_naming``: its pattern, matched
  whole, and its length; the default rule without a row), to the characters every rule
  allows, and keeps it off the reserved words and the tool's and PostgreSQL's schema prefixes,
  as :meth:`provisioner.naming.TenantNaming.problem` does.

And the directory's CHECK refuses again what the library refuses in a server's reference since
this release: a secret under another key than ``password`` (``sslpassword``,
``oauth_client_secret``) and a control character, typed or percent-encoded (a newline in a
reference became an entry of its own in the PgBouncer configuration exported from it). The
owner alone writes the directory; the CHECK holds its direct writes to the same rule. It is
added ``NOT VALID``: a row stored before stays readable, every new or changed row is checked.

Everything else is the earlier revisions' text. The downgrade restores both definitions and
drops the CHECK.

Revision ID: 20261207_h37guard
Revises: 20261206_h35beats
Create Date: 2026-12-07
"""

from alembic import op

from provisioner.control_migrations import revisions
from provisioner.naming import (
    DEFAULT_ID_PATTERN,
    DEFAULT_MAX_LENGTH,
    RESERVED,
    SCRATCH_PREFIX,
    SPARE_PREFIX,
)

revision = "20261207_h37guard"
down_revision = "20261206_h35beats"
branch_labels = None
depends_on = None

#: The longest lease a pool heartbeat may promise (a day): a larger one counts as none.
LONGEST_ALIVE_SECONDS = 86400


def _live_spare_preference(unsaid_seconds: int) -> str:
    """Revision 20261206_h35beats's preference, decided in a CASE: the owner side's beat
    first, then a lease that is a JSON number within bounds (none said: ``unsaid_seconds``)."""
    alive = "h.detail -> 'pool' -> 'alive_seconds'"
    return (
        "(SELECT count(*) FROM control.tenant_pool p"
        " WHERE p.server = s.name AND p.claimed_by IS NULL"
        " AND EXISTS (SELECT FROM control.runtime_heartbeats h"
        " WHERE CASE"
        " WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_roles r, pg_catalog.pg_class c"
        " WHERE c.oid = 'control.runtime_heartbeats'::regclass AND r.rolname = h.written_by"
        " AND pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE')) THEN false"
        " WHEN NOT (h.detail -> 'pool' ->> 'digest' = p.tree_digest"
        " AND p.app_roles IN (h.detail -> 'pool' ->> 'roles', '')) THEN false"
        f" WHEN {alive} IS NULL THEN h.heartbeat_at > now() - make_interval(secs => "
        f"{unsaid_seconds})"
        f" WHEN jsonb_typeof({alive}) <> 'number' THEN false"
        f" WHEN NOT ({alive})::text::numeric BETWEEN 0 AND {LONGEST_ALIVE_SECONDS} THEN false"
        f" ELSE h.heartbeat_at > now() - make_interval(secs => ({alive})::text::float8)"
        " END))"
        " > (SELECT count(*) FROM control.platform_jobs j"
        " JOIN control.tenants t ON t.tenant_id = j.tenant_id"
        " WHERE j.status = 'queued' AND j.job_type = 'provision_tenant' AND t.server = s.name)"
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern for names starting with ``prefix`` (its ``_`` taken literally)."""
    return _literal(prefix.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%")


def _id_rule() -> str:
    """The tenant-id rule in SQL, on the row's ``tenant_id`` and ``schema_name``."""
    reserved = ", ".join(_literal(word) for word in sorted(RESERVED))
    tool_prefixes = (SPARE_PREFIX, SCRATCH_PREFIX, "pg_")
    schema_prefixes = " AND ".join(f"schema_name NOT LIKE {_like_prefix(p)}" for p in tool_prefixes)
    return (
        "tenant_id ~ '^[a-z0-9_]+$'"
        " AND length(tenant_id) <= coalesce((SELECT n.tenant_id_max_length"
        f" FROM control.tenant_naming n), {DEFAULT_MAX_LENGTH})"
        " AND tenant_id ~ ('^(?:' || coalesce((SELECT n.tenant_id_pattern"
        f" FROM control.tenant_naming n), {_literal(DEFAULT_ID_PATTERN)}) || ')$')"
        f" AND tenant_id NOT IN ({reserved})"
        f" AND tenant_id NOT LIKE {_like_prefix('pg_')}"
        " AND schema_name NOT IN ('public', 'control', 'information_schema')"
        f" AND {schema_prefixes}"
    )


#: The directory's second CHECK on a reference (see the module).
PLAIN_REFERENCE = (
    r"conninfo !~* '(^|[\s?&])(ssl)?password\s*=' AND conninfo !~* 'oauth_client_secret'"
    r" AND conninfo !~ '[\x01-\x1f\x7f]' AND conninfo !~* '%(0[0-9a-f]|1[0-9a-f]|7f)'"
)


def upgrade() -> None:
    op.execute(
        "ALTER TABLE control.tenant_servers ADD CONSTRAINT tenant_servers_plain_reference "
        f"CHECK ({PLAIN_REFERENCE}) NOT VALID"
    )
    room = revisions.load("20261204_h32room")
    beats = revisions.load("20261206_h35beats")
    preference = _live_spare_preference(beats.UNSAID_ALIVE_SECONDS)
    op.execute(room.WITH_MOVES.replace("{spare_first}", preference))
    names = revisions.load("20261202_h24names")
    named = f"schema_name = {names.NAMED_SCHEMA} AND state = 'pending'"
    names._registration(f"{named} AND {_id_rule()}")


def downgrade() -> None:
    names = revisions.load("20261202_h24names")
    names._registration(f"schema_name = {names.NAMED_SCHEMA} AND state = 'pending'")
    room = revisions.load("20261204_h32room")
    beats = revisions.load("20261206_h35beats")
    op.execute(room.WITH_MOVES.replace("{spare_first}", beats.LIVE_SPARE_PREFERENCE))
    op.execute("ALTER TABLE control.tenant_servers DROP CONSTRAINT tenant_servers_plain_reference")
