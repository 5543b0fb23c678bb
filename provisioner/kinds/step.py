"""What a step is, and what it is given: :class:`Step`, :class:`StepContext`, :class:`RunMemo`.

A step has ``run`` (do the work inside the engine's transaction) and ``effect_present`` (read
the catalog: is the work still there?). The engine skips a recorded step only when its effect
is present; a step whose effect vanished (a dropped schema, revoked grants) runs again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from provisioner.models import TenantId
from provisioner.roles import AppRoles

if TYPE_CHECKING:
    from provisioner.db import Transaction
    from provisioner.storage import ObjectStore
    from provisioner.templates.replay import TemplateCache
    from provisioner.templates.upgrade import UpgradeCache


def _new_template_cache() -> TemplateCache:
    """A fresh cache for a context built without an engine's (imported late: it loads the
    template reference machinery, which this module needs only for a context's default)."""
    from provisioner.templates.replay import TemplateCache

    return TemplateCache()


def _new_upgrade_cache() -> UpgradeCache:
    """A fresh upgrade cache for a context built without an engine's (imported late)."""
    from provisioner.templates.upgrade import UpgradeCache

    return UpgradeCache()


@dataclass
class RunMemo:
    """What a step of one run of a job learned for the later steps of the same run. Never
    carried to another run: a resumed job starts knowing nothing, and its steps look again.

    A kind whose steps tell each other more subclasses it (the provisioning kind's
    :class:`provisioner.kinds.provision.SpareMemo`) and names the subclass as its
    :attr:`provisioner.kinds.JobKind.memo`."""

    #: set by a step: the run's later steps join its transaction, each with its own checkpoint,
    #: and commit together or not at all (the engine reads it after each step)
    one_transaction: bool = False


@dataclass(frozen=True)
class StepContext:
    """What a step may use besides its transaction."""

    tenant: TenantId
    #: the application roles granted in the tenant, each with its privilege set
    app_roles: AppRoles
    store: ObjectStore
    #: the engine's template cache (the verified replay's references)
    templates: TemplateCache = field(default_factory=_new_template_cache)
    #: the engine's fleet upgrade cache (the verified replay of new revisions in place)
    upgrades: UpgradeCache = field(default_factory=_new_upgrade_cache)
    #: how long a migration waits for a table lock (PROVISIONER_LOCK_TIMEOUT_SECONDS)
    lock_timeout_ms: int = 5000
    #: the project's declared seeds (PROVISIONER_SEEDS; empty: the tenant tree's seeds/ folder)
    seeds: tuple[str, ...] = ()
    #: this run's memo (a new one per run of a job: the kind's :attr:`JobKind.memo`)
    memo: RunMemo = field(default_factory=RunMemo)
    #: the owner's address, for a step that opens sessions of its own on other servers (a
    #: move's); never shown
    owner_url: str = field(default="", repr=False)
    #: the warm pool is on (PROVISIONER_POOL_SIZE > 0): off, a step on a tenant server neither
    #: claims a spare on control nor forgets one (no round trip of the pool's in a sign-up)
    pool: bool = True


@dataclass(frozen=True)
class Step:
    """One resumable unit of work: ``run`` in the engine's transaction, and the catalog check
    (``effect_present``) that decides whether a recorded step may be skipped."""

    name: str
    run: Callable[[Transaction, StepContext], str | None]
    effect_present: Callable[[Transaction, StepContext], bool]
    #: False for a step that touches no database (it has no catalog to consult).
    uses_database: bool = True
    #: True for a step whose work runs on sessions or processes of its own, for longer than
    #: the engine's idle timeout, while its transaction waits (a move's copy): the engine keeps
    #: that transaction alive meanwhile (:func:`provisioner.db.kept_alive`).
    works_elsewhere: bool = False
