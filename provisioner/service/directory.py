"""The directory of tenant servers (:mod:`provisioner.servers`): add, list, drain or retire,
check their reach, and where a tenant lives; written by the owner alone."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import psycopg

from provisioner import servers
from provisioner.control.schema import app_connection, writer_connection
from provisioner.models import TenantId
from provisioner.settings import Settings


def add_server(
    settings: Settings, name: str, reference: str, *, capacity: int | None = None, weight: int = 1
) -> servers.TenantServer:
    """A new active tenant server in the directory (the owner's: ``MIGRATIONS_DATABASE_URL``).
    Name and reference are checked before anything is sent."""
    servers.server_name(name)
    servers.connection_reference(reference)
    with _owner_connection(settings) as conn:
        return servers.add(conn, name, reference, capacity=capacity, weight=weight)


def list_servers(settings: Settings) -> servers.Directory:
    """The tenant servers with their references, and the tenants on the control database (the
    owner's to read: the application role reads no reference)."""
    with _owner_connection(settings) as conn:
        return servers.directory(conn)


def set_server_status(
    settings: Settings, name: str, status: servers.ServerStatus
) -> servers.TenantServer:
    """Drain, retire, mark full or activate a tenant server (UnknownServer: no such name)."""
    servers.server_name(name)
    with _owner_connection(settings) as conn:
        return servers.set_status(conn, name, status)


def check_servers(settings: Settings) -> list[servers.Reach]:
    """Whether the owner reaches each active tenant server as an ordinary role."""
    directory = list_servers(settings)
    return servers.reach_active(directory.servers, settings.owner_url)


def locate(settings: Settings, tenant_id: str) -> servers.Location:
    """Where ``tenant_id`` lives (UnknownTenant when it has no control row)."""
    tenant = TenantId(tenant_id)
    with app_connection(settings) as conn:
        return servers.locate(conn, tenant)


def _owner_connection(settings: Settings) -> AbstractContextManager[psycopg.Connection[Any]]:
    """The owner's connection: the directory is written by the owner alone (ConfigurationError,
    exit 2, when its URL is not set)."""
    settings.owner_url  # noqa: B018 - raises when it is not set
    return writer_connection(settings)
