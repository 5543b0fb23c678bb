"""``provisioner servers``: the directory of tenant servers (add, list, drain, retire, ...), its
PgBouncer export, and ``provisioner locate``: where a tenant lives.

Exit codes: 0 done; 1 ``servers check`` found a server the owner cannot use; 2 a bad name,
reference, number, or a server that cannot be retired yet; 3 an unknown server or tenant.
"""

from __future__ import annotations

import sys

import click

from provisioner import servers, service
from provisioner.cli.options import settings_of
from provisioner.cli.render import emit_json, fail_cleanly
from provisioner.db.conninfo import libpq_address

#: After ``servers add``: new tenants are placed there from now on, and their jobs need the
#: tool's schema there (a worker refuses to start while an active server lacks it).
ADDED_NEXT = (
    "next: `provisioner migrate` (the tool's schema on {name}: new tenants are placed there "
    "from now on), then `provisioner servers check`; `provisioner servers drain {name}` "
    "takes it out of placement meanwhile"
)

CAPACITY = click.IntRange(0, 1_000_000_000)
WEIGHT = click.IntRange(1, 1_000_000)


@click.group("servers")
def servers_group() -> None:
    """The tenant servers: where new tenants go, and where each tenant lives."""


@servers_group.command("add")
@click.argument("name")
@click.argument("reference")
@click.option("--capacity", type=CAPACITY, default=None, help="At most this many tenants.")
@click.option("--weight", type=WEIGHT, default=1, help="Its share of new tenants.")
@click.option("--json", "as_json", is_flag=True, help="Print the server as one JSON object.")
@click.pass_context
@fail_cleanly
def servers_add(
    ctx: click.Context,
    name: str,
    reference: str,
    capacity: int | None,
    weight: int,
    as_json: bool,
) -> None:
    """Add server NAME, reached by REFERENCE: a libpq service name, or a conninfo or URL
    without a password (it comes from ~/.pgpass, PGPASSWORD or the service file)."""
    added = service.add_server(settings_of(ctx), name, reference, capacity=capacity, weight=weight)
    if as_json:
        emit_json(added.view())
    else:
        click.echo(f"tenant server {added.name} added ({added.conninfo}), active")
        click.echo(ADDED_NEXT.format(name=added.name), err=True)


@servers_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of servers.")
@click.pass_context
@fail_cleanly
def servers_list(ctx: click.Context, as_json: bool) -> None:
    """Every tenant server with its status, tenants, capacity and weight; the control
    database (the default server) first."""
    found = service.list_servers(settings_of(ctx))
    if as_json:
        control = {"name": servers.CONTROL, "conninfo": None, "status": "default"}
        emit_json([{**control, "tenants": found.on_control}] + [s.view() for s in found.servers])
        return
    click.echo(
        f"{'SERVER':<20} {'STATUS':<9} {'TENANTS':>8} {'CAPACITY':>9} {'WEIGHT':>6}  REFERENCE"
    )
    click.echo(f"{servers.CONTROL:<20} {'default':<9} {found.on_control:>8} {'-':>9} {'-':>6}  -")
    for s in found.servers:
        capacity = "-" if s.capacity is None else str(s.capacity)
        click.echo(
            f"{s.name:<20} {s.status.value:<9} {s.placed:>8} {capacity:>9} {s.weight:>6}  "
            f"{s.conninfo}"
        )


def _status_command(name: str, status: servers.ServerStatus, text: str) -> None:
    @servers_group.command(name, help=text)
    @click.argument("server")
    @click.option("--json", "as_json", is_flag=True, help="Print the server as one JSON object.")
    @click.pass_context
    @fail_cleanly
    def command(ctx: click.Context, server: str, as_json: bool) -> None:
        changed = service.set_server_status(settings_of(ctx), server, status)
        if as_json:
            emit_json(changed.view())
        else:
            click.echo(f"tenant server {changed.name} is {changed.status.value}")


_status_command(
    "drain",
    servers.ServerStatus.DRAINING,
    "SERVER takes no new tenants (it is being emptied); its tenants stay and run.",
)
_status_command(
    "full",
    servers.ServerStatus.FULL,
    "SERVER takes no new tenants (kept as it is); its tenants stay and run.",
)
_status_command(
    "retire",
    servers.ServerStatus.RETIRED,
    "SERVER is out of use; refused (exit 2) while it still holds tenants.",
)
_status_command(
    "activate",
    servers.ServerStatus.ACTIVE,
    "SERVER takes new tenants again.",
)


@servers_group.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one per server.")
@click.pass_context
@fail_cleanly
def servers_check(ctx: click.Context, as_json: bool) -> None:
    """Connect to each active server as the owner (the role its reference names, else the
    owner URL's; the password from ~/.pgpass, PGPASSWORD or the service file). Exit 0 when
    each is reached as an ordinary role, 1 otherwise."""
    found = service.check_servers(settings_of(ctx))
    if as_json:
        emit_json([r.view() for r in found])
    else:
        for r in found:
            click.echo(
                f"{r.server}: {'ok' if r.ok else 'NOT OK'} ({r.problem or 'as ' + str(r.role)})"
            )
        if not found:
            click.echo("no active tenant server")
    sys.exit(0 if all(r.ok for r in found) else 1)


@servers_group.command("pgbouncer")
@click.pass_context
@fail_cleanly
def servers_pgbouncer(ctx: click.Context) -> None:
    """Print a [databases] section for pgbouncer.ini: one entry per server not retired, and
    one for the control database, named as `provisioner locate` names them."""
    settings = settings_of(ctx)
    found = service.list_servers(settings)
    click.echo(servers.databases_section(found, libpq_address(settings.app_url)), nl=False)


@click.command()
@click.argument("tenant_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
@fail_cleanly
def locate(ctx: click.Context, tenant_id: str, as_json: bool) -> None:
    """Print the server TENANT_ID lives on, and its connection reference. Exit 3 if the tenant
    is unknown."""
    found = service.locate(settings_of(ctx), tenant_id)
    if as_json:
        emit_json(found.view())
    else:
        click.echo(f"{found.server}  {found.conninfo or '(the control database)'}")
