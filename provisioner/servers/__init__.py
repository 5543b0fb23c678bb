"""Tenants on several PostgreSQL servers: the directory in ``control`` (:mod:`.directory`) and
its export for PgBouncer (:mod:`.pgbouncer`), whether the owner reaches each server
(:mod:`.reach`), the tool's own schema on each (:mod:`.journal`: the step journal and the fence)
and the owner's sessions there (:mod:`.sessions`), the fleet commands' bounded fan-out over the
servers (:mod:`.fanout`), the journals' retention (:mod:`.retention`), and the record of a
tenant's move between them (:mod:`.moves`). Placement itself is the control database's trigger,
fired by the enqueue (control revision ``20261202_h29servers``)."""

from provisioner.servers.directory import (
    CONTROL,
    Directory,
    Location,
    ServerLoad,
    ServerStatus,
    TenantServer,
    add,
    connection_reference,
    control_placement_problem,
    directory,
    get,
    loads,
    locate,
    placement_name,
    server_name,
    servers_of,
    set_status,
)
from provisioner.servers.fanout import SERVERS_AT_ONCE, Reached, Target, fan_out, targets
from provisioner.servers.pgbouncer import databases_section
from provisioner.servers.reach import Reach, reach, reach_active
from provisioner.servers.retention import JournalPruned, prune_journals
from provisioner.servers.sessions import (
    Migration,
    ServerSessions,
    migrate_servers,
    require_ready,
)

__all__ = [
    "CONTROL",
    "SERVERS_AT_ONCE",
    "Directory",
    "JournalPruned",
    "Location",
    "Migration",
    "Reach",
    "Reached",
    "ServerLoad",
    "ServerSessions",
    "ServerStatus",
    "Target",
    "TenantServer",
    "add",
    "connection_reference",
    "control_placement_problem",
    "databases_section",
    "directory",
    "fan_out",
    "get",
    "loads",
    "locate",
    "migrate_servers",
    "placement_name",
    "prune_journals",
    "reach",
    "reach_active",
    "require_ready",
    "server_name",
    "servers_of",
    "set_status",
    "targets",
]
