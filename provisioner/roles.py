"""The application roles a project grants in each tenant schema, each with its privilege set.

A product often connects as more than one role: ``app_rw`` for the application's reads and
writes, ``app_ro`` for reports or a read replica's users. Each configured role gets its set's
privileges in every tenant at provision (and when a spare is taken), loses them all at suspend,
gets them back at restore, and the drift check compares each role's privileges with its set::

    # provisioner.toml
    [app_roles]
    app_rw = "readwrite"
    app_ro = "readonly"

or ``PROVISIONER_APP_ROLES="app_rw=readwrite,app_ro=readonly"``. The older single-role setting
(``app_role`` / ``PROVISIONER_APP_ROLE=NAME``) still works and means ``{NAME: readwrite}``;
setting both is refused. The default is ``app_rw`` with ``readwrite``.

This module only holds the values and their parsing: the grants themselves are composed in
:mod:`provisioner.tenant.schema`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from provisioner.errors import ConfigurationError

__all__ = [
    "APP_ROLES_ENV",
    "APP_ROLE_ENV",
    "DEFAULT_APP_ROLES",
    "AppRole",
    "AppRoles",
    "Privileges",
    "control_role",
    "from_env",
    "from_mapping",
    "identity",
    "parse",
    "render",
]

#: The variable of the list of roles, and the older one of a single readwrite role.
APP_ROLES_ENV = "PROVISIONER_APP_ROLES"
APP_ROLE_ENV = "PROVISIONER_APP_ROLE"

#: A role name as the settings accept it: an unquoted lower-case SQL identifier (it reaches SQL
#: only through ``psycopg.sql.Identifier``; the rule keeps ``,`` and ``=`` out of the list form).
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class Privileges(StrEnum):
    """What a role may do with a tenant's rows. Neither set ever holds CREATE on the schema or
    a write on its version table."""

    #: USAGE on the schema; SELECT, INSERT, UPDATE, DELETE on its tables; USAGE and SELECT on
    #: its sequences (and the same as default privileges, for what later revisions create)
    READWRITE = "readwrite"
    #: USAGE on the schema; SELECT on its tables and sequences; nothing else
    READONLY = "readonly"

    @property
    def table_privileges(self) -> tuple[str, ...]:
        if self is Privileges.READWRITE:
            return ("SELECT", "INSERT", "UPDATE", "DELETE")
        return ("SELECT",)

    @property
    def sequence_privileges(self) -> tuple[str, ...]:
        if self is Privileges.READWRITE:
            return ("USAGE", "SELECT")
        return ("SELECT",)

    @property
    def table_forbidden(self) -> tuple[str, ...]:
        """Table privileges the role must not hold (the drift it is checked for)."""
        if self is Privileges.READWRITE:
            return ()
        return ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")

    @property
    def sequence_forbidden(self) -> tuple[str, ...]:
        """Sequence privileges the role must not hold (``nextval`` needs USAGE or UPDATE)."""
        if self is Privileges.READWRITE:
            return ()
        return ("USAGE", "UPDATE")


@dataclass(frozen=True)
class AppRole:
    """One application role and its privilege set."""

    name: str
    privileges: Privileges = Privileges.READWRITE

    def __str__(self) -> str:
        return f"{self.name}={self.privileges}"


AppRoles = tuple[AppRole, ...]

DEFAULT_APP_ROLES: AppRoles = (AppRole("app_rw", Privileges.READWRITE),)


def control_role(roles: AppRoles) -> AppRole:
    """The role the application connects as (``APP_DATABASE_URL``) to enqueue: the control
    revisions grant it the queue's privileges, and the worker checks that URL reaches it. The
    first readwrite role (the first role when none is readwrite)."""
    return next((r for r in roles if r.privileges is Privileges.READWRITE), roles[0])


def render(roles: AppRoles) -> str:
    """The roles as :data:`APP_ROLES_ENV` spells them: ``app_rw=readwrite,app_ro=readonly``."""
    return ",".join(str(role) for role in roles)


def identity(roles: AppRoles) -> str:
    """What the roles grant, whatever order they were written in (``app_ro=readonly,
    app_rw=readwrite``): recorded with what was built for a role set (a warm spare, an upgrade's
    reference), so that a build for another set is told apart and never used."""
    return ",".join(sorted(str(role) for role in roles))


def parse(raw: str, where: str = APP_ROLES_ENV) -> AppRoles:
    """``name=set,name=set`` (a name alone means readwrite); one line naming ``where`` when an
    entry is not a role name, a set is unknown, a name is repeated or the list is empty."""
    roles: list[AppRole] = []
    for entry in (item.strip() for item in raw.split(",")):
        if not entry:
            continue
        name, sep, value = (part.strip() for part in entry.partition("="))
        roles.append(_role(name, value if sep else Privileges.READWRITE.value, where))
    return _checked(tuple(roles), where)


def from_mapping(table: Mapping[str, object], where: str) -> AppRoles:
    """A TOML ``[app_roles]`` table (role name -> set) as roles, checked as :func:`parse`."""
    roles = []
    for name, value in table.items():
        if not isinstance(value, str):
            raise ConfigurationError(
                f"{where}: the privilege set of {name!r} must be a string "
                f"({_sets()}), got {value!r}"
            )
        roles.append(_role(name, value, where))
    return _checked(tuple(roles), where)


def from_env(env: Mapping[str, str]) -> AppRoles:
    """The configured roles: :data:`APP_ROLES_ENV`, else :data:`APP_ROLE_ENV` as one readwrite
    role, else :data:`DEFAULT_APP_ROLES`; both set is refused (which one would be meant?)."""
    many, one = env.get(APP_ROLES_ENV) or "", env.get(APP_ROLE_ENV) or ""
    if many and one:
        raise ConfigurationError(
            f"{APP_ROLE_ENV} and {APP_ROLES_ENV} (app_role and app_roles) are both set: keep "
            f"only {APP_ROLES_ENV}, e.g. {one.strip()[:63]}=readwrite"
        )
    if many:
        return parse(many)
    if one:
        return _checked((_role(one.strip(), Privileges.READWRITE.value, APP_ROLE_ENV),), "")
    return DEFAULT_APP_ROLES


def _role(name: str, value: str, where: str) -> AppRole:
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"{where}: {name[:70]!r} is not a role name (lower-case letters, digits and '_', "
            "starting with a letter or '_', at most 63 characters)"
        )
    try:
        return AppRole(name, Privileges(value.strip().lower()))
    except ValueError:
        raise ConfigurationError(
            f"{where}: role {name} has unknown privilege set {value[:40]!r} ({_sets()})"
        ) from None


def _checked(roles: AppRoles, where: str) -> AppRoles:
    if not roles:
        raise ConfigurationError(f"{where} names no role: e.g. app_rw=readwrite")
    names = [role.name for role in roles]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigurationError(f"{where} names role {repeated[0]} more than once")
    return roles


def _sets() -> str:
    return " or ".join(p.value for p in Privileges)
