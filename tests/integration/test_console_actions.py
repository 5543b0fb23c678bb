"""The console's rollout levers over plain HTTP, on a real console process and a real rollout:
resume after a canary and abort, each recorded in the tenants' history as the console's
(the browser test covers the pages, the login form and the other actions)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from provisioner import queue, service
from provisioner.settings import Settings
from provisioner.templates import migrations
from provisioner.testing import Tenant
from tests.conftest import Database, run_cli
from tests.console_server import Console, request, runs_started_by
from tests.integration.test_fleet_upgrade import make_tree
from tests.workers import job_row

TOKEN = "rollout-lever-token"
TENANTS = ["lever_a", "lever_b", "lever_c"]


def log_in(console: Console) -> tuple[str, str]:
    """The session cookie and the page's CSRF token, as the login form gets them."""
    status, _, headers = request(
        console.port, "POST", "/login", f"token={TOKEN}", Origin=console.url
    )
    assert status == 303
    cookie = headers["set-cookie"].split(";")[0]
    assert "httponly" in headers["set-cookie"].lower()
    assert "samesite=strict" in headers["set-cookie"].lower()
    _, page, _ = request(console.port, "GET", "/rollouts", Cookie=cookie)
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found is not None, page
    return cookie, found.group(1)


def runs_ended_by(database: Database, tenant: str) -> list[str | None]:
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(
            "SELECT r.ended_by FROM control.job_runs r JOIN control.platform_jobs j "
            "ON j.id = r.job_id WHERE j.tenant_id = %s ORDER BY r.run",
            (tenant,),
        ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.slow
def test_resume_after_the_canary_and_abort_from_the_console_are_recorded_as_the_consoles(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    tenant_factory: Callable[..., Tenant],
    consoles: list[Console],
) -> None:
    for tenant in TENANTS:
        tenant_factory(tenant, settings=settings)
    tree = {migrations.TENANT_TREE_ENV: str(make_tree(tmp_path))}
    started = run_cli(settings, "upgrade", "--all", "--canary", "1", env=tree)
    assert started.returncode == 0, started.stderr
    assert run_cli(settings, "worker", "--once", env=tree).returncode == 0

    console = Console(
        settings, tmp_path / "console.log", {**tree, "PROVISIONER_CONSOLE_TOKEN": TOKEN}
    )
    consoles.append(console)
    cookie, csrf = log_in(console)

    status, page, _ = request(
        console.port, "POST", "/rollouts/resume", f"csrf={csrf}", Cookie=cookie, Origin=console.url
    )
    assert status == 200, page
    assert "rollout 1 resumed: 2 tenant(s) queued" in page
    for tenant in TENANTS[1:]:
        assert runs_started_by(database, tenant)[-1] == "console"
        assert job_row(database, tenant)["status"] == "queued"

    status, page, _ = request(
        console.port, "POST", "/rollouts/abort", f"csrf={csrf}", Cookie=cookie, Origin=console.url
    )
    assert status == 200, page
    assert "rollout 1 aborted: 2 job(s) dropped" in page
    for tenant in TENANTS[1:]:
        assert job_row(database, tenant)["status"] == "succeeded"
        assert runs_ended_by(database, tenant) == [None, "console"]
    assert runs_ended_by(database, TENANTS[0]) == [None, None]  # the canary ran to its end

    _, page, _ = request(console.port, "GET", "/rollouts")
    assert "aborted" in page


@pytest.mark.slow
def test_pause_and_resume_from_the_console_need_the_token_and_record_the_console(
    settings: Settings,
    database: Database,
    tmp_path: Path,
    tenant_factory: Callable[..., Tenant],
    consoles: list[Console],
) -> None:
    for tenant in TENANTS:
        tenant_factory(tenant, settings=settings)
    tree = {migrations.TENANT_TREE_ENV: str(make_tree(tmp_path))}
    assert run_cli(settings, "upgrade", "--all", env=tree).returncode == 0
    console = Console(
        settings, tmp_path / "console.log", {**tree, "PROVISIONER_CONSOLE_TOKEN": TOKEN}
    )
    consoles.append(console)
    status, page, _ = request(console.port, "POST", "/rollouts/1/pause", "", Origin=console.url)
    assert status == 403, page  # no session: refused, nothing paused
    assert job_row(database, TENANTS[0])["available_at"].year < 9999

    cookie, csrf = log_in(console)
    _, page, _ = request(console.port, "GET", "/rollouts", Cookie=cookie)
    assert 'action="/rollouts/1/pause"' in page and 'action="/rollouts/resume"' not in page
    status, page, _ = request(
        console.port,
        "POST",
        "/rollouts/1/pause",
        f"csrf={csrf}",
        Cookie=cookie,
        Origin=console.url,
    )
    assert status == 200, page
    assert "rollout 1 paused: 3 queued job(s) held, 0 running job(s) finish" in page
    for tenant in TENANTS:
        assert job_row(database, tenant)["available_at"].year == 9999
    _, page, _ = request(console.port, "GET", "/rollouts", Cookie=cookie)
    assert 'id="rollout-paused">paused by console at' in page
    assert 'action="/rollouts/resume"' in page and 'action="/rollouts/1/pause"' not in page
    status, page, _ = request(
        console.port,
        "POST",
        "/rollouts/1/pause",
        f"csrf={csrf}",
        Cookie=cookie,
        Origin=console.url,
    )
    assert status == 400 and "it is already paused" in page
    status, page, _ = request(
        console.port,
        "POST",
        "/rollouts/x1/pause",
        f"csrf={csrf}",
        Cookie=cookie,
        Origin=console.url,
    )
    assert status == 400 and "a rollout id is a positive number" in page

    status, page, _ = request(
        console.port, "POST", "/rollouts/resume", f"csrf={csrf}", Cookie=cookie, Origin=console.url
    )
    assert status == 200, page
    assert "rollout 1 resumed: 0 tenant(s) queued, 3 released" in page
    assert run_cli(settings, "worker", "--once", env=tree).returncode == 0
    _, page, _ = request(console.port, "GET", "/rollouts")
    assert 'data-state="completed"' in page


def test_a_suspend_of_a_busy_tenant_answers_busy_and_leaves_the_console_free(
    settings: Settings, database: Database, tmp_path: Path, consoles: list[Console]
) -> None:
    """console/app.py BUSY_WAIT_SECONDS: a lifecycle action on a tenant whose other job runs
    under a live holder (a move's copy lasts hours) waits a few seconds, then answers 409
    "busy", the tenant untouched; it used to wait as long as that job, and, the actions running
    one at a time, hold every other action too: here the cancel that frees the tenant."""
    job = service.provision(settings, "busy_t").job
    # its holder live: a session carries its name (queue/claim.py), as an engine's does
    holder = psycopg.connect(database.owner_url, autocommit=True, application_name="other:engine")
    with database.owner() as conn:
        reopened = queue.reopen(conn, job.id, started_by="test")
        assert queue.claim_job(conn, reopened.id, "other:engine") is not None
    console = Console(settings, tmp_path / "console.log", {"PROVISIONER_CONSOLE_TOKEN": TOKEN})
    consoles.append(console)
    status, _, headers = request(
        console.port, "POST", "/login", f"token={TOKEN}", Origin=console.url
    )
    assert status == 303
    cookie = headers["set-cookie"].split(";")[0]
    _, page, _ = request(console.port, "GET", "/tenants/busy_t", Cookie=cookie)
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found is not None and 'action="/tenants/busy_t/suspend"' in page, page
    csrf = found.group(1)

    def post(path: str) -> tuple[int, str]:
        status, page, _ = request(
            console.port, "POST", path, f"csrf={csrf}", Cookie=cookie, Origin=console.url
        )
        return status, page

    with holder:
        status, page = post("/tenants/busy_t/suspend")
        assert status == 409, page
        assert "tenant busy_t is busy: its suspend_tenant job" in page
        assert "is queued, behind another of its jobs" in page
        found = service.status(settings, "busy_t").tenant
        assert found is not None and found.state.value == "onboarding"  # untouched
        status, page = post(f"/jobs/{reopened.id}/cancel")
        assert status == 200, page
    status, page = post("/tenants/busy_t/suspend")
    assert status == 200 and "tenant busy_t is suspended" in page, page
