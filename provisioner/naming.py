"""Tenant naming: which tenant ids are valid, and the one mapping between a tenant id and its
schema, both ways (:meth:`TenantNaming.schema` and :meth:`TenantNaming.tenant_of`).

A project sets its own rule (``schema_pattern``, ``tenant_id_pattern``,
``tenant_id_max_length``: :mod:`provisioner.project`); the default is the contract's
``tenant_{id}`` with ids of 1-48 lower-case letters, digits and ``_`` starting with a letter.
Every place that names a tenant's schema (the steps, the pool's take, drift, listing, purge,
the pytest plugin, the tenant tree's ``env.py``) goes through a :class:`TenantNaming`, so one
setting changes them all, and a schema name found in the catalog is a tenant's only when this
mapping says so.

Schemas the tool makes for itself are never a tenant's, whatever the rule: warm spares are
``pool_<hex>`` and scratch schemas (reference builds, upgrade scratch, the expected inventory)
``provisioner_<what>_<hex>`` (:func:`scratch_name`). A tenant id whose schema would start with
one of those prefixes, or be a system or reserved schema, is refused.
"""

from __future__ import annotations

import keyword
import re
import secrets
from dataclasses import dataclass
from functools import cached_property

from provisioner.errors import ConfigurationError, InvalidInput

__all__ = [
    "DEFAULT_ID_PATTERN",
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_RULE",
    "DEFAULT_SCHEMA_PATTERN",
    "RESERVED",
    "SCRATCH_PREFIX",
    "SPARE_PREFIX",
    "TenantNaming",
    "is_scratch",
    "scratch_name",
]

DEFAULT_SCHEMA_PATTERN = "tenant_{id}"
DEFAULT_ID_PATTERN = "[a-z][a-z0-9_]*"
DEFAULT_MAX_LENGTH = 48
#: PostgreSQL truncates longer names (NAMEDATALEN - 1): a longer schema name would silently
#: become another tenant's.
MAX_IDENTIFIER_BYTES = 63
#: What an unquoted, lower-case PostgreSQL identifier may be (``$`` left out: not standard SQL).
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
_PATTERN_TEXT = re.compile(r"[a-z0-9_]*")
_ID_TEXT = re.compile(r"[a-z0-9_]+")

#: Warm spares (:mod:`provisioner.pool.spares`): ``pool_`` and 16 hex digits.
SPARE_PREFIX = "pool_"
#: The tool's scratch schemas: reference builds, upgrade scratch, the expected inventory.
SCRATCH_PREFIX = "provisioner_"
#: Schema names a tenant's can never start with: the tool's own and PostgreSQL's.
_TOOL_PREFIXES = (SPARE_PREFIX, SCRATCH_PREFIX, "pg_")

DEFAULT_RULE = (
    "tenant ids are 1-48 characters of lower-case ASCII letters, digits and '_', "
    "starting with a letter, and not a reserved word"
)
# Names that would read as something else in logs, URLs or SQL, whatever their schema name.
RESERVED = frozenset(
    {
        "admin",
        "all",
        "control",
        "default",
        "information_schema",
        "none",
        "null",
        "pg_catalog",
        "pg_toast",
        "public",
        "root",
        "select",
        "system",
        "table",
        "template",
        "user",
    }
) | frozenset(keyword.kwlist)
#: Schemas that are never a tenant's, whatever the pattern makes of an id.
_RESERVED_SCHEMAS = frozenset({"public", "control", "information_schema"})


def scratch_name(what: str) -> str:
    """A fresh name for one of the tool's scratch schemas (``provisioner_<what>_<hex>``): no
    tenant id maps to it under any rule (:meth:`TenantNaming.tenant_of`)."""
    return f"{SCRATCH_PREFIX}{what}_{secrets.token_hex(6)}"


def is_scratch(schema: str) -> bool:
    """True for a name :func:`scratch_name` makes (the tenant tree's ``env.py`` accepts them)."""
    return schema.startswith(SCRATCH_PREFIX) and _IDENTIFIER.fullmatch(schema) is not None


