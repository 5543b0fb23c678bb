"""The worker's log lines: one per event, human-readable or JSON, never a secret.

Callers log through :func:`event` with an event name and fields::

    event(log, "claimed", job_id=..., tenant_id="acme", woke="notify")

Human form (the default)::

    2026-07-28T10:00:00.123Z INFO  claimed job_id=... tenant_id=acme woke=notify

JSON form (``--log-format json``), one object per line::

    {"ts": "2026-07-28T10:00:00.123Z", "level": "info", "event": "claimed", "job_id": ...}

Every rendered line passes through :func:`provisioner.redact.redact`, so a URL or connection
string that slipped into a message loses its password on the way out.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

from provisioner.errors import InvalidInput
from provisioner.models import Job, JobStatus
from provisioner.redact import redact

LOGGER_NAME = "provisioner.worker"
LOG_FORMATS = ("human", "json")


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


def _plain(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.3f}"
    elif isinstance(value, list | tuple):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    if not text or any(c.isspace() or c in "\"'=" for c in text):
        return json.dumps(text)
    return text


class HumanFormatter(logging.Formatter):
    """``<time> <LEVEL> <event> key=value ...``, values quoted when they hold spaces."""

    def format(self, record: logging.LogRecord) -> str:
        pairs = " ".join(
            f"{key}={_plain(value)}" for key, value in _fields(record).items() if value is not None
        )
        line = f"{_timestamp(record)} {record.levelname:<5} {record.getMessage()}"
        return redact(f"{line} {pairs}" if pairs else line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``event``, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        for key, value in _fields(record).items():
            if value is not None:
                payload[key] = value
        return redact(json.dumps(payload, default=str, sort_keys=False))


def configure(log_format: str = "human", stream: IO[str] | None = None) -> logging.Logger:
    """The worker's logger, writing one line per event to ``stream`` (stderr by default)."""
    if log_format not in LOG_FORMATS:
        raise InvalidInput(f"log format must be one of {', '.join(LOG_FORMATS)}")
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else HumanFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with its fields."""
    logger.log(level, name, extra={"fields": fields})


def job_fields(job: Job) -> dict[str, Any]:
    return {"job_id": job.id, "tenant_id": job.tenant_id, "attempt": job.attempts}


def job_outcome(logger: logging.Logger, job: Job, *, released: bool, seconds: float | None) -> str:
    """Log how a run left the job (succeeded, failed, retry_scheduled, released); the name."""
    fields = {**job_fields(job), "seconds": seconds}
    if job.status is JobStatus.SUCCEEDED:
        event(logger, "succeeded", **fields)
        return "succeeded"
    if job.status is JobStatus.FAILED:
        event(logger, "failed", logging.ERROR, **fields, error=job.error_detail)
        return "failed"
    if job.status is JobStatus.QUEUED:
        delay = 0.0
        if job.available_at and job.updated_at:  # both stamped by the same statement
            delay = max(0.0, (job.available_at - job.updated_at).total_seconds())
        if released and delay < 1.0:
            event(logger, "released", **fields, steps_done=len(job.steps_completed))
            return "released"
        fields.update(delay_seconds=round(delay, 3), error=job.error_detail)
        event(logger, "retry_scheduled", logging.WARNING, **fields)
        return "retry_scheduled"
    event(logger, "finished", **fields, status=job.status.value)
    return job.status.value
