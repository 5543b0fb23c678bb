"""The pytest plugin (entry point ``pytest11``): real, freshly provisioned tenants for tests.

Fixtures (see README, "Testing your application"):

``provisioner_server`` (session)
    A PostgreSQL server: the one named by ``PROVISIONER_TEST_DATABASE_URL`` (a superuser URL),
    else a throwaway cluster started for the session and removed after it.
``provisioner_database`` (session)
    A database of its own on that server (one per pytest-xdist worker), with the
    ``provisioner_owner`` and ``app_rw`` roles and the control schema at head.
``provisioner_settings`` (session)
    :class:`provisioner.Settings` for that database, to pass to the library's functions.
``tenant`` (function)
    A freshly provisioned tenant of its own for the test, dropped afterwards.
``tenant_factory`` (function)
    ``tenant_factory()`` or ``tenant_factory("acme")`` for tests that need several; every
    tenant it made is dropped after the test. ``tenant_factory("acme", settings=mine)`` puts
    the tenant in the database ``mine`` names instead (its control schema at head, the same
    roles), for a test that needs it beside rows or processes of its own there.

The plugin imports the package only when a fixture is used, so it costs nothing to test
sessions that never ask for one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from provisioner.settings import Settings
    from provisioner.testing import PgServer, ProvisionerDatabase, Tenant, TenantFactory


@pytest.fixture(scope="session")
def provisioner_server() -> Iterator[PgServer]:
    from provisioner.testing import SERVER_URL_ENV, PgServer

    server = PgServer.start(os.environ.get(SERVER_URL_ENV) or None)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def provisioner_database(
    provisioner_server: PgServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProvisionerDatabase]:
    from provisioner.testing import ProvisionerDatabase

    database = ProvisionerDatabase.create(
        provisioner_server, tmp_path_factory.mktemp("provisioner")
    )
    try:
        yield database
    finally:
        database.drop(provisioner_server)


@pytest.fixture(scope="session")
def provisioner_settings(provisioner_database: ProvisionerDatabase) -> Settings:
    return provisioner_database.settings


@pytest.fixture(scope="session")
def provisioner_tenants(provisioner_database: ProvisionerDatabase) -> Iterator[TenantFactory]:
    """The session's spare tenants (built ahead, handed out by rename)."""
    from provisioner.testing import TenantFactory

    factory = TenantFactory(provisioner_database)
    yield factory
    factory.close()


@pytest.fixture
def tenant_factory(provisioner_tenants: TenantFactory) -> Iterator[Callable[..., Tenant]]:
    made: list[Tenant] = []

    def make(tenant_id: str | None = None, *, settings: Settings | None = None) -> Tenant:
        made.append(provisioner_tenants.create(tenant_id, settings=settings))
        return made[-1]

    yield make
    for tenant in made:
        provisioner_tenants.drop(tenant)


@pytest.fixture
def tenant(tenant_factory: Callable[..., Tenant]) -> Tenant:
    return tenant_factory()
