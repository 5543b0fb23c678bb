"""Settings, read once from the environment at the edge and passed down.

CLI flags override individual fields with :func:`dataclasses.replace`. ``repr`` hides secrets.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from provisioner import project, roles
from provisioner.errors import ConfigurationError
from provisioner.naming import DEFAULT_ID_PATTERN, DEFAULT_SCHEMA_PATTERN, TenantNaming
from provisioner.redact import redact
from provisioner.roles import DEFAULT_APP_ROLES, AppRoles

DEFAULT_COMPONENT = "provisioner-worker"
#: What a worker drains without PROVISIONER_WORKER_JOB_TYPES when no kind module is named: the
#: built-in kinds the registry marks so (``kinds.BUILTIN.default_worker``; a test pins that the
#: two agree, and the registry resolves the default when kind modules may add to it).
DEFAULT_JOB_TYPES: tuple[str, ...] = ("provision_tenant",)
#: A tenant tree to use instead of the packaged one (a deployment's own tree; the bench and
#: the tests use it to add a revision in a copy without touching the shipped tree).
TENANT_TREE_ENV = "PROVISIONER_TENANT_TREE"
#: ``none``: the project keeps no object store; step 5 checks nothing and says so.
OBJECT_STORE_PROVIDERS = ("filesystem", "s3", "azure", "none")
#: The account key or SAS token used with AZURE_STORAGE_ACCOUNT_URL (a secret: never shown).
AZURE_CREDENTIAL_ENV = "AZURE_STORAGE_CREDENTIAL"

_URL_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://", "postgresql+psycopg2://")
_USERINFO = re.compile(r"[A-Za-z0-9%._~!$&'()*+,;=:-]*")
_HOSTS = re.compile(r"[A-Za-z0-9%._~\[\]:,-]*")
_SAFE_USER = re.compile(r"[A-Za-z0-9_.-]{1,63}")
URL_HELP = (
    "percent-encode '@', ':', '/', '?', '#', '%' and spaces in a password, or leave the password "
    "out of the URL and give it the libpq way: PGPASSWORD, a password file (~/.pgpass or "
    "PGPASSFILE), or a service file entry (PGSERVICE, or ?service=NAME)"
)


def check_database_url(name: str, url: str) -> None:
    """Refuse a URL libpq would misread, in one line that shows nothing after the user name.

    An unencoded ``@`` or space in a password makes libpq take part of the password for the
    host (and echo it in its error); the refusal names at most the user, never the rest.
    """
    scheme = next((p for p in _URL_SCHEMES if url.lower().startswith(p)), None)
    if scheme is None:
        _check_key_value_conninfo(name, url)
        return
    rest = url[len(scheme) :]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo, _, hosts = authority.rpartition("@")
    valid = (
        not any(ch.isspace() or ord(ch) < 32 for ch in url)
        and authority.count("@") <= 1
        and ("@" in authority or "@" not in rest)
        and _USERINFO.fullmatch(userinfo) is not None
        and _HOSTS.fullmatch(hosts) is not None
        and not re.search(r"%(?![0-9A-Fa-f]{2})", rest)
    )
    if valid:
        query = rest.split("#", 1)[0].partition("?")[2]
        _check_ports(name, [_host_port(host) for host in hosts.split(",")] + _query_ports(query))
        return
    user = re.split(r"[:@]", rest, maxsplit=1)[0] if "@" in rest else ""
    who = f" (user {user})" if _SAFE_USER.fullmatch(user) else ""
    raise ConfigurationError(f"{name} cannot be parsed as a PostgreSQL URL{who}: {URL_HELP}")


def _check_key_value_conninfo(name: str, conninfo: str) -> None:
    """A libpq ``key=value`` string (``host=... user=...``): libpq's own parser decides."""
    # The driver is imported here, not at the top: every command reads the settings, and
    # `--help` should not pay for psycopg (docs/performance.md "Start-up").
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        parsed = "=" in conninfo and bool(conninfo_to_dict(conninfo))
    except psycopg.Error:
        parsed = False
    if not parsed:
        raise ConfigurationError(
            f"{name} cannot be parsed as a postgresql:// URL or a libpq key=value string: "
            f"{URL_HELP}"
        )
    _check_ports(name, str(conninfo_to_dict(conninfo).get("port") or "").split(","))


