"""The project configuration file: the settings a team keeps in its repository.

``provisioner.toml``, or a ``[tool.provisioner]`` table in ``pyproject.toml``, found in the
working directory or the nearest parent that has one (as git finds ``.git``). Every key is also
an environment variable, and the environment wins over the file (CLI flags win over both)::

    # provisioner.toml
    tenant_tree = "db/tenant"            # paths are relative to this file
    seeds = ["db/seeds", "myapp.seeds:plans"]
    schema_pattern = "acct_{id}"         # the default is tenant_{id}
    object_store_provider = "none"
    pool_size = 4

    [app_roles]                          # each application role and its privilege set
    app_rw = "readwrite"
    app_ro = "readonly"

The file holds no secrets: database URLs and cloud credentials come from the environment (a
URL in the file is refused). :func:`effective` merges file and environment and says where each
value came from (``provisioner config``). :data:`KEYS` is the one table of keys, variables and
defaults (docs/configuration.md is generated from the same names and a test compares them).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path

from provisioner import roles
from provisioner.errors import ConfigurationError

__all__ = [
    "FILE_NAME",
    "KEYS",
    "Key",
    "ProjectFile",
    "Source",
    "effective",
    "find",
    "load",
    "project_tenant_tree",
    "project_values",
]

FILE_NAME = "provisioner.toml"
PYPROJECT = "pyproject.toml"


class Kind(StrEnum):
    """How a key's value is written in the file."""

    TEXT = "text"
    PATH = "path"  # relative to the file's folder
    LIST = "list"  # a TOML array of strings, or one string; paths in it relative to the file
    NUMBER = "number"
    TABLE = "table"  # a TOML table of role name -> privilege set (provisioner.roles)


class Source(StrEnum):
    """Where an effective value came from."""

    FLAG = "flag"
    ENVIRONMENT = "environment"
    FILE = "file"
    DEFAULT = "default"


@dataclass(frozen=True)
class Key:
    """One setting: its name in the file, its environment variable, its default as shown."""

    name: str
    env: str
    default: str
    help: str
    kind: Kind = Kind.TEXT
    #: False for the secrets and URLs, which only the environment may hold
    in_file: bool = True
    secret: bool = False


