"""suspend, restore and deprovision (one tenant, a batch, ``--purge``) refuse a configured tenant
naming other than the one the control database records, as the worker and ``provision`` do:
one line, exit 2, and nothing changed (no job, no state, the schema and its grants as they
were). A command under another naming would name existing tenants' schemas another way."""

from __future__ import annotations

import re
from typing import Any

import pytest

from provisioner import service
from provisioner.errors import ConfigurationError
from provisioner.kinds import lifecycle
from provisioner.settings import Settings
from tests.conftest import Database, fingerprint, run_cli
from tests.integration.test_schema_pattern import RULE

COMMANDS = [
    pytest.param(("suspend", "zulu"), "active", id="suspend"),
    pytest.param(("suspend", "zulu", "yankee"), "active", id="suspend-batch"),
    pytest.param(("suspend", "--state", "active"), "active", id="suspend-by-state"),
    pytest.param(("restore", "zulu"), "suspended", id="restore"),
    pytest.param(("deprovision", "zulu"), "active", id="deprovision"),
    pytest.param(("deprovision", "zulu", "--purge", "--yes"), "active", id="purge"),
    pytest.param(("suspend", "zulu", "--queue"), "active", id="suspend-queued"),
]


def snapshot(database: Database) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every tenant row and every job row, as they are."""
    with database.owner() as conn:
        tenants = conn.execute(
            "SELECT tenant_id, schema_name, state FROM control.tenants ORDER BY 1"
        ).fetchall()
        jobs = conn.execute(
            "SELECT id, job_type, status, steps_completed, attempts FROM control.platform_jobs "
            "ORDER BY id"
        ).fetchall()
    return tenants, jobs


RECORDED = re.escape("names tenant schemas 'tenant_{id}'")


@pytest.mark.parametrize(("args", "state"), COMMANDS)
def test_a_lifecycle_command_refuses_a_naming_the_control_database_does_not_record(
    settings: Settings, database: Database, args: tuple[str, ...], state: str
) -> None:
    for tenant in ("zulu", "yankee"):
        assert service.provision(settings, tenant).job.status.value == "succeeded"
    if state == "suspended":
        for tenant in ("zulu", "yankee"):
            service.change_lifecycle(settings, tenant, lifecycle.SUSPEND_JOB_TYPE)
    before, shape = snapshot(database), fingerprint(database, "zulu")

    refused = run_cli(settings, *args, env=RULE)  # recorded: the default naming, tenant_{id}
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, (refused.stdout, refused.stderr)
    assert "acct_{id}_data" in lines[0] and "provisioner migrate" in lines[0], lines
    assert snapshot(database) == before
    assert fingerprint(database, "zulu") == shape  # the schema and its grants untouched

    done = run_cli(settings, *args)  # the recorded naming: the command runs
    assert done.returncode == 0, done.stderr


def test_the_library_refuses_too(
    settings: Settings, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert service.provision(settings, "zulu").job.status.value == "succeeded"
    before = snapshot(database)
    for name, value in RULE.items():
        monkeypatch.setenv(name, value)
    for job_type in (lifecycle.SUSPEND_JOB_TYPE, lifecycle.DEPROVISION_JOB_TYPE):
        with pytest.raises(ConfigurationError, match=RECORDED):
            service.change_lifecycle(settings, "zulu", job_type)
        with pytest.raises(ConfigurationError, match=RECORDED):
            service.change_lifecycle_many(settings, job_type, ["zulu"])
    assert snapshot(database) == before
