#!/usr/bin/env bash
# Compose init script for the postgres:16 image (runs once, on an empty data directory).
#
# 1. Runs infra/postgres/bootstrap.sql (mounted at $PROVISIONER_BOOTSTRAP_SQL) against
#    $POSTGRES_DB: creates provisioner_owner and app_rw, hands the database and the control
#    schema to the owner.
# 2. Sets both roles' passwords from PROVISIONER_OWNER_PASSWORD and APP_RW_PASSWORD.
#
# The passwords never appear on a command line, in this script's output or in the server log:
# psql reads them from its own environment with \getenv, quotes them with :'var', and the
# session turns statement logging off before the ALTER ROLE statements.
set -Eeuo pipefail

bootstrap_sql="${PROVISIONER_BOOTSTRAP_SQL:-/opt/provisioner/bootstrap.sql}"

if [[ -z "${PROVISIONER_OWNER_PASSWORD:-}" || -z "${APP_RW_PASSWORD:-}" ]]; then
  echo "10-bootstrap.sh: PROVISIONER_OWNER_PASSWORD and APP_RW_PASSWORD must both be set" >&2
  exit 1
fi
if [[ ! -r "$bootstrap_sql" ]]; then
  echo "10-bootstrap.sh: cannot read $bootstrap_sql (mount infra/postgres/bootstrap.sql there)" >&2
  exit 1
fi

# The entrypoint's temporary server listens on the Unix socket only: never use TCP here.
unset PGHOST PGHOSTADDR

psql_base=(
  psql --no-psqlrc --quiet --set ON_ERROR_STOP=1
  --username "${POSTGRES_USER:-postgres}"
  --dbname "${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"
)

echo "10-bootstrap.sh: applying $(basename "$bootstrap_sql")"
"${psql_base[@]}" --file "$bootstrap_sql"

echo "10-bootstrap.sh: setting the passwords of provisioner_owner and app_rw"
"${psql_base[@]}" <<'SQL'
\set VERBOSITY terse
\set SHOW_CONTEXT never
\getenv owner_password PROVISIONER_OWNER_PASSWORD
\getenv app_password APP_RW_PASSWORD
SET log_statement = 'none';
SET log_min_error_statement = 'panic';
SET password_encryption = 'scram-sha-256';
ALTER ROLE provisioner_owner PASSWORD :'owner_password';
ALTER ROLE app_rw PASSWORD :'app_password';
\unset owner_password
\unset app_password
SQL
echo "10-bootstrap.sh: done"
