"""What ``upgrade --all`` keeps of the tenant servers' versions it began reading with its call
(:class:`provisioner.fleet.versions.PlacedVersions`): only what was read where the call's own
placement says each tenant lives (no server needed: the reads are data)."""

from __future__ import annotations

from provisioner.fleet.versions import PlacedVersions, ServerVersions

HEAD = frozenset({"t005"})
OLD = frozenset({"t004"})

EARLY = PlacedVersions(
    placed={"e1": "east", "e2": "east", "w1": "west", "m1": "east"},
    read=ServerVersions(
        {"tenant_e1": HEAD, "tenant_e2": OLD, "tenant_m1": OLD},
        {"west": "connection refused"},
    ),
)


def test_the_versions_read_where_the_tenant_still_lives_are_kept() -> None:
    placed = {"e1": "east", "e2": "east", "w1": "west", "m1": "east"}
    kept, again = EARLY.of(placed, ["e1", "e2", "w1", "home1"])
    assert kept.found == {"tenant_e1": HEAD, "tenant_e2": OLD}
    assert kept.down == {"west": "connection refused"}  # w1's server, named once
    assert again == []  # home1 lives on the control database: read there, not here


def test_a_tenant_moved_since_the_early_read_is_read_again_on_its_new_server() -> None:
    """m1 was read on east, its move's source: the version there is not the tenant's."""
    placed = {"e1": "east", "e2": "east", "w1": "west", "m1": "west", "n1": "east"}
    kept, again = EARLY.of(placed, ["e1", "m1", "n1"])
    assert "tenant_m1" not in kept.found
    assert again == ["m1", "n1"]  # n1 was placed after the early read
    assert kept.down == {}  # west holds m1 now, but m1 is read again, not reported down


def test_a_server_down_with_none_of_the_tenants_asked_for_is_not_reported() -> None:
    kept, again = EARLY.of({"e1": "east", "w1": "west"}, ["e1"])
    assert kept.down == {} and again == []