@dataclass(frozen=True)
class TenantNaming:
    """A project's tenant-id rule and schema-name pattern; refused at once (one line,
    :class:`ConfigurationError`) when the two cannot make a valid, unambiguous schema name."""

    schema_pattern: str = DEFAULT_SCHEMA_PATTERN
    id_pattern: str = DEFAULT_ID_PATTERN
    max_length: int = DEFAULT_MAX_LENGTH

    def __post_init__(self) -> None:
        pattern = self.schema_pattern
        where = f"PROVISIONER_SCHEMA_PATTERN {pattern[:80]!r}"
        if pattern.count("{id}") != 1:
            raise ConfigurationError(f"{where} must hold '{{id}}' exactly once")
        prefix, suffix = self.parts
        if not (_PATTERN_TEXT.fullmatch(prefix) and _PATTERN_TEXT.fullmatch(suffix)):
            raise ConfigurationError(
                f"{where}: around '{{id}}' only lower-case ASCII letters, digits and '_' "
                "(the schema name must be a valid unquoted identifier)"
            )
        if prefix[:1].isdigit():
            raise ConfigurationError(f"{where} must not start with a digit")
        if any(prefix.startswith(p) for p in _TOOL_PREFIXES):
            raise ConfigurationError(
                f"{where}: schemas starting with {', '.join(_TOOL_PREFIXES)} are the tool's "
                "and PostgreSQL's own"
            )
        room = MAX_IDENTIFIER_BYTES - len(prefix) - len(suffix)
        if isinstance(self.max_length, bool) or not 1 <= self.max_length <= room:
            raise ConfigurationError(
                f"PROVISIONER_TENANT_ID_MAX_LENGTH must be between 1 and {room} with schema "
                f"pattern {pattern!r} (schema names are at most {MAX_IDENTIFIER_BYTES} bytes), "
                f"got {self.max_length!r}"
            )
        try:
            re.compile(self.id_pattern)
        except re.error as exc:
            raise ConfigurationError(
                f"PROVISIONER_TENANT_ID_PATTERN {self.id_pattern[:80]!r} is not a regular "
                f"expression: {exc}"
            ) from None

    @cached_property
    def parts(self) -> tuple[str, str]:
        """What comes before and after ``{id}``."""
        prefix, _, suffix = self.schema_pattern.partition("{id}")
        return prefix, suffix

    @cached_property
    def _id_re(self) -> re.Pattern[str]:
        return re.compile(self.id_pattern)

    @property
    def is_default(self) -> bool:
        return self == TenantNaming()

    @property
    def rule(self) -> str:
        """The rule in words, for the one-line refusal of a bad id."""
        if self.is_default:
            return DEFAULT_RULE
        return (
            f"tenant ids match {self.id_pattern!r}, are 1-{self.max_length} characters of "
            "lower-case ASCII letters, digits and '_', and not a reserved word"
        )

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not a tenant id under this rule (None: it is one)."""
        if not isinstance(value, str) or not 1 <= len(value) <= self.max_length:
            return self.rule
        if not self._id_re.fullmatch(value) or not _ID_TEXT.fullmatch(value):
            return self.rule
        schema = self.schema(value)
        if (
            value in RESERVED
            or value.startswith("pg_")
            or schema in _RESERVED_SCHEMAS
            or schema.startswith(_TOOL_PREFIXES)
        ):
            return f"reserved name; {self.rule}"
        if not _IDENTIFIER.fullmatch(schema):
            return f"schema {schema!r} would not be a valid identifier; {self.rule}"
        return None

    def check(self, value: object) -> str:
        """``value`` when it is a tenant id; else :class:`InvalidInput`, one line naming the rule
        (a hostile id can be any size: at most its head is echoed)."""
        problem = self.problem(value)
        if problem is None:
            assert isinstance(value, str)
            return value
        text = value if isinstance(value, str) else repr(value)
        shown = repr(text[:60]) + (f" ({len(text)} characters)" if len(text) > 60 else "")
        raise InvalidInput(f"invalid tenant id {shown}: {problem}")

    def schema(self, tenant_id: str) -> str:
        """The schema of a tenant: the pattern with ``{id}`` replaced (the id checked first
        by whoever built it, :class:`provisioner.models.TenantId`)."""
        prefix, suffix = self.parts
        return f"{prefix}{tenant_id}{suffix}"

    def tenant_of(self, schema: str) -> str | None:
        """The tenant id whose schema is ``schema``, or None: a spare, a scratch schema, or a
        schema that is not ours."""
        prefix, suffix = self.parts
        if len(schema) <= len(prefix) + len(suffix):
            return None
        if not (schema.startswith(prefix) and schema.endswith(suffix)):
            return None
        candidate = schema[len(prefix) : len(schema) - len(suffix)]
        return candidate if self.problem(candidate) is None else None

    def accepts(self, schema: str) -> bool:
        """A schema the tenant tree may be run in: a tenant's, or one of the tool's scratch
        schemas (never committed)."""
        return self.tenant_of(schema) is not None or is_scratch(schema)

    def like(self) -> str:
        """A ``LIKE`` pattern every tenant schema matches (a catalog scan's first filter; the
        rows it finds are checked with :meth:`tenant_of`)."""
        prefix, suffix = (re.sub(r"([\\%_])", r"\\\1", part) for part in self.parts)
        return f"{prefix}%{suffix}"

    def describe(self) -> dict[str, object]:
        return {
            "schema_pattern": self.schema_pattern,
            "tenant_id_pattern": self.id_pattern,
            "tenant_id_max_length": self.max_length,
        }
