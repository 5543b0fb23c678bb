"""Tenants on several PostgreSQL servers: the directory in ``control`` (:mod:`.directory`) and
its export for PgBouncer (:mod:`.pgbouncer`), whether the owner reaches each server
(:mod:`.reach`), the tool's own schema on each (:mod:`.journal`: the step journal and the fence)
and the owner's sessions there (:mod:`.sessions`). Placement itself is the control database's
trigger, fired by the enqueue (control revision ``20261202_h29servers``)."""

from provisioner.servers.directory import (
    CONTROL,
    Directory,
    Location,
    ServerLoad,
    ServerStatus,
    TenantServer,
    add,
    connection_reference,
    directory,
    get,
    loads,
    locate,
    server_name,
    servers_of,
    set_status,
)
from provisioner.servers.pgbouncer import databases_section
from provisioner.servers.reach import Reach, reach, reach_active
from provisioner.servers.sessions import (
    Migration,
    ServerSessions,
    migrate_servers,
    require_ready,
)

__all__ = [
    "CONTROL",
    "Directory",
    "Location",
    "Migration",
    "Reach",
    "ServerLoad",
    "ServerSessions",
    "ServerStatus",
    "TenantServer",
    "add",
    "connection_reference",
    "databases_section",
    "directory",
    "get",
    "loads",
    "locate",
    "migrate_servers",
    "reach",
    "reach_active",
    "require_ready",
    "server_name",
    "servers_of",
    "set_status",
]
