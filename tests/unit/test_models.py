"""Tenant ids, progress, job status and the settings' secret handling."""

from __future__ import annotations

import pytest

from provisioner import kinds
from provisioner import redact as redaction
from provisioner.errors import ConfigurationError, InvalidInput
from provisioner.kinds.provision import PROVISION_JOB_TYPE, STEPS
from provisioner.models import JobStatus, TenantId
from provisioner.redact import redact
from provisioner.settings import DEFAULT_JOB_TYPES, Settings, parse_job_types

BAD_TENANT_IDS = [
    "",  # empty
    "Acme",  # upper case
    "ACME",
    "1acme",  # starts with a digit
    "_acme",  # starts with an underscore
    "acme-co",  # hyphen
    "acme co",  # space
    "acme'; DROP SCHEMA control CASCADE; --",  # quote / injection
    'acme"x',  # double quote
    "a" * 49,  # too long
    "acmé",  # non-ASCII
    "acme\n",  # trailing newline
    "acme.co",  # dot
    "public",  # reserved
    "control",  # reserved
    "pg_acme",  # reserved prefix
    "select",  # SQL keyword
    "acme\x00",  # NUL byte
]


@pytest.mark.parametrize("bad", BAD_TENANT_IDS)
def test_bad_tenant_ids_are_refused_naming_the_rule(bad: str) -> None:
    with pytest.raises(InvalidInput) as info:
        TenantId(bad)
    message = str(info.value)
    assert "tenant ids are 1-48 characters" in message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize("good", ["acme", "a", "acme_2024", "a" * 48, "t0_x"])
def test_good_tenant_ids_map_to_their_schema(good: str) -> None:
    assert TenantId(good).schema == f"tenant_{good}"


def test_progress_counts_the_kinds_steps() -> None:
    provision = kinds.BUILTIN[PROVISION_JOB_TYPE]
    assert provision.step_names == STEPS
    assert provision.progress([]) == 0
    assert provision.progress(list(STEPS[:3])) == 50
    assert provision.progress(list(STEPS)) == 100
    assert provision.position("grant_app_rw") == (3, 6)


def test_a_step_name_the_kind_does_not_know_is_refused_not_dropped() -> None:
    with pytest.raises(InvalidInput, match="has no step"):
        kinds.BUILTIN[PROVISION_JOB_TYPE].ordered(["create_schema", "not_a_step"])


def test_the_default_worker_drains_exactly_provision_tenant() -> None:
    assert kinds.BUILTIN.default_worker == (PROVISION_JOB_TYPE,) == DEFAULT_JOB_TYPES
    assert {"suspend_tenant", "restore_tenant", "deprovision_tenant", "purge_tenant"} <= (
        kinds.BUILTIN.handled
    )
    assert "send_email" in kinds.BUILTIN.names and "send_email" not in kinds.BUILTIN.handled


def test_terminal_statuses() -> None:
    assert {s for s in JobStatus if s.terminal} == {
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
    }


def test_redact_hides_url_passwords_and_connection_string_keys() -> None:
    text = (
        "could not connect to postgresql://owner:s3cr3t@db:5432/x; "
        "DefaultEndpointsProtocol=http;AccountName=dev;AccountKey=abc123==;BlobEndpoint=x"
    )
    out = redact(text)
    assert "s3cr3t" not in out
    assert "abc123" not in out
    assert "postgresql://owner:***@db:5432/x" in out


def test_redact_skips_only_texts_its_expressions_leave_alone() -> None:
    """The quick check passes over a text only when the expressions would not change it; every
    key, in any case, and a URL's password are still scrubbed."""
    keys = ["AccountKey", "SharedAccessSignature", "sig", "password", "secret", "token"]
    keys += ["aws_secret_access_key"]
    secrets = [f"{key}=hunter2" for key in keys] + [f"{key.upper()}: 'hunter 2'" for key in keys]
    secrets += [
        "postgresql://owner:hunter2@db/x",
        "PASSWORD=hunter2",
        "pa\u017fsword=hunter2",
    ]  # long s: folds onto "s"
    for text in secrets:
        assert redaction._may_hold_secret(text), text
        assert "hunter2" not in redact(text) and "hunter 2" not in redact(text), text
    plain = [
        '{"ts": "2026-12-03T12:00:00.123Z", "event": "step_done", "step": "grant_app_rw"}',
        "path=template",
        "filesystem store at /srv/objects",
        "",
    ]
    for text in plain:
        assert not redaction._may_hold_secret(text), text
        full = redaction._KEY_VALUE_SECRET.sub("x", redaction._URL_PASSWORD.sub("x", text))
        assert redact(text) == full == text


def test_settings_from_env_defaults_and_overrides() -> None:
    s = Settings.from_env({})
    assert s.embedded
    assert s.worker_component == "provisioner-worker"
    assert s.worker_job_types == ("provision_tenant",)
    assert s.job_stale_after_seconds == 900
    assert s.heartbeat_seconds == 5
    s = Settings.from_env(
        {
            "MIGRATIONS_DATABASE_URL": "postgresql://o:pw@h/d",
            "PROVISIONER_WORKER_JOB_TYPES": " provision_tenant , send_email,,provision_tenant",
            "PROVISIONER_JOB_STALE_AFTER_SECONDS": "30",
        }
    )
    assert not s.embedded
    assert s.worker_job_types == ("provision_tenant", "send_email")
    assert s.job_stale_after_seconds == 30
    assert "pw" not in repr(s)
    assert "pw" not in str(s.describe())


def test_settings_refuse_bad_numbers() -> None:
    with pytest.raises(ConfigurationError, match="PROVISIONER_HEARTBEAT_SECONDS"):
        Settings.from_env({"PROVISIONER_HEARTBEAT_SECONDS": "soon"})
    with pytest.raises(ConfigurationError, match="positive"):
        Settings.from_env({"PROVISIONER_HEARTBEAT_SECONDS": "-1"})


def test_parse_job_types() -> None:
    assert parse_job_types("a, b ,a,,") == ("a", "b")
