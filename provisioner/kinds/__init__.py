"""The registry of job kinds: what each job type is, which steps it runs, who drains it.

One :class:`JobKind` per job type is the only place a kind is described. The queue's callers
(idempotency keys), the engine (the steps and their order), the worker's start-up checks (which
kinds this build can run, which the default worker drains), the settings (the default
``PROVISIONER_WORKER_JOB_TYPES``) and the CLI (step numbers, progress) all read it; the queue
module itself knows nothing about any kind.

A kind names its steps by reference (``"module:ATTRIBUTE"``, like an entry point) so that this
module stays light: the settings import it, and the step modules import the database and the
object store. Adding a kind means one :class:`JobKind` entry, its step functions, its tests.
Built-in kinds are listed in :data:`BUILTIN_KINDS`; more come from the modules named in
``PROVISIONER_JOB_KIND_MODULES`` (each defines ``JOB_KINDS``), which a worker's spawned children
import again from the settings they are given, so they see the same registry as their parent.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from provisioner.errors import ConfigurationError, InvalidInput
from provisioner.models import PROVISION_JOB_TYPE, TenantId

if TYPE_CHECKING:
    from provisioner.db import Transaction
    from provisioner.storage import ObjectStore
    from provisioner.templates.replay import TemplateCache
    from provisioner.templates.upgrade import UpgradeCache


def _new_template_cache() -> TemplateCache:
    """A fresh cache for a context built without an engine's (imported late: it loads the
    template reference machinery, which this light module must not)."""
    from provisioner.templates.replay import TemplateCache

    return TemplateCache()


def _new_upgrade_cache() -> UpgradeCache:
    """A fresh upgrade cache for a context built without an engine's (imported late)."""
    from provisioner.templates.upgrade import UpgradeCache

    return UpgradeCache()


@dataclass
class RunMemo:
    """What a step of one run of a job learned for the later steps of the same run. Never
    carried to another run: a resumed job starts knowing nothing, and its steps look again."""

    #: create_schema took a spare (True) or created the schema (False); None: not run here
    spare_taken: bool | None = None
    #: the taken spare carried every grant but USAGE (read by the take, before its rename)
    spare_grants_in_place: bool = False
    #: set by a step: the run's later steps join its transaction, each with its own checkpoint,
    #: and commit together or not at all (the engine reads it after each step)
    one_transaction: bool = False


@dataclass(frozen=True)
class StepContext:
    """What a step may use besides its transaction."""

    tenant: TenantId
    app_role: str
    store: ObjectStore
    #: the engine's template cache (the verified replay's references)
    templates: TemplateCache = field(default_factory=_new_template_cache)
    #: the engine's fleet upgrade cache (the verified replay of new revisions in place)
    upgrades: UpgradeCache = field(default_factory=_new_upgrade_cache)
    #: how long a migration waits for a table lock (PROVISIONER_LOCK_TIMEOUT_SECONDS)
    lock_timeout_ms: int = 5000
    #: this run's memo (a new one per run of a job)
    memo: RunMemo = field(default_factory=RunMemo)


@dataclass(frozen=True)
class Step:
    """One resumable unit of work: ``run`` in the engine's transaction, and the catalog check
    (``effect_present``) that decides whether a recorded step may be skipped."""

    name: str
    run: Callable[[Transaction, StepContext], str | None]
    effect_present: Callable[[Transaction, StepContext], bool]
    #: False for a step that touches no database (it has no catalog to consult).
    uses_database: bool = True


def keyed_by_tenant(kind: str) -> Callable[[TenantId], str]:
    """The usual idempotency key: one job of ``kind`` per tenant, re-opened for each request."""

    def key(tenant: TenantId) -> str:
        return f"{kind}:{tenant.value}"

    return key


@dataclass(frozen=True)
class JobKind:
    """One job type. ``steps_ref`` is ``"module:ATTRIBUTE"`` naming a tuple of :class:`Step`;
    None for a kind another program's worker runs (it shares the queue, this build has no
    handler for it)."""

    name: str
    steps_ref: str | None = None
    #: the job's idempotency key for a tenant; None: every enqueue makes a new job
    idempotency_key: Callable[[TenantId], str] | None = None
    #: drained by a worker started without PROVISIONER_WORKER_JOB_TYPES
    default_worker: bool = False
    #: the CLI command that runs it in the foreground (for history and help)
    command: str | None = None
    #: tenant states (control.tenants.state) in which a job of this kind fails at once, without
    #: running a step: whoever queued it, provisioning never gives a suspended, archived or
    #: deleted tenant its access back
    refused_states: tuple[str, ...] = ()
    description: str = ""

    @property
    def handled(self) -> bool:
        """True when this build can run the kind."""
        return self.steps_ref is not None

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        """The kind's steps, in the order they run (imported and checked on first use; the
        engine asks for them several times per job)."""
        if self.steps_ref is None:
            raise ConfigurationError(f"job type {self.name} has no handler in this build")
        module, _, attribute = self.steps_ref.partition(":")
        steps = getattr(importlib.import_module(module), attribute)
        if not isinstance(steps, tuple) or not all(isinstance(s, Step) for s in steps):
            raise ConfigurationError(f"{self.steps_ref} is not a tuple of Step")
        return steps

    @cached_property
    def step_names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    def ordered(self, done: Iterable[str]) -> list[str]:
        """The recorded steps in the kind's order; names it does not know are refused, not
        dropped (a silent drop would lose work on the next resume)."""
        names = self.step_names
        done = list(done)
        unknown = sorted(set(done) - set(names))
        if unknown:
            raise InvalidInput(f"job type {self.name} has no step(s) {', '.join(unknown)}")
        return [name for name in names if name in done]

    def progress(self, done: Iterable[str]) -> int:
        """Percentage of the kind's steps recorded, rounded down."""
        names = self.step_names
        return len(set(done) & set(names)) * 100 // len(names) if names else 100

    def position(self, step: str) -> tuple[int, int]:
        """(1-based index of ``step``, number of steps), for "[2/6]" style output."""
        names = self.step_names
        return (names.index(step) + 1 if step in names else 0), len(names)