KEYS: tuple[Key, ...] = (
    Key(
        "migrations_database_url",
        "MIGRATIONS_DATABASE_URL",
        "(embedded)",
        "the owner role's connection (DDL)",
        in_file=False,
        secret=True,
    ),
    Key(
        "app_database_url",
        "APP_DATABASE_URL",
        "(embedded)",
        "the application role's connection (rows only)",
        in_file=False,
        secret=True,
    ),
    Key(
        "tenant_tree",
        "PROVISIONER_TENANT_TREE",
        "(the shipped example)",
        "the tenant schema's Alembic tree",
        Kind.PATH,
    ),
    Key(
        "seeds",
        "PROVISIONER_SEEDS",
        "(the tree's seeds/ folder)",
        "seed folders of *.sql, .sql files, module:function callables",
        Kind.LIST,
    ),
    Key(
        "app_roles",
        "PROVISIONER_APP_ROLES",
        "app_rw=readwrite",
        "the application roles granted in each tenant, each with its privilege set",
        Kind.TABLE,
    ),
    Key("app_role", "PROVISIONER_APP_ROLE", "", "one readwrite role (older form of app_roles)"),
    Key(
        "schema_pattern",
        "PROVISIONER_SCHEMA_PATTERN",
        "tenant_{id}",
        "a tenant's schema name: '{id}' once, lower-case letters, digits, '_' around it",
    ),
    Key(
        "tenant_id_pattern",
        "PROVISIONER_TENANT_ID_PATTERN",
        "[a-z][a-z0-9_]*",
        "the regular expression a whole tenant id matches",
    ),
    Key(
        "tenant_id_max_length",
        "PROVISIONER_TENANT_ID_MAX_LENGTH",
        "48",
        "the longest tenant id (schema names are at most 63 bytes)",
        Kind.NUMBER,
    ),
    Key(
        "object_store_provider",
        "OBJECT_STORE_PROVIDER",
        "filesystem",
        "the storage check of step 5: filesystem, s3, azure or none",
    ),
    Key("object_store_path", "OBJECT_STORE_PATH", "(state folder)/objects", "", Kind.PATH),
    Key("s3_bucket", "S3_BUCKET", "", "the bucket step 5 checks"),
    Key("s3_endpoint_url", "S3_ENDPOINT_URL", "", "an S3-compatible endpoint"),
    Key("azure_container", "AZURE_STORAGE_CONTAINER", "", "the container step 5 checks"),
    Key("azure_account_url", "AZURE_STORAGE_ACCOUNT_URL", "", "the Azure account's URL"),
    Key(
        "azure_connection_string",
        "AZURE_STORAGE_CONNECTION_STRING",
        "",
        "Azure's connection string",
        in_file=False,
        secret=True,
    ),
    Key("pool_size", "PROVISIONER_POOL_SIZE", "0", "warm spare schemas kept", Kind.NUMBER),
    Key(
        "worker_concurrency",
        "PROVISIONER_WORKER_CONCURRENCY",
        "(one per core, at most 8)",
        "engine child processes per worker",
        Kind.NUMBER,
    ),
    Key(
        "lock_timeout_seconds",
        "PROVISIONER_LOCK_TIMEOUT_SECONDS",
        "5",
        "how long a migration waits for a lock",
        Kind.NUMBER,
    ),
    Key(
        "move_method",
        "PROVISIONER_MOVE_METHOD",
        "auto",
        "how a move copies the rows: auto, dump or logical",
    ),
    Key(
        "job_stale_after_seconds",
        "PROVISIONER_JOB_STALE_AFTER_SECONDS",
        "900",
        "a running job's outer lease bound",
        Kind.NUMBER,
    ),
    Key("heartbeat_seconds", "PROVISIONER_HEARTBEAT_SECONDS", "10", "", Kind.NUMBER),
    Key("poll_seconds", "PROVISIONER_POLL_SECONDS", "5", "", Kind.NUMBER),
    Key("drain_timeout_seconds", "PROVISIONER_DRAIN_TIMEOUT_SECONDS", "30", "", Kind.NUMBER),
    Key(
        "worker_component",
        "PROVISIONER_WORKER_COMPONENT",
        "provisioner-worker",
        "the worker's name in heartbeats",
    ),
    Key(
        "worker_job_types",
        "PROVISIONER_WORKER_JOB_TYPES",
        "provision_tenant",
        "the job kinds a worker drains",
        Kind.LIST,
    ),
    Key(
        "job_kind_modules",
        "PROVISIONER_JOB_KIND_MODULES",
        "",
        "modules whose JOB_KINDS join the registry",
        Kind.LIST,
    ),
    Key("state_dir", "PROVISIONER_STATE_DIR", ".provisioner", "the embedded state", Kind.PATH),
    Key("s3_region", "AWS_REGION", "", "the bucket's region (or AWS_DEFAULT_REGION)"),
    Key("s3_addressing_style", "S3_ADDRESSING_STYLE", "", "auto, virtual or path"),
    Key(
        "azure_credential",
        "AZURE_STORAGE_CREDENTIAL",
        "",
        "the account key or SAS token for azure_account_url",
        in_file=False,
        secret=True,
    ),
    Key("metrics_port", "PROVISIONER_METRICS_PORT", "(off)", "the worker's metrics", Kind.NUMBER),
    Key("metrics_host", "PROVISIONER_METRICS_HOST", "127.0.0.1", "where the metrics listen"),
    Key("console_host", "PROVISIONER_CONSOLE_HOST", "127.0.0.1", "where the console listens"),
    Key("console_port", "PROVISIONER_CONSOLE_PORT", "8080", "", Kind.NUMBER),
    Key(
        "console_token",
        "PROVISIONER_CONSOLE_TOKEN",
        "(read-only)",
        "the operator's token for the console's actions",
        in_file=False,
        secret=True,
    ),
)
_BY_NAME = {key.name: key for key in KEYS}


@dataclass(frozen=True)
class ProjectFile:
    """A configuration file read: where it is, and its values as environment strings."""

    path: Path
    values: Mapping[str, str]


