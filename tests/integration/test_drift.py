"""``provisioner check``: each kind of object a template can create, altered by hand in a real
tenant, is reported per tenant as missing, extra or altered; a suspended tenant is expected
without the application role's privileges; a dropped schema or version table is drift; the
expected schema is built under a name no tenant maps to; a silent or unreachable server fails
``check`` in one line instead of hanging it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from provisioner import service
from provisioner.errors import InvalidInput
from provisioner.kinds import lifecycle
from provisioner.kinds.repair import REPAIR_JOB_TYPE
from provisioner.models import TenantId
from provisioner.naming import TenantNaming
from provisioner.settings import Settings
from provisioner.templates import expected, migrations
from provisioner.testing import Tenant
from provisioner.worker.metrics import FleetCollector
from tests.conftest import Database, run_cli, settings_env
from tests.console_server import Console, request
from tests.integration.test_fleet_upgrade import make_tree

Make = Callable[..., Tenant]


@pytest.fixture
def make(tenant_factory: Make, settings: Settings) -> Callable[[str], str]:
    """Provision a tenant in the test's own database; returns its schema."""

    def provision(tenant_id: str) -> str:
        tenant_factory(tenant_id, settings=settings)
        return f"tenant_{tenant_id}"

    return provision


def check_json(settings: Settings, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli(settings, "check", *args, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def findings(view: dict[str, Any], tenant_id: str) -> set[tuple[str, str, str]]:
    (tenant,) = [t for t in view["tenants"] if t["tenant_id"] == tenant_id]
    return {(f["change"], f["kind"], f["name"]) for f in tenant["findings"]}


def by_hand(database: Database, *statements: str, superuser: bool = False) -> None:
    """Statements run as the owner role (or as the cluster's superuser, as a DBA would)."""
    url = database.admin_url if superuser else database.owner_url
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def test_a_clean_fleet_is_clean_and_the_expected_schema_leaves_no_trace(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    make("alpha")
    make("beta")
    result = run_cli(settings, "check", "--all")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 tenant(s) checked: 2 clean" in result.stdout
    with database.owner() as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'tenant\\_pg\\_%%'"
        ).fetchone()
    assert left == (0,)


# One case per kind of object the issue names: (statements, the finding each must produce).
# {s} is the tenant's schema.
CASES: dict[str, tuple[list[str], set[tuple[str, str, str]]]] = {
    "trigger and its function": (
        [
            "CREATE FUNCTION {s}.stamp() RETURNS trigger LANGUAGE plpgsql "
            "AS $$BEGIN NEW.display_name := 'x'; RETURN NEW; END$$",
            "CREATE TRIGGER stamp BEFORE INSERT ON {s}.members "
            "FOR EACH ROW EXECUTE FUNCTION {s}.stamp()",
        ],
        {("extra", "function", "stamp()"), ("extra", "trigger", "members.stamp")},
    ),
    "function": (
        ["CREATE FUNCTION {s}.answer(n integer) RETURNS integer LANGUAGE sql AS 'SELECT 42'"],
        {("extra", "function", "answer(n integer)")},
    ),
    "row-level security with a policy USING (false)": (
        [
            "ALTER TABLE {s}.members ENABLE ROW LEVEL SECURITY",
            "CREATE POLICY nobody ON {s}.members USING (false)",
        ],
        {("altered", "table", "members"), ("extra", "policy", "members.nobody")},
    ),
    "forced row-level security": (
        ["ALTER TABLE {s}.datasets FORCE ROW LEVEL SECURITY"],
        {("altered", "table", "datasets")},
    ),
    "a column grant to PUBLIC": (
        ["GRANT SELECT (email) ON {s}.members TO PUBLIC"],
        {("extra", "privilege", "SELECT ON COLUMN members.email TO PUBLIC")},
    ),
    "an enum type": (
        ["CREATE TYPE {s}.mood AS ENUM ('happy', 'sad')"],
        {("extra", "type", "mood")},
    ),
    "a DO INSTEAD NOTHING rule": (
        ["CREATE RULE keep_all AS ON DELETE TO {s}.members DO INSTEAD NOTHING"],
        {("extra", "rule", "members.keep_all")},
    ),
    "a sequence with MAXVALUE 10": (
        ["ALTER SEQUENCE {s}.members_id_seq MAXVALUE 10"],
        {("altered", "sequence", "members_id_seq")},
    ),
    "a missing column": (
        ["ALTER TABLE {s}.datasets DROP COLUMN description"],
        {("missing", "column", "datasets.description")},
    ),
    "a hand-made index and a dropped one": (
        [
            "CREATE INDEX hand_made_idx ON {s}.audit_events (action)",
            "DROP INDEX {s}.audit_events_actor_idx",
        ],
        {("extra", "index", "hand_made_idx"), ("missing", "index", "audit_events_actor_idx")},
    ),
    "a revoked grant and a lost default privilege": (
        [
            "REVOKE DELETE ON {s}.members FROM app_rw",
            "ALTER DEFAULT PRIVILEGES IN SCHEMA {s} REVOKE DELETE ON TABLES FROM app_rw",
        ],
        {
            ("missing", "privilege", "DELETE ON TABLE members TO app_rw"),
            (
                "missing",
                "default privilege",
                "DELETE ON TABLES TO app_rw (FOR ROLE provisioner_owner)",
            ),
        },
    ),
    "a dropped constraint and a changed default": (
        [
            "ALTER TABLE {s}.members DROP CONSTRAINT members_status_check",
            "ALTER TABLE {s}.members ALTER COLUMN status SET DEFAULT 'active'",
        ],
        {
            ("missing", "constraint", "members.members_status_check"),
            ("altered", "column", "members.status"),
        },
    ),
    "a view, a domain and a composite type": (
        [
            "CREATE VIEW {s}.active_members AS SELECT id, email FROM {s}.members",
            "CREATE DOMAIN {s}.email AS text CHECK (VALUE LIKE '%@%')",
            "CREATE TYPE {s}.pair AS (a integer, b text)",
        ],
        {
            ("extra", "view", "active_members"),
            ("extra", "type", "email"),  # its CHECK constraint counted with it
            ("extra", "type", "pair"),
        },
    ),
    "an owner changed": (
        ["ALTER TABLE {s}.tenant_settings OWNER TO app_rw"],
        {("altered", "table", "tenant_settings")},
    ),
}


#: Cases the owner role cannot make itself (it is no member of app_rw): a DBA's change.
AS_SUPERUSER = {"an owner changed"}


@pytest.mark.parametrize("case", list(CASES))
def test_each_kind_of_object_altered_by_hand_is_reported(
    settings: Settings, database: Database, make: Callable[[str], str], case: str
) -> None:
    statements, wanted = CASES[case]
    schema = make("tinkered")
    make("untouched")
    by_hand(database, *(s.format(s=schema) for s in statements), superuser=case in AS_SUPERUSER)

    code, view = check_json(settings, "--all")
    assert code == 1, view
    assert wanted <= findings(view, "tinkered"), findings(view, "tinkered")
    assert findings(view, "untouched") == set()
    assert view["counts"]["drifted"] == 1 and view["counts"]["clean"] == 1
    (tinkered,) = [t for t in view["tenants"] if t["tenant_id"] == "tinkered"]
    assert sum(tinkered["counts"].values()) >= len(wanted)
    for finding in tinkered["findings"]:  # named objects, never catalog rows
        assert set(finding) <= {"change", "kind", "name", "table", "changes", "objects_within"}


def test_the_text_report_groups_findings_per_tenant_with_what_changed(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    schema = make("tinkered")
    by_hand(
        database,
        f"ALTER SEQUENCE {schema}.members_id_seq MAXVALUE 10",
        f"CREATE TABLE {schema}.scratch (id int PRIMARY KEY, note text)",
        f"ALTER TABLE {schema}.datasets DROP COLUMN description",
    )
    result = run_cli(settings, "check", "tinkered")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert "tinkered: drifted (1 missing, 1 extra, 1 altered; compared with the template head)" in (
        lines
    )
    assert "  missing  column datasets.description" in lines
    assert "  altered  sequence members_id_seq: maxvalue 9223372036854775807 -> 10" in lines
    # the hand-made table's columns, constraint, index and privileges go with it
    (extra,) = [line for line in lines if "extra    table scratch" in line]
    assert "object(s) of it" in extra


def test_a_suspended_tenant_is_expected_without_the_application_roles_privileges(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    schema = make("paused")
    service.change_lifecycle(settings, "paused", lifecycle.SUSPEND_JOB_TYPE)
    code, view = check_json(settings, "paused")
    assert code == 0, view
    (paused,) = view["tenants"]
    assert (paused["state"], paused["lifecycle"]) == ("clean", "suspended")
    assert paused["expected"] == "no application access (suspended)"

    by_hand(database, f"GRANT SELECT ON {schema}.members TO app_rw")  # access back by hand
    code, view = check_json(settings, "paused")
    assert code == 1
    assert findings(view, "paused") == {("extra", "privilege", "SELECT ON TABLE members TO app_rw")}


def test_a_dropped_schema_or_version_table_of_a_provisioned_tenant_is_drift(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    gone = make("gone")
    unversioned = make("unversioned")
    emptied = make("emptied")
    make("fine")
    by_hand(
        database,
        f"DROP SCHEMA {gone} CASCADE",
        f"DROP TABLE {unversioned}.alembic_version",
        f"DELETE FROM {emptied}.alembic_version",
    )
    code, view = check_json(settings, "--all")
    assert code == 1
    states = {t["tenant_id"]: t["state"] for t in view["tenants"]}
    assert states == {
        "gone": "drifted",
        "unversioned": "drifted",
        "emptied": "drifted",
        "fine": "clean",
    }
    assert findings(view, "gone") == {("missing", "schema", "tenant_gone")}
    assert ("missing", "table", "alembic_version") in findings(view, "unversioned")
    assert findings(view, "emptied") == {("missing", "version", "alembic_version")}
    text = run_cli(settings, "check", "gone")
    assert text.returncode == 1 and "  missing  schema tenant_gone" in text.stdout


def test_a_tenant_named_like_the_old_scratch_schema_is_compared_not_copied(
    settings: Settings, database: Database, make: Callable[[str], str]
) -> None:
    """Item 8: the expected schema was ``tenant_zz_drift_expected``, a real tenant's name; the
    check then compared every tenant with that live (and drifted) tenant."""
    squatter = make("zz_drift_expected")
    make("other")
    by_hand(database, f"CREATE INDEX hand_made_idx ON {squatter}.audit_events (action)")
    code, view = check_json(settings, "--all")
    assert code == 1
    assert findings(view, "zz_drift_expected") == {("extra", "index", "hand_made_idx")}
    assert findings(view, "other") == set()
    with database.owner() as conn:  # the tenant's schema is untouched
        count = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND indexname = 'hand_made_idx'",
            (squatter,),
        ).fetchone()
    assert count == (1,)
    # no tenant id maps to the scratch schema's name
    scratch = expected.scratch_name()
    assert TenantId("acme").naming.tenant_of(scratch) is None
    with pytest.raises(InvalidInput):  # nor could a tenant's schema be named so
        TenantId(scratch.removeprefix("tenant_"), TenantNaming("{id}"))


def test_check_refuses_bad_input_and_unknown_tenants(
    settings: Settings, make: Callable[[str], str]
) -> None:
    make("known")
    assert run_cli(settings, "check", "ghost").returncode == 3
    assert run_cli(settings, "check").returncode == 2
    assert run_cli(settings, "check", "Bad-Id").returncode == 2
    assert run_cli(settings, "check", "known", "--all").returncode == 2


def test_a_purged_tenant_is_out_of_check_all(
    settings: Settings, make: Callable[[str], str]
) -> None:
    make("kept")
    make("purged")
    service.change_lifecycle(settings, "purged", lifecycle.PURGE_JOB_TYPE)
    code, view = check_json(settings, "--all")
    assert code == 0, view
    assert [t["tenant_id"] for t in view["tenants"]] == ["kept"]
    code, view = check_json(settings, "purged")
    assert code == 0 and view["tenants"][0]["state"] == "deleted"


# -- a silent or unreachable server (item 10) --------------------------------------------------


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("server", ["silent", "unreachable"])
def test_check_all_fails_in_one_line_on_a_silent_or_unreachable_server(
    settings: Settings, silent_listener: int, server: str
) -> None:
    port = silent_listener if server == "silent" else unused_port()
    url = f"postgresql://provisioner_owner@127.0.0.1:{port}/provisioner"
    env = settings_env(settings) | {
        "MIGRATIONS_DATABASE_URL": url,
        "APP_DATABASE_URL": url.replace("provisioner_owner", "app_rw"),
    }
    # A hang fails the test at the timeout (the connect timeout is 5 s per connection).
    result = subprocess.run(
        [sys.executable, "-m", "provisioner", "check", "--all"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert "timeout expired" in errors[0] or "unavailable" in errors[0], errors[0]
    assert result.stdout == ""


def test_a_tenant_behind_the_head_is_reported_behind_not_drifted(
    settings: Settings,
    make: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make("older")
    monkeypatch.setenv(migrations.TENANT_TREE_ENV, str(make_tree(tmp_path)))
    report = service.check(settings, ["older"])
    assert [(t.tenant_id, t.state.value) for t in report.tenants] == [("older", "behind")]
    result = run_cli(
        settings, "check", "older", env={migrations.TENANT_TREE_ENV: str(make_tree(tmp_path / "b"))}
    )
    assert result.returncode == 0, result.stderr
    assert "older: behind (at t004; see `provisioner upgrade`)" in result.stdout


def stored_checks(database: Database) -> dict[str, tuple[Any, ...]]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT tenant_id, outcome, missing, extra, altered, summary, checked_by "
            "FROM control.tenant_checks ORDER BY tenant_id"
        ).fetchall()
    return {str(r[0]): tuple(r[1:]) for r in rows}


def fleet_page(console: Console) -> str:
    status, page, _ = request(console.port, "GET", "/")
    assert status == 200, page
    return page


def test_each_check_is_stored_and_the_fleet_page_and_metrics_count_the_drifted(
    settings: Settings,
    database: Database,
    make: Callable[[str], str],
    tmp_path: Path,
    consoles: list[Console],
) -> None:
    """``check`` records each tenant's outcome, counts and summary; the repair job records what
    it left; the console's fleet page and the metrics show the drifted count, the tenants never
    checked, and the time of the last check."""
    for tenant in ("chk_clean", "chk_bad", "chk_never"):
        make(tenant)
    bad = "tenant_chk_bad"
    by_hand(database, f"REVOKE INSERT ON {bad}.audit_events FROM app_rw")
    console = Console(settings, tmp_path / "console.log", {})
    consoles.append(console)
    page = fleet_page(console)
    assert '<span id="drifted-count" class="num">0</span> drifted' in page
    assert '<span id="never-checked">3</span> never checked' in page
    assert "never checked: <code>provisioner check --all</code>" in page

    assert run_cli(settings, "check", "chk_clean", "chk_bad").returncode == 1
    missing = "missing privilege INSERT ON TABLE audit_events TO app_rw"
    assert stored_checks(database) == {
        "chk_bad": ("drifted", 1, 0, 0, f"1 missing: {missing}", "check"),
        "chk_clean": ("clean", 0, 0, 0, "", "check"),
    }
    figures = service.overview(settings).drift
    assert figures.tenants == {
        "clean": 1,
        "drifted": 1,
        "behind": 0,
        "not provisioned": 0,
        "never checked": 1,
    }
    assert figures.last_checked_at is not None
    page = fleet_page(console)
    assert '<span id="drifted-count" class="num">1</span> drifted' in page
    assert '<span id="never-checked">1</span> never checked' in page
    assert "last check " + figures.last_checked_at.strftime("%Y-%m-%d %H:%M:%S") in page
    collector = FleetCollector(settings, "test-scrape")
    try:
        scraped = {
            (family.name, tuple(sample.labels.values())): sample.value
            for family in collector.collect()
            for sample in family.samples
        }
    finally:
        collector.close()
    assert scraped[("provisioner_tenants_checked", ("drifted",))] == 1
    assert scraped[("provisioner_tenants_checked", ("never checked",))] == 1
    last = scraped[("provisioner_drift_last_check_timestamp_seconds", ())]
    assert last == figures.last_checked_at.timestamp()

    # The repair job records what it left (nothing) in its step's transaction.
    assert run_cli(settings, "repair", "chk_bad", "--queue").returncode == 0
    assert stored_checks(database)["chk_bad"][0::5] == ("drifted", "repair")
    env = {"PROVISIONER_WORKER_JOB_TYPES": REPAIR_JOB_TYPE}
    assert run_cli(settings, "worker", "--once", env=env).returncode == 0
    assert stored_checks(database)["chk_bad"] == ("clean", 0, 0, 0, "", "repair_tenant job")
    assert '<span id="drifted-count" class="num">0</span> drifted' in fleet_page(console)

    # check --all covers every tenant; a purged one leaves the figures.
    assert run_cli(settings, "check", "--all").returncode == 0
    assert set(stored_checks(database)) == {"chk_bad", "chk_clean", "chk_never"}
    assert run_cli(settings, "deprovision", "--purge", "--yes", "chk_never").returncode == 0
    assert sum(service.overview(settings).drift.tenants.values()) == 2


def test_status_shows_the_last_stored_check_to_the_owner_and_omits_it_for_app_rw(
    make: Callable[[str], str], settings: Settings, database: Database
) -> None:
    make("st_chk")
    before = run_cli(settings, "status", "st_chk", "--json")
    assert before.returncode == 0, before.stderr
    assert "last_check" not in json.loads(before.stdout)  # never checked
    by_hand(database, "CREATE INDEX st_idx ON tenant_st_chk.audit_events (action)")
    assert run_cli(settings, "check", "st_chk").returncode == 1

    shown = json.loads(run_cli(settings, "status", "st_chk", "--json").stdout)
    assert shown["last_check"]["outcome"] == "drifted"
    assert shown["last_check"]["checked_at"] is not None
    assert "extra index st_idx" in shown["last_check"]["summary"]
    text = run_cli(settings, "status", "st_chk")
    assert text.returncode == 0 and "check     drifted at " in text.stdout
    # The application role may not read control.tenant_checks: its status simply has none.
    app_only = {"MIGRATIONS_DATABASE_URL": ""}
    plain = run_cli(settings, "status", "st_chk", "--json", env=app_only)
    assert plain.returncode == 0, plain.stderr
    assert "last_check" not in json.loads(plain.stdout)
    with database.app() as conn:
        assert service.status_on(conn, TenantId("st_chk")).last_check is None
    with database.owner() as conn:
        found = service.status_on(conn, TenantId("st_chk")).last_check
    assert found is not None and (found.outcome, found.extra) == ("drifted", 1)
