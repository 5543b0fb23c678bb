"""The application role's lookup never hands out a reference that leaks its sessions.

``control.tenant_location(tenant)`` (revision ``20261202_h29servers``), the query an
application in any language routes with, returned a server's reference as stored. The library
refuses ``sslkeylogfile`` in a reference (libpq 18 writes every TLS session's keys to the file
it names), and ``provisioner.locate`` leaves it out, but a row stored before that refusal, or
written into ``control.tenant_servers`` by hand, still held it, and the SQL lookup handed it to
every application session. Now:

* **The lookup leaves the key out** (``control.routable_reference``): the reference is read as
  libpq reads it (keyword/value pairs, a value quoted or not, backslash escapes; or a
  ``postgresql://`` URL's query parameters, whose names libpq percent-decodes:
  ``ssl%6Beylogfile`` is ``sslkeylogfile``) and written back without ``sslkeylogfile``, every
  other parameter's text exactly as stored.
* **The directory refuses both** in a new or changed reference, as the library does:
  ``sslkeylogfile`` anywhere in it, and a URL that percent-encodes a parameter's name. A
  trigger on ``INSERT`` and ``UPDATE OF conninfo`` (SQLSTATE 23514, as a CHECK's), not a
  CHECK: a ``NOT VALID`` CHECK still applies to every update of a row, and the placement's
  count of a server's tenants updates its row, so a server stored before would have refused
  every tenant placed on it. A row stored before stays as it is, and is routed without the key.
* **Revision ``20261207_h37guard``'s CHECK moves into the same trigger**, for that reason: a
  reference with ``sslpassword``, ``oauth_client_secret`` or a control character, stored before
  it, made every placement on that server fail (``new row ... violates check constraint
  "tenant_servers_plain_reference"``). Its rule is unchanged.

The downgrade restores the lookup word for word and the CHECK (``NOT VALID``), and drops the
trigger and the functions.

Revision ID: 20261208_h38keylog
Revises: 20261207_h37guard
Create Date: 2026-12-08
"""

import re

from alembic import op

from provisioner.control_migrations import revisions
from provisioner.control_migrations.privileges import grant_to_app_role

revision = "20261208_h38keylog"
down_revision = "20261207_h37guard"
branch_labels = None
depends_on = None

#: A ``postgresql://`` URL whose query percent-encodes a parameter's name (a regex).
ENCODED_NAME = r"^postgres(ql)?://[^?]*\?(.*&)?[^=&]*%"

# The directory's refusal of a new or changed reference (see the module): revision
# 20261207_h37guard's rule ({plain}, on NEW.conninfo), then the key and the encoded names.
REFUSE_KEYLOG = rf"""
CREATE FUNCTION control.refuse_keylog_reference() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $refuse$
BEGIN
    IF NOT ({{plain}}) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation',
            MESSAGE = 'a tenant server''s reference holds a secret or a control character';
    END IF;
    IF NEW.conninfo ~* 'sslkeylogfile' OR NEW.conninfo ~* '{ENCODED_NAME}' THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation',
            MESSAGE = 'a tenant server''s reference sets sslkeylogfile or percent-encodes a '
                      'parameter name',
            HINT = 'libpq would write the TLS session keys of whoever connects to that file';
    END IF;
    RETURN NEW;
END
$refuse$
"""