def find(start: Path | None = None) -> Path | None:
    """The nearest ``provisioner.toml``, or ``pyproject.toml`` with a ``[tool.provisioner]``
    table, in ``start`` (the working directory) or a parent."""
    here = (start or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        if (folder / FILE_NAME).is_file():
            return folder / FILE_NAME
        pyproject = folder / PYPROJECT
        if pyproject.is_file() and "tool" in _read(pyproject) and _table(pyproject) is not None:
            return pyproject
    return None


def _read(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{path}: cannot be read as TOML: {exc}") from None


def _table(path: Path) -> dict[str, object] | None:
    data = _read(path)
    if path.name != PYPROJECT:
        return data
    tool = data.get("tool")
    table = tool.get("provisioner") if isinstance(tool, dict) else None
    return table if isinstance(table, dict) else None


def _as_env(path: Path, key: Key, value: object) -> str:
    """A file value as the environment variable would hold it."""
    where = f"{path}: {key.name}"
    if key.kind is Kind.TABLE:
        if not isinstance(value, dict):
            raise ConfigurationError(
                f"{where} must be a table of role = privilege set, e.g. [{key.name}] "
                'app_rw = "readwrite"'
            )
        return roles.render(roles.from_mapping(value, where))
    if key.kind is Kind.LIST:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigurationError(f"{where} must be a string or an array of strings")
        return ",".join(_relative(path, key, item) for item in items)
    if key.kind is Kind.NUMBER:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigurationError(f"{where} must be a number, got {value!r}")
        return str(value)
    if not isinstance(value, str):
        raise ConfigurationError(f"{where} must be a string, got {value!r}")
    return _relative(path, key, value)


def _relative(path: Path, key: Key, value: str) -> str:
    """Paths in the file are relative to its folder; a seed ``module:function`` is not a path."""
    is_path = key.kind is Kind.PATH or (key.name == "seeds" and not _looks_callable(value))
    return str(path.parent / value) if is_path and not Path(value).is_absolute() else value


def _looks_callable(entry: str) -> bool:
    module, sep, attr = entry.partition(":")
    return (
        bool(sep) and "/" not in entry and all(p.isidentifier() for p in (*module.split("."), attr))
    )


def load(path: Path) -> ProjectFile:
    """Read a configuration file; an unknown key, a secret or a value of the wrong type is one
    line naming the file and the key."""
    table = _table(path) or {}
    values: dict[str, str] = {}
    for name, value in table.items():
        key = _BY_NAME.get(name)
        if key is None:
            known = ", ".join(k.name for k in KEYS if k.in_file)
            raise ConfigurationError(f"{path}: unknown key {name!r} (known: {known})")
        if not key.in_file:
            raise ConfigurationError(
                f"{path}: {name} belongs in the environment ({key.env}), not in a file kept "
                "in a repository"
            )
        values[key.env] = _as_env(path, key, value)
    return ProjectFile(path, values)


@dataclass(frozen=True)
class Effective:
    """The environment the settings are read from (file values under the environment's), the
    source of each key, and the file (None: no file found)."""

    env: Mapping[str, str]
    sources: Mapping[str, Source]
    file: Path | None


def effective(env: Mapping[str, str], start: Path | None = None) -> Effective:
    """Merge the project file (if any) under ``env`` (the process environment, which only
    :mod:`provisioner.settings` reads)."""
    path = find(start)
    project = load(path) if path is not None else ProjectFile(Path(), {})
    merged = {**project.values, **{k: v for k, v in env.items() if v != ""}}
    sources = {
        key.name: Source.ENVIRONMENT
        if env.get(key.env)
        else Source.FILE
        if key.env in project.values
        else Source.DEFAULT
        for key in KEYS
    }
    return Effective(merged, sources, path)


@lru_cache(maxsize=8)
def _values_in(cwd: str) -> Mapping[str, str]:
    path = find(Path(cwd))
    return load(path).values if path is not None else {}


def project_values() -> Mapping[str, str]:
    """The project file's values (as environment variables) for the working directory, read
    once per working directory: a worker's children, started in the same folder, find it too.
    For the settings read at each use (the tenant tree, the tenant naming)."""
    return _values_in(os.getcwd())  # absolute; costs a fraction of Path.cwd() (every TenantId)


def project_tenant_tree() -> Path | None:
    """The tenant tree the project file in the working directory names (None: none)."""
    value = project_values().get("PROVISIONER_TENANT_TREE")
    return Path(value) if value else None