#: A port as libpq reads it (``strtol``): digits, blanks around them allowed.
_PORT = re.compile(r"\s*[0-9]{1,5}\s*")


def _host_port(host: str) -> str:
    """The port of one ``host[:port]`` of a URL's host list (``[v6]:port`` too); '' for none."""
    from urllib.parse import unquote

    after = host.rpartition("]")[2] if host.startswith("[") else host
    return unquote(after.partition(":")[2])


def _query_ports(query: str) -> list[str]:
    """The values of a URL's ``port=`` parameters, each split at its commas."""
    from urllib.parse import unquote

    return [
        port
        for item in query.split("&")
        if item.partition("=")[0] == "port"
        for port in unquote(item.partition("=")[2]).split(",")
    ]


def _check_ports(name: str, ports: list[str]) -> None:
    """Refuse a port libpq refuses (``invalid port number``) before any connection is tried:
    a setting that can never work is exit 2 (:class:`ConfigurationError`), not the database
    being unavailable. Empty: the default port. Only the port is named, never the URL."""
    for port in ports:
        if port and not (_PORT.fullmatch(port) and 1 <= int(port) <= 65535):
            raise ConfigurationError(
                f"{name} has an invalid port {port[:20]!r}: a port is a number from 1 to 65535"
            )


#: The shortest and longest a duration setting may be. Every one of them reaches PostgreSQL as
#: an interval or a timeout in whole milliseconds (0 would turn a timeout off), or Python's
#: waits: a value outside (NaN, infinity, a year) is a typo, refused where settings are read,
#: never found later as ``interval out of range`` in a loop or a traceback.
MIN_SECONDS = 0.001
MAX_SECONDS = 7 * 24 * 3600.0
#: Heartbeats a worker's lease holders may miss before their jobs are recovered: three beats
#: (15 s at the default interval), so a dead worker's jobs run again within about 20 s, and one
#: late beat under load is not taken for a death.
MISSED_BEATS = 3
#: The largest warm pool (PROVISIONER_POOL_SIZE): spares are whole schemas.
MAX_POOL_SIZE = 10_000
#: The most engine children one worker runs (PROVISIONER_WORKER_CONCURRENCY, --concurrency).
MAX_CONCURRENCY = 64


def seconds_problem(value: float) -> str | None:
    """Why ``value`` cannot be a duration setting (None: it can); shared with the CLI's flags."""
    if not math.isfinite(value):
        return "must be a finite number of seconds"
    if value <= 0:
        return "must be positive"
    if value < MIN_SECONDS:
        return f"must be at least {MIN_SECONDS:g} seconds"
    if value > MAX_SECONDS:
        return f"must be at most {MAX_SECONDS:g} seconds (a week)"
    return None


#: Each duration field and the variable that sets it (errors name the variable).
DURATION_SETTINGS = {
    "job_stale_after_seconds": "PROVISIONER_JOB_STALE_AFTER_SECONDS",
    "heartbeat_seconds": "PROVISIONER_HEARTBEAT_SECONDS",
    "poll_interval_seconds": "PROVISIONER_POLL_SECONDS",
    "drain_timeout_seconds": "PROVISIONER_DRAIN_TIMEOUT_SECONDS",
    "lock_timeout_seconds": "PROVISIONER_LOCK_TIMEOUT_SECONDS",
}


