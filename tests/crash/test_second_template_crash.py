"""The second template (``tests/second_template``) killed with SIGKILL inside each of the six
steps, then provisioned again from its project folder: the job resumes from the last committed
step and the tenant ends exactly as a cleanly provisioned one, every object compared (the
drift inventory: functions, triggers, policies, types, privileges), its seeds applied once.

One database for the module: each case has a tenant of its own beside the clean one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.kinds.provision import STEPS
from provisioner.settings import Settings
from provisioner.tenant import catalog
from tests.conftest import Database, Server
from tests.second_template import (
    copy_project,
    own_database,
    project_env,
    provision,
    record_naming,
)
from tests.workers import job_row, kill_frozen, step_runs

CHILD = Path(__file__).with_name("provision_child.py")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_project(tmp_path_factory.mktemp("second") / "project")


@pytest.fixture(scope="module")
def crash_database(pg_server: Server) -> Iterator[Database]:
    with own_database(pg_server, "c") as database:
        yield database


@pytest.fixture(scope="module")
def crash_settings(crash_database: Database, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        migrations_database_url=crash_database.owner_url,
        app_database_url=crash_database.app_url,
        object_store_provider="none",
        state_dir=tmp_path_factory.mktemp("state"),
    )


@pytest.fixture(scope="module")
def clean(crash_settings: Settings, crash_database: Database, project: Path) -> catalog.Inventory:
    record_naming(crash_settings, project)
    provision(crash_settings, project, "clean")
    with crash_database.owner() as conn:
        found = catalog.read(conn, "helpdesk_clean")
    assert found is not None
    return found


#: After each step's commit, and inside the steps that write the most of this template (the
#: steps after the seed share its transaction when run in one go: killed inside them, the seed
#: step runs again too, as the committed checkpoint says).
KILLS = [(step, "done") for step in STEPS] + [
    (step, "started") for step in ("run_tenant_migrations", "grant_app_rw", "seed_role_profiles")
]


@pytest.mark.parametrize(("step", "outcome"), KILLS, ids=[f"{s}-{o}" for s, o in KILLS])
def test_sigkill_at_each_step_resumes_to_the_clean_tenant(
    crash_settings: Settings,
    crash_database: Database,
    project: Path,
    clean: catalog.Inventory,
    step: str,
    outcome: str,
) -> None:
    tenant = f"killed_{STEPS.index(step)}_{outcome}"
    kill_frozen(crash_settings, CHILD, tenant, step, outcome, env=project_env(project), cwd=project)
    committed = job_row(crash_database, tenant)["steps_completed"]
    assert committed == list(STEPS[: STEPS.index(step) + (outcome == "done")])

    provision(crash_settings, project, tenant)

    row = job_row(crash_database, tenant)
    resumed = [
        (r["step"], r["outcome"]) for r in step_runs(crash_database, tenant) if r["attempt"] == 2
    ]
    if committed == list(STEPS):  # the last step completed the job: nothing to resume
        assert (row["status"], row["attempts"], resumed) == ("succeeded", 1, [])
    else:
        assert (row["status"], row["attempts"]) == ("succeeded", 2)
        assert resumed == [(s, "succeeded") for s in STEPS[len(committed) :]]
    with crash_database.owner() as conn:
        assert catalog.read(conn, f"helpdesk_{tenant}") == clean
        # The seeds' rows are there once, whatever was killed and run again.
        assert conn.execute(f"SELECT count(*) FROM helpdesk_{tenant}.tickets").fetchone() == (1,)
        assert conn.execute(
            "SELECT count(*) FROM control.tenant_seeds WHERE tenant_id = %s", (tenant,)
        ).fetchone() == (3,)
