"""Which servers a fan-out reaches, and as whom (no server needed: the plan is data)."""

from __future__ import annotations

from provisioner import servers
from provisioner.servers import Directory, ServerStatus, TenantServer

OWNER = "postgresql://provisioner_owner:s3cret@control.example:5432/app"


def server(name: str, status: ServerStatus, reference: str = "host=db dbname=app") -> TenantServer:
    return TenantServer(name, reference, status, None, 1, 0)


FOUND = Directory(
    [
        server("east", ServerStatus.ACTIVE, "service=shard_east"),
        server("gone", ServerStatus.RETIRED),
        server("west", ServerStatus.DRAINING, "host=db-west port=6432 dbname=app"),
    ],
    3,
)


def test_every_server_not_retired_the_control_database_first() -> None:
    plan = servers.targets(FOUND, OWNER)
    assert [(t.name, t.status) for t in plan] == [
        ("control", None),
        ("east", ServerStatus.ACTIVE),
        ("west", ServerStatus.DRAINING),
    ]
    assert plan[0].address == OWNER


def test_the_owners_role_without_its_password_on_a_tenant_server() -> None:
    plan = {t.name: t.address for t in servers.targets(FOUND, OWNER)}
    assert "s3cret" not in plan["east"] + plan["west"]
    assert "user=provisioner_owner" in plan["west"] and "port=6432" in plan["west"]
    assert "service=shard_east" in plan["east"]


def test_only_the_servers_named_none_being_the_control_database() -> None:
    assert [t.name for t in servers.targets(FOUND, OWNER, ["west"])] == ["west"]
    assert [t.name for t in servers.targets(FOUND, OWNER, [None, "east"])] == ["control", "east"]


def test_nothing_to_reach_is_an_empty_fan_out() -> None:
    assert servers.fan_out([], lambda conn, target: 1, application_name="x") == {}
