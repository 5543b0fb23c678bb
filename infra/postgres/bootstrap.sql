-- Database role bootstrap for provisioner. Run as a superuser, connected to the product
-- database; safe to run any number of times. Compose runs it on first start of the postgres
-- container, and the test harness runs it (twice) against every fresh test cluster.
--
--   provisioner_owner  LOGIN, not a superuser, no CREATEDB/CREATEROLE. Owns the database, the
--                      control schema and every tenant schema: it runs the control migrations,
--                      CREATE SCHEMA, the tenant migrations and the grants.
--   app_rw             LOGIN, nothing else. Reads and writes rows it is granted; can create
--                      nothing anywhere (no CREATE on the database, on public or on any schema).
--
-- Passwords are not set here: set them from your secret store, e.g.
--   ALTER ROLE provisioner_owner PASSWORD '...';  ALTER ROLE app_rw PASSWORD '...';
-- (infra/postgres/10-bootstrap.sh does that from the environment in the compose topology.)

DO $bootstrap$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'provisioner_owner') THEN
    CREATE ROLE provisioner_owner LOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'app_rw') THEN
    CREATE ROLE app_rw LOGIN;
  END IF;
END
$bootstrap$;

-- Re-assert the attributes on every run, so a role that existed with more power loses it.
ALTER ROLE provisioner_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
ALTER ROLE app_rw LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  NOINHERIT;

DO $bootstrap$
BEGIN
  EXECUTE format('ALTER DATABASE %I OWNER TO provisioner_owner', current_database());
  -- Only the owner may create schemas; everyone else just connects.
  EXECUTE format('REVOKE CREATE ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO app_rw', current_database());
END
$bootstrap$;

-- Nobody but the owner creates objects in public (PostgreSQL 15+ already defaults to this).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- The control schema belongs to the owner; the control migrations grant app_rw its rows.
CREATE SCHEMA IF NOT EXISTS control AUTHORIZATION provisioner_owner;
ALTER SCHEMA control OWNER TO provisioner_owner;
