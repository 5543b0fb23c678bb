"""Real tenant schemas for an application's tests: a server, a migrated database, and tenants
handed out in milliseconds. The pytest plugin (:mod:`provisioner.testing.pytest_plugin`) is a
thin layer of fixtures over this module; nothing here depends on pytest.

Why spares: provisioning a tenant (schema, template DDL, grants, seeds, control rows) costs tens
of milliseconds of catalog writes, too much to pay for every test. The factory builds *spare*
tenants ahead, in batches. The first is provisioned through the real engine
(``service.provision``) and kept as the *model*; the others are copies of it, each in one
transaction: the tenant template's DDL replayed into a new schema (as the engine's fast path
does), the grant and seed steps' own functions, then a check that the new schema's catalog
fingerprint equals the model's. A copy that does not match is rolled back and that spare is
provisioned through the engine instead, for the rest of the session. So a spare is exactly what
provisioning builds, at the cost of its DDL.

Spares (and the model) have no control rows: the model's (its tenant row, its job, its step
history) are kept as JSON once it is built, and deleted, so the application under test never
sees a spare in ``control.tenants``, ``jobs list`` or ``upgrade --all``. Handing a spare out is
one transaction that renames its schema (``ALTER SCHEMA ... RENAME``, which keeps every object,
grant and default privilege: they hang on the schema's oid, not its name) and writes the model's
control rows for the new id. A test then pays that rename, not a provisioning.
Dropping works the same way round: the tenant's control rows are deleted and its schema renamed
out of the way at once (nothing answers to the tenant's id or schema name any more), and the
renamed schemas are dropped together when the next batch of spares is built and at the end of
the session (``DROP SCHEMA ... CASCADE`` costs several times the rename). Ids the factory
makes (spares, the model, a test's unnamed tenant) follow the project's tenant-id rule, and
renamed schemas are the tool's scratch names (``provisioner_retired_*``), never a tenant's.

A tenant asked for in another database (``create(id, settings=...)``: a test's own database,
migrated, with the same roles) has no spare to rename there: the model's copy is built in place
and checked the same way, in one transaction with its control rows (the engine provisions it if
the copy differs), and it is dropped at once when the test ends.

Safe with pytest-xdist: each process creates its own database (named after the xdist worker and
a random suffix), so tenants of two processes never meet. Role bootstrap, which touches
cluster-wide roles, takes an advisory lock so two processes never run it at once.
"""

from provisioner.testing.factory import (
    ASYNC_COMMIT,
    SPARE_PREFIX,
    Tenant,
    TenantFactory,
)
from provisioner.testing.server import (
    BOOTSTRAP_LOCK_KEY,
    SERVER_URL_ENV,
    PgServer,
    ProvisionerDatabase,
    bootstrap,
    role_url,
)
from provisioner.testing.signups import Sweep, drain

__all__ = [
    "ASYNC_COMMIT",
    "BOOTSTRAP_LOCK_KEY",
    "SERVER_URL_ENV",
    "SPARE_PREFIX",
    "PgServer",
    "ProvisionerDatabase",
    "Sweep",
    "Tenant",
    "TenantFactory",
    "bootstrap",
    "drain",
    "role_url",
]
