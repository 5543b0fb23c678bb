"""History rows as frozen records: built from the journal's rows, rendered by the CLI with the
same keys and values the dicts had, and still readable by key (the public TenantStatus)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from provisioner.cli.render import history_line, job_run_view, json_default, run_view
from provisioner.queue import JobRunRecord, StepRunOutcome, StepRunRecord

STARTED = datetime(2026, 8, 1, 12, 0, 0, tzinfo=UTC)
JOB_ID = uuid4()
STEP_ROW = {
    "id": 7,
    "job_id": JOB_ID,
    "tenant_id": "acme",
    "run": 2,
    "attempt": 1,
    "step": "create_schema",
    "worker": "w1",
    "started_at": STARTED,
    "finished_at": STARTED + timedelta(milliseconds=12),
    "outcome": "succeeded",
    "detail": None,
    "job_type": "provision_tenant",
}
RUN_ROW = {
    "job_id": JOB_ID,
    "run": 2,
    "job_type": "provision_tenant",
    "started_by": "provision",
    "started_at": STARTED,
}


def test_a_step_run_row_becomes_a_record() -> None:
    record = StepRunRecord.from_row(STEP_ROW)
    assert record.outcome is StepRunOutcome.SUCCEEDED
    assert record["step"] == record.step == "create_schema"
    assert record["outcome"] == "succeeded"
    with pytest.raises(KeyError):
        record["nope"]
    assert StepRunRecord.from_row({**STEP_ROW, "job_type": None}).job_type is None
    assert (
        StepRunRecord.from_row({k: v for k, v in STEP_ROW.items() if k != "job_type"}).job_type
        is None
    )


def test_the_views_are_the_rows_json() -> None:
    """The JSON the CLI prints is what the dict rows gave: the same keys, the same values."""
    step = json.loads(json.dumps(run_view(StepRunRecord.from_row(STEP_ROW)), default=json_default))
    keys = ("attempt", "step", "worker", "finished_at", "outcome", "detail", "job_type", "run")
    assert step == {
        **{key: json.loads(json.dumps(STEP_ROW[key], default=json_default)) for key in keys},
        "started_at": STARTED.isoformat(),
        "job_id": str(JOB_ID),
    }
    run = json.dumps(job_run_view(JobRunRecord.from_row(RUN_ROW)), default=json_default)
    assert json.loads(run) == {**RUN_ROW, "job_id": str(JOB_ID), "started_at": STARTED.isoformat()}


def test_a_history_line() -> None:
    line = history_line(StepRunRecord.from_row(STEP_ROW))
    assert line == f"attempt 1  12:00:00  {'create_schema':<22} {'succeeded':<10} {'12 ms':>8}  w1"
