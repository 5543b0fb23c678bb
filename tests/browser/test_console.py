"""``provisioner console`` in a real browser: Debian's chromium, headless, driven through its
chromedriver by Selenium. A real console process and a real worker on a real database: every
page loads, a live rollout is followed until it finishes without a reload, and actions are
tried without the token (refused, nothing changed) and with it (done, recorded as started by
the console). Screenshots go to docs/images/ (docs/console.md shows them).

A missing browser fails here: ``make test`` installs chromium and chromium-driver first.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from provisioner import service
from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import ROOT, Database, run_cli
from tests.console_server import Console, request, runs_started_by
from tests.integration.test_fleet_upgrade import make_tree
from tests.workers import Workers, job_row, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
]
IMAGES = ROOT / "docs" / "images"
TOKEN = "s3cret-console-token"
HOSTILE = '<script>alert("owned")</script><img src=x onerror=alert(1)>'
TENANTS = ["con_a", "con_b", "con_c", "con_d", "con_e", "con_f"]


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    """One headless chromium for the session, on a fresh profile."""
    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} is missing: `make browser` installs it"
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return replace(settings, heartbeat_seconds=0.5, job_stale_after_seconds=30.0)


def kind_job(database: Database, tenant: str, kind: str) -> dict:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT * FROM control.platform_jobs WHERE tenant_id = %s AND job_type = %s",
            (tenant, kind),
        ).fetchone()
    assert row is not None
    return row


def runs_ended_by(database: Database, job_id: object) -> list[str | None]:
    with psycopg.connect(database.owner_url) as conn:
        rows = conn.execute(
            "SELECT ended_by FROM control.job_runs WHERE job_id = %s ORDER BY run", (job_id,)
        ).fetchall()
    return [r[0] for r in rows]


def fail_job_with_hostile_error(database: Database, tenant: str) -> None:
    """The job failed, with an error text that is markup: as a hostile or broken step could
    leave it (the console must show it as text)."""
    with psycopg.connect(database.owner_url) as conn:
        conn.execute(
            "UPDATE control.platform_jobs SET status = 'failed', error_detail = %s, "
            "finished_at = now() WHERE tenant_id = %s",
            (HOSTILE, tenant),
        )


def all_text(driver: WebDriver, css: str) -> list[str]:
    script = "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText);"
    return [str(t) for t in driver.execute_script(script, css)]


def press(driver: WebDriver, name: str) -> None:
    """Click the button named ``name`` (found again if a live update replaced it), then wait
    for the action's answer."""

    def clicked(d: WebDriver) -> bool:
        try:
            d.find_element(By.NAME, name).click()
        except StaleElementReferenceException:
            return False
        return True

    wait = WebDriverWait(driver, 60, poll_frequency=0.1)
    wait.until(clicked)
    wait.until(lambda d: d.find_elements(By.ID, "message"))


def text(driver: WebDriver, css: str) -> str:
    """The element's text, read in one script call (a live update cannot make it stale)."""
    found = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;", css
    )
    assert found is not None, f"no {css} on {driver.current_url}"
    return re.sub(r"[ \t]+", " ", str(found))


def shot(driver: WebDriver, name: str) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(IMAGES / f"console-{name}.png"))


def no_alert(driver: WebDriver) -> bool:
    try:
        driver.switch_to.alert  # noqa: B018 (the property raises when there is none)
    except NoAlertPresentException:
        return True
    return False