# A reference as libpq reads it, without sslkeylogfile; each kept parameter's text as stored.
# A URL: its query's parameters, each name percent-decoded. Keyword/value: a keyword runs to
# '=' or a space; after '=' and any spaces, a value is quoted (to the next unescaped quote) or
# bare (to the next space), a backslash escaping the next character in both. What libpq would
# not parse is returned as stored (libpq refuses it, whoever connects).
ROUTABLE_REFERENCE = r"""
CREATE FUNCTION control.routable_reference(reference TEXT)
RETURNS TEXT LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog AS $routable$
DECLARE
    n     INTEGER := length(reference);
    i     INTEGER := 1;
    start INTEGER;
    word  TEXT;
    kept  TEXT[] := '{}';
    c     TEXT;
    hex   TEXT;
BEGIN
    IF reference IS NULL THEN
        RETURN NULL;
    END IF;
    IF reference ~* '^postgres(ql)?://' THEN
        IF position('?' IN reference) = 0
           OR (reference !~* 'sslkeylogfile' AND position('%' IN reference) = 0) THEN
            RETURN reference;
        END IF;
        FOREACH c IN ARRAY string_to_array(
            substr(reference, position('?' IN reference) + 1), '&')
        LOOP
            word := split_part(c, '=', 1);
            LOOP  -- the name as libpq decodes it
                hex := substring(word FROM '%([0-9A-Fa-f]{2})');
                EXIT WHEN hex IS NULL;
                word := regexp_replace(word, '%[0-9A-Fa-f]{2}',
                                       chr(('x' || hex)::bit(8)::integer));
            END LOOP;
            IF word <> 'sslkeylogfile' THEN
                kept := kept || c;
            END IF;
        END LOOP;
        RETURN substr(reference, 1, position('?' IN reference) - 1)
               || coalesce('?' || nullif(array_to_string(kept, '&'), ''), '');
    END IF;
    IF reference !~* 'sslkeylogfile' THEN
        RETURN reference;
    END IF;
    WHILE i <= n LOOP
        WHILE i <= n AND substr(reference, i, 1) ~ '\s' LOOP
            i := i + 1;
        END LOOP;
        EXIT WHEN i > n;
        start := i;
        WHILE i <= n AND substr(reference, i, 1) !~ '[\s=]' LOOP
            i := i + 1;
        END LOOP;
        word := substr(reference, start, i - start);
        WHILE i <= n AND substr(reference, i, 1) ~ '\s' LOOP
            i := i + 1;
        END LOOP;
        IF i > n OR substr(reference, i, 1) <> '=' THEN
            RETURN reference;  -- not a conninfo libpq parses: left to libpq to refuse
        END IF;
        i := i + 1;
        WHILE i <= n AND substr(reference, i, 1) ~ '\s' LOOP
            i := i + 1;
        END LOOP;
        IF i <= n AND substr(reference, i, 1) = '''' THEN
            i := i + 1;
            LOOP
                IF i > n THEN
                    RETURN reference;  -- an unterminated quote: libpq refuses it
                END IF;
                c := substr(reference, i, 1);
                i := i + 1;
                IF c = '\' THEN
                    i := i + 1;
                ELSIF c = '''' THEN
                    EXIT;
                END IF;
            END LOOP;
        ELSE
            WHILE i <= n AND substr(reference, i, 1) !~ '\s' LOOP
                i := i + CASE WHEN substr(reference, i, 1) = '\' THEN 2 ELSE 1 END;
            END LOOP;
        END IF;
        IF word <> 'sslkeylogfile' THEN
            kept := kept || substr(reference, start, least(i, n + 1) - start);
        END IF;
    END LOOP;
    RETURN array_to_string(kept, ' ');
END
$routable$
"""

# Revision 20261202_h29servers's lookup; the upgrade gives the reference through
# routable_reference.
LOCATION = """
        CREATE OR REPLACE FUNCTION control.tenant_location(tenant TEXT)
        RETURNS TABLE (server TEXT, conninfo TEXT)
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $locate$
            SELECT t.server, {reference}
              FROM control.tenants t LEFT JOIN control.tenant_servers s ON s.name = t.server
             WHERE t.tenant_id = tenant
        $locate$
        """


def _plain_reference() -> str:
    """Revision 20261207_h37guard's CHECK on a reference."""
    return str(revisions.load("20261207_h37guard").PLAIN_REFERENCE)


def upgrade() -> None:
    # its rule moves into the trigger below, in this transaction: no row goes unchecked
    op.execute(
        """
        -- squawk-ignore ban-drop-constraint
        ALTER TABLE control.tenant_servers DROP CONSTRAINT tenant_servers_plain_reference
        """
    )
    plain = re.sub(r"\bconninfo\b", "NEW.conninfo", _plain_reference())
    op.execute(REFUSE_KEYLOG.replace("{plain}", plain))
    op.execute("REVOKE ALL ON FUNCTION control.refuse_keylog_reference() FROM PUBLIC")
    op.execute(
        "CREATE TRIGGER tenant_servers_no_keylog BEFORE INSERT OR UPDATE OF conninfo "
        "ON control.tenant_servers FOR EACH ROW EXECUTE FUNCTION control.refuse_keylog_reference()"
    )
    op.execute(ROUTABLE_REFERENCE)
    op.execute("REVOKE ALL ON FUNCTION control.routable_reference(TEXT) FROM PUBLIC")
    op.execute(LOCATION.format(reference="control.routable_reference(s.conninfo)"))
    grant_to_app_role("EXECUTE", "FUNCTION control.tenant_location(TEXT)")


def downgrade() -> None:
    op.execute(LOCATION.format(reference="s.conninfo"))
    op.execute("DROP FUNCTION control.routable_reference(TEXT)")
    op.execute("DROP TRIGGER tenant_servers_no_keylog ON control.tenant_servers")
    op.execute("DROP FUNCTION control.refuse_keylog_reference()")
    op.execute(
        "ALTER TABLE control.tenant_servers ADD CONSTRAINT tenant_servers_plain_reference "
        f"CHECK ({_plain_reference()}) NOT VALID"
    )