#: The copy methods of a move (PROVISIONER_MOVE_METHOD, ``move --method``).
MOVE_METHODS = ("auto", "dump", "logical")


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    """A number from the environment; its range is checked with every other setting's
    (:meth:`Settings.__post_init__`), whether it came from here, a flag or the caller."""
    raw = env.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number of seconds, got {raw[:40]!r}") from None


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {raw[:40]!r}") from None


def _port(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    """A TCP port, 0 (any free port) to 65535; ``default`` when unset."""
    raw = env.get(name)
    if raw in (None, ""):
        return default
    if not _whole_number(raw) or int(raw) > 65535:
        raise ConfigurationError(f"{name} must be a port number (0 to 65535), got {raw[:40]!r}")
    return int(raw)


def _whole_number(raw: str) -> bool:
    """ASCII digits only, at most 18 of them: what ``int`` takes without a ``ValueError``.
    (``str.isdigit`` also says yes to ``²`` and other digits ``int`` refuses.)"""
    return 0 < len(raw) <= 18 and raw.isascii() and raw.isdigit()


def parse_job_types(raw: str) -> tuple[str, ...]:  # also the seeds' list
    """A comma-separated list, trimmed, empty items dropped, order kept, duplicates removed."""
    items = [item.strip() for item in raw.split(",")]
    return tuple(dict.fromkeys(item for item in items if item))


@dataclass(frozen=True)
class Settings:
    """Everything the library needs to know about its surroundings."""

    migrations_database_url: str | None = field(default=None, repr=False)
    app_database_url: str | None = field(default=None, repr=False)
    #: the application roles granted in each tenant, each with its privilege set
    #: (PROVISIONER_APP_ROLES, or the older PROVISIONER_APP_ROLE: one readwrite role)
    app_roles: AppRoles = DEFAULT_APP_ROLES
    worker_component: str = DEFAULT_COMPONENT
    #: the job types a worker drains; empty: the registry's default kinds, resolved where the
    #: registry is built (:func:`provisioner.kinds.worker_job_types`), as ``from_env`` leaves
    #: it when kind modules are named and PROVISIONER_WORKER_JOB_TYPES is not set
    worker_job_types: tuple[str, ...] = DEFAULT_JOB_TYPES
    #: importable modules whose ``JOB_KINDS`` join the registry (PROVISIONER_JOB_KIND_MODULES)
    job_kind_modules: tuple[str, ...] = ()
    job_stale_after_seconds: float = 900.0
    #: how often the worker beats; a lease holder that misses :data:`MISSED_BEATS` in a row is
    #: taken for dead and its jobs recovered (:attr:`holder_lease_seconds`)
    heartbeat_seconds: float = 5.0
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
    #: the account key or SAS token used with ``azure_account_url`` (None: anonymous)
    azure_credential: str | None = field(default=None, repr=False)
    state_dir: Path = Path(".provisioner")
    #: spare schemas the worker keeps built at the template head (0: no warm pool)
    pool_size: int = 0
    #: engine children per worker (0: the machine's, :mod:`provisioner.worker.concurrency`)
    worker_concurrency: int = 0
    #: the project's seeds (PROVISIONER_SEEDS: folders of *.sql, .sql files, module:function);
    #: empty: the tenant tree's seeds/ folder (provisioner.templates.seeds)
    seeds: tuple[str, ...] = ()
    #: the port the worker serves Prometheus metrics on (None: no metrics; 0: any free port,
    #: logged at start)
    metrics_port: int | None = None
    #: the address the metrics listen on: the loopback unless the operator says otherwise
    metrics_host: str = "127.0.0.1"
    #: the operator's token for the console's actions (None: the console is read-only)
    console_token: str | None = field(default=None, repr=False)
    #: where ``provisioner console`` listens
    console_host: str = "127.0.0.1"
    console_port: int = 8080
    #: how ``provisioner move`` copies the rows (PROVISIONER_MOVE_METHOD): auto, dump or
    #: logical (:mod:`provisioner.kinds.move_logical`)
    move_method: str = "auto"

    def __post_init__(self) -> None:
        for name, url in (
            ("MIGRATIONS_DATABASE_URL", self.migrations_database_url),
            ("APP_DATABASE_URL", self.app_database_url),
        ):
            if url:
                check_database_url(name, url)
        self._check_numbers()

    def _check_numbers(self) -> None:
        """Refuse a duration or a count that cannot work, naming its variable, in one line."""
        for attribute, name in DURATION_SETTINGS.items():
            value = getattr(self, attribute)
            problem = seconds_problem(value)
            if problem is not None:
                raise ConfigurationError(f"{name} {problem}, got {value!r}")
        if not 0 <= self.pool_size <= MAX_POOL_SIZE:
            raise ConfigurationError(
                f"PROVISIONER_POOL_SIZE must be between 0 and {MAX_POOL_SIZE}, got {self.pool_size}"
            )
        if self.move_method not in MOVE_METHODS:
            raise ConfigurationError(
                f"PROVISIONER_MOVE_METHOD must be one of {', '.join(MOVE_METHODS)}, "
                f"got {self.move_method[:40]!r}"
            )
        if not 0 <= self.worker_concurrency <= MAX_CONCURRENCY:
            raise ConfigurationError(
                f"PROVISIONER_WORKER_CONCURRENCY must be between 0 (one per core) and "
                f"{MAX_CONCURRENCY}, got {self.worker_concurrency}"
            )

    def check_object_store_path(self) -> None:
        """Refuse a file given as the filesystem store's folder, before anything is created.

        A missing folder is the store being not ready (reported at step 5, like a missing
        bucket); a file there is a setting that can never work.
        """
        path = self.object_store_path
        filesystem = self.object_store_provider == "filesystem"
        if filesystem and path is not None and path.exists() and not path.is_dir():
            raise ConfigurationError(
                f"OBJECT_STORE_PATH {str(path)[:200]} is a file, not a folder: point it at the "
                "folder the filesystem object store uses"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        path = env.get("OBJECT_STORE_PATH")
        kind_modules = parse_job_types(env.get("PROVISIONER_JOB_KIND_MODULES") or "")
        return cls(
            migrations_database_url=env.get("MIGRATIONS_DATABASE_URL") or None,
            app_database_url=env.get("APP_DATABASE_URL") or None,
            app_roles=roles.from_env(env),
            worker_component=env.get("PROVISIONER_WORKER_COMPONENT") or DEFAULT_COMPONENT,
            worker_job_types=parse_job_types(env.get("PROVISIONER_WORKER_JOB_TYPES") or "")
            or (() if kind_modules else DEFAULT_JOB_TYPES),
            job_kind_modules=kind_modules,
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
            azure_credential=env.get(AZURE_CREDENTIAL_ENV) or None,
            state_dir=Path(env.get("PROVISIONER_STATE_DIR") or cls.state_dir),
            pool_size=_count(env, "PROVISIONER_POOL_SIZE", cls.pool_size),
            move_method=(env.get("PROVISIONER_MOVE_METHOD") or cls.move_method).lower(),
            worker_concurrency=_count(
                env, "PROVISIONER_WORKER_CONCURRENCY", cls.worker_concurrency
            ),
            seeds=parse_job_types(env.get("PROVISIONER_SEEDS") or ""),
            metrics_port=_port(env, "PROVISIONER_METRICS_PORT", None),
            metrics_host=env.get("PROVISIONER_METRICS_HOST") or cls.metrics_host,
            console_token=env.get("PROVISIONER_CONSOLE_TOKEN") or None,
            console_host=env.get("PROVISIONER_CONSOLE_HOST") or cls.console_host,
            console_port=_port(env, "PROVISIONER_CONSOLE_PORT", cls.console_port) or 0,
        )

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, start: Path | None = None) -> Settings:
        """The settings of the project in ``start`` (the working directory): its configuration
        file (:mod:`provisioner.project`) under the environment (``env``: the process's)."""
        return cls.from_env(project.effective(os.environ if env is None else env, start).env)

    @property
    def holder_lease_seconds(self) -> float:
        """How long a worker's lease holder stays alive without a beat (:data:`MISSED_BEATS`
        intervals): the lease each beat promises in ``control.lease_holders``."""
        return min(MISSED_BEATS * self.heartbeat_seconds, MAX_SECONDS)

    @property
    def control_role(self) -> str:
        """The application role ``APP_DATABASE_URL`` connects as, which the control revisions
        grant the queue's privileges to (:func:`provisioner.roles.control_role`)."""
        return roles.control_role(self.app_roles).name

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
        out["app_roles"] = roles.render(self.app_roles)
        return out


def environment() -> Mapping[str, str]:
    """The process environment, for the commands that show where a setting came from
    (``provisioner config``): read here, as every setting is."""
    return os.environ


def tenant_tree_override(env: Mapping[str, str] | None = None) -> Path | None:
    """``$PROVISIONER_TENANT_TREE``, else the project file's ``tenant_tree``: the tenant Alembic
    tree to use instead of the packaged one (None: the packaged one). Read at each use, not
    once: the tree's digest is looked at for every job, and a test or the bench points a
    running process at another copy."""
    raw = (os.environ if env is None else env).get(TENANT_TREE_ENV)
    if raw:
        return Path(raw)
    return project.project_tenant_tree() if env is None else None


def tenant_naming(env: Mapping[str, str] | None = None) -> TenantNaming:
    """The project's tenant-id rule and schema-name pattern (PROVISIONER_SCHEMA_PATTERN,
    PROVISIONER_TENANT_ID_PATTERN, PROVISIONER_TENANT_ID_MAX_LENGTH; ``env`` None: the process
    environment over the project file). Read at each use, as the tenant tree is, because
    every :class:`provisioner.models.TenantId` is checked against it: the worker's children,
    the library's callers and the pytest plugin all find the same rule from the same place. A
    rule that cannot work is one line (:class:`ConfigurationError`)."""
    if env is None:
        values = project.project_values()
        environ = os.environ
        return _naming(
            environ.get("PROVISIONER_SCHEMA_PATTERN")
            or values.get("PROVISIONER_SCHEMA_PATTERN")
            or DEFAULT_SCHEMA_PATTERN,
            environ.get("PROVISIONER_TENANT_ID_PATTERN")
            or values.get("PROVISIONER_TENANT_ID_PATTERN")
            or DEFAULT_ID_PATTERN,
            environ.get("PROVISIONER_TENANT_ID_MAX_LENGTH")
            or values.get("PROVISIONER_TENANT_ID_MAX_LENGTH")
            or "",
        )
    return _naming(
        env.get("PROVISIONER_SCHEMA_PATTERN") or DEFAULT_SCHEMA_PATTERN,
        env.get("PROVISIONER_TENANT_ID_PATTERN") or DEFAULT_ID_PATTERN,
        env.get("PROVISIONER_TENANT_ID_MAX_LENGTH") or "",
    )


#: The variables of the tenant naming (:func:`tenant_naming`).
NAMING_ENV = (
    "PROVISIONER_SCHEMA_PATTERN",
    "PROVISIONER_TENANT_ID_PATTERN",
    "PROVISIONER_TENANT_ID_MAX_LENGTH",
)


@lru_cache(maxsize=16)
def _naming(schema_pattern: str, id_pattern: str, max_length: str) -> TenantNaming:
    if not max_length:
        return TenantNaming(schema_pattern, id_pattern)
    if not _whole_number(max_length.strip()):
        raise ConfigurationError(
            f"PROVISIONER_TENANT_ID_MAX_LENGTH must be a whole number, got {max_length[:40]!r}"
        )
    return TenantNaming(schema_pattern, id_pattern, int(max_length))
