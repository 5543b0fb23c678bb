"""Settings, read once from the environment at the edge and passed down.

CLI flags override individual fields with :func:`dataclasses.replace`. ``repr`` hides secrets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from provisioner.errors import ConfigurationError
from provisioner.models import PROVISION_JOB_TYPE

DEFAULT_COMPONENT = "provisioner-worker"
DEFAULT_JOB_TYPES = (PROVISION_JOB_TYPE,)
OBJECT_STORE_PROVIDERS = ("filesystem", "s3", "azure")

_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]*(?P<tail>@)", re.I)
_KEY_VALUE_SECRET = re.compile(
    r"(?P<key>AccountKey|SharedAccessSignature|sig|password|secret|token|aws_secret_access_key)"
    r"(?P<sep>\s*[=:]\s*)(?P<value>[^;&\s'\"]+)",
    re.I,
)


def redact(text: str) -> str:
    """Remove passwords in URLs and key=value secrets (connection strings, SAS tokens)."""
    text = _URL_PASSWORD.sub(r"\g<head>***\g<tail>", text)
    return _KEY_VALUE_SECRET.sub(r"\g<key>\g<sep>***", text)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ConfigurationError(f"{name} must be positive, got {raw!r}")
    return value


def parse_job_types(raw: str) -> tuple[str, ...]:
    """A comma-separated list, trimmed, empty items dropped, order kept, duplicates removed."""
    items = [item.strip() for item in raw.split(",")]
    return tuple(dict.fromkeys(item for item in items if item))


@dataclass(frozen=True)
class Settings:
    """Everything the library needs to know about its surroundings."""

    migrations_database_url: str | None = field(default=None, repr=False)
    app_database_url: str | None = field(default=None, repr=False)
    app_role: str = "app_rw"
    worker_component: str = DEFAULT_COMPONENT
    worker_job_types: tuple[str, ...] = DEFAULT_JOB_TYPES
    job_stale_after_seconds: float = 900.0
    heartbeat_seconds: float = 10.0
    poll_interval_seconds: float = 5.0
    drain_timeout_seconds: float = 30.0
    #: how long a tenant migration waits for a table lock before it gives up (and is retried)
    lock_timeout_seconds: float = 5.0
    object_store_provider: str = "filesystem"
    object_store_path: Path | None = None
    s3_bucket: str | None = None
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_addressing_style: str | None = None
    azure_connection_string: str | None = field(default=None, repr=False)
    azure_account_url: str | None = None
    azure_container: str | None = None
    state_dir: Path = Path(".provisioner")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        path = env.get("OBJECT_STORE_PATH")
        return cls(
            migrations_database_url=env.get("MIGRATIONS_DATABASE_URL") or None,
            app_database_url=env.get("APP_DATABASE_URL") or None,
            app_role=env.get("PROVISIONER_APP_ROLE") or cls.app_role,
            worker_component=env.get("PROVISIONER_WORKER_COMPONENT") or DEFAULT_COMPONENT,
            worker_job_types=parse_job_types(
                env.get("PROVISIONER_WORKER_JOB_TYPES") or ",".join(DEFAULT_JOB_TYPES)
            ),
            job_stale_after_seconds=_float(
                env, "PROVISIONER_JOB_STALE_AFTER_SECONDS", cls.job_stale_after_seconds
            ),
            heartbeat_seconds=_float(env, "PROVISIONER_HEARTBEAT_SECONDS", cls.heartbeat_seconds),
            poll_interval_seconds=_float(
                env, "PROVISIONER_POLL_SECONDS", cls.poll_interval_seconds
            ),
            drain_timeout_seconds=_float(
                env, "PROVISIONER_DRAIN_TIMEOUT_SECONDS", cls.drain_timeout_seconds
            ),
            lock_timeout_seconds=_float(
                env, "PROVISIONER_LOCK_TIMEOUT_SECONDS", cls.lock_timeout_seconds
            ),
            object_store_provider=(
                env.get("OBJECT_STORE_PROVIDER") or cls.object_store_provider
            ).lower(),
            object_store_path=Path(path) if path else None,
            s3_bucket=env.get("S3_BUCKET") or None,
            s3_endpoint_url=env.get("S3_ENDPOINT_URL") or None,
            s3_region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            s3_addressing_style=env.get("S3_ADDRESSING_STYLE") or None,
            azure_connection_string=env.get("AZURE_STORAGE_CONNECTION_STRING") or None,
            azure_account_url=env.get("AZURE_STORAGE_ACCOUNT_URL") or None,
            azure_container=env.get("AZURE_STORAGE_CONTAINER") or None,
            state_dir=Path(env.get("PROVISIONER_STATE_DIR") or cls.state_dir),
        )

    @property
    def embedded(self) -> bool:
        """True when no database URL is set: one-off commands use the local PostgreSQL."""
        return not self.migrations_database_url and not self.app_database_url

    @property
    def owner_url(self) -> str:
        if not self.migrations_database_url:
            raise ConfigurationError("MIGRATIONS_DATABASE_URL is not set (the owner role's URL)")
        return self.migrations_database_url

    @property
    def app_url(self) -> str:
        """The application role's URL; one-off commands fall back to the owner's."""
        url = self.app_database_url or self.migrations_database_url
        if not url:
            raise ConfigurationError("APP_DATABASE_URL is not set (the app_rw role's URL)")
        return url

    def describe(self) -> dict[str, object]:
        """Settings for logs and ``--json`` output; fields hidden from ``repr`` are redacted."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if not f.repr:
                out[f.name] = redact(value) if value else None
            else:
                out[f.name] = str(value) if isinstance(value, Path) else value
        return out
