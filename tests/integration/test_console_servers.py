"""The console's servers page and the fleet page's servers card, over plain HTTP on a real
console process: the control database first, then each tenant server with its status, tenants,
capacity, weight, its tenants' jobs and its reference (escaped). The directory's servers are
never contacted, so their references name hosts and services that need not exist."""

from __future__ import annotations

import html
import re
from pathlib import Path

from provisioner import service
from provisioner.servers import ServerStatus
from provisioner.settings import Settings
from tests.conftest import Database
from tests.console_server import Console, request

#: A reference libpq parses, with markup in it: the page must show it as text.
MARKUP_REFERENCE = "host=127.0.0.1 port=1 dbname=<b>east</b>"

COLUMNS = ("status", "tenants", "capacity", "full", "weight", "queued", "running", "failed", "ref")


def get(console: Console, path: str) -> str:
    status, page, _ = request(console.port, "GET", path)
    assert status == 200, page
    return page


def server_rows(page: str) -> dict[str, dict[str, str]]:
    """The servers table: each row's cells (tags stripped, entities decoded), by server."""
    rows = {}
    for name, body in re.findall(r'<tr id="server-([a-z0-9_]+)"[^>]*>(.*?)</tr>', page, re.S):
        cells = [
            html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
        ]
        assert cells[0] == name
        rows[name] = dict(zip(COLUMNS, cells[1:], strict=True))
    return rows


def set_job(database: Database, tenant: str, status: str) -> None:
    with database.owner() as conn:
        conn.execute(
            "UPDATE control.platform_jobs SET status = %s WHERE tenant_id = %s", (status, tenant)
        )


def test_the_servers_page_lists_the_control_database_then_each_server(
    settings: Settings, database: Database, tmp_path: Path, consoles: list[Console]
) -> None:
    service.enqueue(settings, "home_a")  # no server yet: the control database
    service.enqueue(settings, "home_b")
    set_job(database, "home_b", "failed")
    console = Console(settings, tmp_path / "console.log", {})
    consoles.append(console)

    page = get(console, "/servers")
    assert 'href="/servers" class="here"' in page
    assert "No tenant server is registered" in page
    control = {
        "status": "default",
        "tenants": "2",
        "capacity": "-",
        "full": "-",
        "weight": "-",
        "queued": "1",
        "running": "0",
        "failed": "1",
        "ref": "the control database",
    }
    assert server_rows(page) == {"control": control}
    assert 'id="servers-card"' not in get(console, "/")

    service.add_server(settings, "east", MARKUP_REFERENCE, capacity=4)
    service.add_server(settings, "west", "service=west_unused", weight=2)
    for tenant in ("east_a", "east_b", "east_c"):
        service.enqueue(settings, tenant, server="east")
    set_job(database, "east_b", "running")
    set_job(database, "east_c", "succeeded")
    service.set_server_status(settings, "west", ServerStatus.DRAINING)

    page = get(console, "/servers")
    assert "No tenant server is registered" not in page
    assert server_rows(page) == {
        "control": control,
        "east": {
            "status": "active",
            "tenants": "3",
            "capacity": "4",
            "full": "75%",
            "weight": "1",
            "queued": "1",
            "running": "1",
            "failed": "0",
            "ref": MARKUP_REFERENCE,
        },
        "west": {
            "status": "draining",
            "tenants": "0",
            "capacity": "-",
            "full": "-",
            "weight": "2",
            "queued": "0",
            "running": "0",
            "failed": "0",
            "ref": "service=west_unused",
        },
    }
    assert "<b>east</b>" not in page and "dbname=&lt;b&gt;east&lt;/b&gt;" in page
    # The live part alone, as live.js fetches it.
    fragment = get(console, "/servers?fragment=1")
    assert "<html" not in fragment and set(server_rows(fragment)) == {"control", "east", "west"}

    fleet = get(console, "/")
    card = re.search(r'<table id="servers-by-status">(.*?)</table>', fleet, re.S)
    assert card is not None, fleet
    assert re.findall(r"<td>(\w+)</td><td class=\"num\">(\d+)</td>", card.group(1)) == [
        ("active", "1"),
        ("draining", "1"),
    ]
    assert "2 tenant(s) on the control database" in fleet