@pytest.mark.slow
def test_every_page_a_live_rollout_and_actions_without_and_with_the_token(
    fast: Settings,
    database: Database,
    tmp_path: Path,
    browser: WebDriver,
    workers: Workers,
    consoles: list[Console],
    tenant_factory: object,
) -> None:
    for tenant in TENANTS:
        tenant_factory(tenant, settings=fast)  # type: ignore[operator]
    service.enqueue(fast, "con_broken")
    fail_job_with_hostile_error(database, "con_broken")
    tree = {migrations.TENANT_TREE_ENV: str(make_tree(tmp_path))}
    console = Console(fast, tmp_path / "console.log", {**tree, "PROVISIONER_CONSOLE_TOKEN": TOKEN})
    consoles.append(console)
    wait = WebDriverWait(
        browser, 60, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]
    )

    # The fleet at a glance; the hostile error is text, and nothing ran.
    browser.get(console.url + "/")
    states = text(browser, "#tenants-by-state")
    assert f"onboarding {len(TENANTS)}" in states or f"active {len(TENANTS)}" in states
    assert "t004" in text(browser, "#tenants-by-head")
    assert HOSTILE in browser.page_source.replace("&lt;", "<").replace("&gt;", ">").replace(
        "&quot;", '"'
    )
    assert HOSTILE in text(browser, "td.detail")
    assert no_alert(browser)
    assert text(browser, "#drifted-count") == "0"  # no check recorded yet
    assert text(browser, "#never-checked") == str(len(TENANTS) + 1)
    assert "never checked" in text(browser, "#last-check")
    shot(browser, "fleet")

    # A rollout queued while no worker runs, followed live once one starts.
    started = run_cli(fast, "upgrade", "--all", env=tree)
    assert started.returncode == 0, started.stderr
    browser.get(console.url + "/rollouts")
    assert f"0 of {len(TENANTS)} done" in text(browser, "#rollout-counts")
    browser.execute_script("window.notReloaded = true;")
    worker = workers.start(env=tree)
    wait.until(
        lambda d: d.find_element(By.ID, "current-rollout").get_attribute("data-finished") == "yes"
    )
    assert f"{len(TENANTS)} of {len(TENANTS)} done" in text(browser, "#rollout-counts")
    assert browser.execute_script("return window.notReloaded === true;")
    assert int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes")) > 0
    assert "t005" in text(browser, "#rollout-history")
    shot(browser, "rollouts")

    # One tenant: every run, attempt and step.
    browser.get(console.url + "/tenants/con_a")
    assert text(browser, "#tenant-state") in ("onboarding", "active")
    assert text(browser, "#tenant-server") == "control"  # no tenant servers in this fleet
    assert "never checked" in text(browser, "#tenant-check")
    started_by = all_text(browser, ".started-by")
    assert started_by[:1] == ["upgrade"] and len(started_by) == len(
        runs_started_by(database, "con_a")
    )
    assert "run_tenant_migrations" in text(browser, "main")
    shot(browser, "tenant")

    # The pool page loads.
    browser.get(console.url + "/pool")
    assert "spares ready" in text(browser, "#pool")
    shot(browser, "pool")

    # The servers page: the control database alone in this fleet.
    browser.get(console.url + "/servers")
    assert "No tenant server is registered" in text(browser, "#no-servers")
    assert text(browser, "#server-control").startswith(f"control default {len(TENANTS) + 1} ")

    # An action without the token: refused, nothing changed.
    browser.get(console.url + "/queue")
    failed_job = job_row(database, "con_broken")
    assert HOSTILE in text(browser, "#failed")
    shot(browser, "queue")
    press(browser, f"retry-{failed_job['id']}")
    assert "log in with the console token first" in text(browser, "#message")
    assert job_row(database, "con_broken")["status"] == "failed"

    # A wrong token, then the right one: a session cookie the page's scripts cannot read.
    browser.get(console.url + "/login")
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.ID, "login-error"))
    assert text(browser, "#login-error") == "wrong token"
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.ID, "logged-in"))
    cookie = browser.get_cookie("provisioner_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert TOKEN not in cookie["value"]
    assert "provisioner_console" not in browser.execute_script("return document.cookie;")

    # The same action with the token: done, and recorded as started by the console.
    browser.get(console.url + "/queue")
    press(browser, f"retry-{failed_job['id']}")
    assert "queued again" in text(browser, "#message")
    assert runs_started_by(database, "con_broken")[-1] == "console"
    wait_until(lambda: job_row(database, "con_broken")["status"] == "succeeded", 60, "the retry")

    # Suspend one tenant from its page.
    browser.get(console.url + "/tenants/con_b")
    press(browser, "suspend")
    assert "tenant con_b is suspended" in text(browser, "#message")
    assert runs_started_by(database, "con_b")[-1] == "console"
    browser.get(console.url + "/tenants/con_b")
    assert text(browser, "#tenant-state") == "suspended"
    assert no_alert(browser)

    # Cancel a queued job (a suspend no worker here drains): its run says who ended it.
    queued = run_cli(fast, "suspend", "con_c", "--queue")
    assert queued.returncode == 0, queued.stderr
    suspend_job = kind_job(database, "con_c", "suspend_tenant")
    browser.get(console.url + "/queue")
    press(browser, f"cancel-{suspend_job['id']}")
    assert "cancelled" in text(browser, "#message")
    assert kind_job(database, "con_c", "suspend_tenant")["status"] == "cancelled"
    assert runs_ended_by(database, suspend_job["id"]) == ["console"]
    browser.get(console.url + "/tenants/con_c")
    assert all_text(browser, ".ended-by") == ["console"]

    # Cross-site requests are refused even with the session cookie: no Origin of ours, or no
    # CSRF token from the page.
    session = f"provisioner_console={cookie['value']}"
    restore = "/tenants/con_b/restore"
    port = console.port
    evil = request(port, "POST", restore, "csrf=x", Cookie=session, Origin="http://evil.example")
    assert evil[0] == 403 and "did not come from the console" in evil[1]
    forged = request(port, "POST", restore, "csrf=forged", Cookie=session, Origin=console.url)
    assert forged[0] == 403 and "CSRF" in forged[1]
    assert text_of_state(database, "con_b") == "suspended"
    assert worker.stop() == 0


def text_of_state(database: Database, tenant: str) -> str:
    with psycopg.connect(database.owner_url) as conn:
        row = conn.execute(
            "SELECT state FROM control.tenants WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_without_a_token_the_console_is_read_only(
    settings: Settings, tmp_path: Path, consoles: list[Console]
) -> None:
    console = Console(settings, tmp_path / "console.log", {})
    consoles.append(console)
    port, origin = console.port, console.url
    status, page, headers = request(port, "GET", "/queue")
    assert status == 200 and "read-only" in page and '<form method="post"' not in page
    assert "default-src 'self'" in headers["content-security-policy"]
    refused = request(port, "POST", "/login", f"token={TOKEN}", Origin=origin)
    assert refused[0] == 403 and "read-only" in refused[1]
    action = request(port, "POST", "/rollouts/abort", Origin=origin)
    assert action[0] == 403 and "read-only" in action[1]
    for path in ("/", "/rollouts", "/pool", "/servers", "/queue?fragment=1"):
        assert request(port, "GET", path)[0] == 200
    assert request(port, "GET", "/tenants/nobody")[0] == 404
    status, page, _ = request(port, "GET", "/tenants/Not%20Valid")
    assert status == 400 and "invalid tenant id" in page.lower()