#: The provisioner's own kinds, and the product worker's kinds that share the queue.
BUILTIN_KINDS: tuple[JobKind, ...] = (
    JobKind(
        PROVISION_JOB_TYPE,
        "provisioner.kinds.provision:PROVISION_STEPS",
        idempotency_key=keyed_by_tenant("provision"),
        default_worker=True,
        command="provision",
        refused_states=("suspended", "archived", "deleted"),
        description="create, migrate, grant, seed, check storage, start onboarding",
    ),
    JobKind(
        "suspend_tenant",
        "provisioner.kinds.lifecycle:SUSPEND_STEPS",
        idempotency_key=keyed_by_tenant("suspend_tenant"),
        command="suspend",
        description="revoke the application role's access; data untouched",
    ),
    JobKind(
        "restore_tenant",
        "provisioner.kinds.lifecycle:RESTORE_STEPS",
        idempotency_key=keyed_by_tenant("restore_tenant"),
        command="restore",
        description="grant the application role's access again; back to the earlier state",
    ),
    JobKind(
        "deprovision_tenant",
        "provisioner.kinds.lifecycle:DEPROVISION_STEPS",
        idempotency_key=keyed_by_tenant("deprovision_tenant"),
        command="deprovision",
        description="revoke access and archive; data kept, restorable",
    ),
    JobKind(
        "purge_tenant",
        "provisioner.kinds.lifecycle:PURGE_STEPS",
        idempotency_key=keyed_by_tenant("purge_tenant"),
        command="deprovision --purge",
        description="revoke access and drop the schema; control rows and history kept",
    ),
    JobKind("train_tenant_model"),
    JobKind("materialize_insights"),
    JobKind("send_email"),
)


@dataclass(frozen=True)
class KindRegistry:
    """Every kind this process knows, by name; immutable, built from the settings."""

    kinds: Mapping[str, JobKind] = field(default_factory=dict)

    def __getitem__(self, name: str) -> JobKind:
        try:
            return self.kinds[name]
        except KeyError:
            raise InvalidInput(
                f"unsupported job type {name}; supported: {', '.join(sorted(self.kinds))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self.kinds

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.kinds)

    @property
    def handled(self) -> frozenset[str]:
        """The kinds this build has steps for."""
        return frozenset(k.name for k in self.kinds.values() if k.handled)

    @property
    def default_worker(self) -> tuple[str, ...]:
        """What a worker drains when PROVISIONER_WORKER_JOB_TYPES is not set."""
        return tuple(k.name for k in self.kinds.values() if k.default_worker)

    def check(self, names: Iterable[str]) -> None:
        """InvalidInput for an unknown kind, or for none at all."""
        names = list(names)
        unknown = sorted(set(names) - self.names)
        if unknown:
            raise InvalidInput(
                f"unsupported job type(s) {', '.join(unknown)}; supported: "
                f"{', '.join(sorted(self.names))}"
            )
        if not names:
            raise InvalidInput("at least one job type is required")


def registry(modules: Iterable[str] = ()) -> KindRegistry:
    """The built-in kinds plus the ``JOB_KINDS`` of each importable module in ``modules``."""
    found: dict[str, JobKind] = {kind.name: kind for kind in BUILTIN_KINDS}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(
                f"cannot import job kind module {name} (PROVISIONER_JOB_KIND_MODULES): {exc}"
            ) from None
        extra = getattr(module, "JOB_KINDS", None)
        if not isinstance(extra, tuple) or not all(isinstance(k, JobKind) for k in extra):
            raise ConfigurationError(f"job kind module {name} has no JOB_KINDS tuple of JobKind")
        for kind in extra:
            if kind.name in found and found[kind.name] != kind:
                raise ConfigurationError(f"job type {kind.name} is registered twice")
            found[kind.name] = kind
    return KindRegistry(found)


BUILTIN = registry()
