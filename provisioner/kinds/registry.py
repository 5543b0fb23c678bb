"""The registry of job kinds: what each job type is, which steps it runs, who drains it.

One :class:`JobKind` per job type is the only place a kind is described: its steps, its
idempotency key, the tenant states it refuses, its scope (which steps a job's run covers), the
statements its steps' session prepares ahead, whether the default worker drains it. The
queue's callers (idempotency keys), the engine, the worker's start-up checks and the CLI (step
numbers, progress) all read it; the queue and the engine know no kind by name.

**A kind is one module**: it defines ``JOB_KINDS``, a tuple of :class:`JobKind`, next to its
steps, and has its tests. The built-in kinds are the modules of :data:`BUILTIN_MODULES`
(``provisioner.kinds.provision``, ``.lifecycle``, ``.product``); more come from the modules
named in ``PROVISIONER_JOB_KIND_MODULES``, loaded the same way, which a worker's spawned
children import again from the settings they are given, so they see the same registry as their
parent (``tests/integration/test_job_kinds.py`` is such a module, and its tests).

A kind names its steps by reference (``"module:ATTRIBUTE"``, like an entry point): they are
imported, and checked, the first time the engine asks for them.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from provisioner.db.plans import PlanAhead
from provisioner.errors import ConfigurationError, InvalidInput
from provisioner.kinds.step import RunMemo, Step
from provisioner.models import Job, TenantId
from provisioner.tenant.state import TenantState

if TYPE_CHECKING:
    from provisioner.kinds.placed import PlacedStep
    from provisioner.settings import Settings

#: The modules whose ``JOB_KINDS`` every registry holds, in this order.
BUILTIN_MODULES: tuple[str, ...] = (
    "provisioner.kinds.provision",
    "provisioner.kinds.lifecycle",
    "provisioner.kinds.product",
    "provisioner.kinds.repair",
    "provisioner.kinds.move",
)


class Scope(enum.Enum):
    """Which steps one run of a job covers (a kind's :attr:`JobKind.scope` decides per job)."""

    #: every step: a recorded one is skipped only once the catalog shows its effect, and the
    #: skip is reported
    ALL = "all"
    #: the steps not recorded yet, alone: the recorded ones are trusted without a catalog
    #: check and not reported (a fleet upgrade's re-opened job runs its migration step only)
    PENDING = "pending"


def every_step(job: Job) -> Scope:
    """The usual scope: every run of a job checks every recorded step."""
    return Scope.ALL


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
    refused_states: tuple[TenantState, ...] = ()
    description: str = ""
    #: which steps a run of the job covers (:class:`Scope`), decided from the claimed job
    scope: Callable[[Job], Scope] = every_step
    #: a new memo for each run of a job: what its steps tell the later ones
    memo: Callable[[], RunMemo] = RunMemo
    #: statements its steps run first, prepared ahead on the steps' idle session after a spare
    #: build (values that match nothing: see :mod:`provisioner.db.plans`)
    prepared_plans: tuple[PlanAhead, ...] = ()
    #: statements touching the tables its steps read (``SELECT 1 FROM t WHERE key IS NULL``),
    #: run with the queue's own in the idle sessions' warm-up (:func:`provisioner.queue.warm`)
    warm_touches: tuple[str, ...] = ()
    #: run by the product's worker as the application role (its rows are app_rw's to write, it
    #: keeps no step journal; control c005's row-level security names the same kinds)
    by_application: bool = False
    #: its steps open their own sessions on the servers they need (a move's source and
    #: target), so it runs whichever server the tenant lives on; the engine refuses a kind
    #: with neither this nor placed steps for a tenant on a tenant server (TenantElsewhere)
    any_server: bool = False
    #: ``"module:ATTRIBUTE"`` naming a tuple of :class:`provisioner.kinds.placed.PlacedStep`:
    #: its steps for a tenant on a tenant server (None: such a tenant's job fails at once)
    placed_steps_ref: str | None = None

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
    def placed_steps(self) -> tuple[PlacedStep, ...] | None:
        """The kind's steps on a tenant server (:mod:`provisioner.kinds.placed`), named as its
        steps and in their order; None when it has none."""
        if self.placed_steps_ref is None:
            return None
        module, _, attribute = self.placed_steps_ref.partition(":")
        placed = getattr(importlib.import_module(module), attribute)
        if tuple(getattr(p, "name", None) for p in placed) != self.step_names:
            raise ConfigurationError(f"{self.placed_steps_ref} does not name the kind's steps")
        return tuple(placed)

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

    @property
    def prepared_plans(self) -> tuple[PlanAhead, ...]:
        """Every kind's plans made ahead on the steps' session, each once, in kind order."""
        plans: list[PlanAhead] = []
        for kind in self.kinds.values():
            plans.extend(plan for plan in kind.prepared_plans if plan not in plans)
        return tuple(plans)

    @property
    def application_kinds(self) -> frozenset[str]:
        """The kinds the application role runs (:attr:`JobKind.by_application`)."""
        return frozenset(k.name for k in self.kinds.values() if k.by_application)

    @property
    def warm_touches(self) -> tuple[str, ...]:
        """Every kind's warm-up touches, each once, in kind order."""
        return tuple(dict.fromkeys(t for kind in self.kinds.values() for t in kind.warm_touches))

    def check(self, names: Iterable[str]) -> None:
        """InvalidInput for an unknown kind, or for none at all."""
        names = list(names)
        unknown = sorted(set(names) - self.names)
        if unknown:
            raise InvalidInput(
                f"unsupported job type(s) {', '.join(name[:63] for name in unknown[:10])}; "
                f"supported: {', '.join(sorted(self.names))}"
            )
        if not names:
            raise InvalidInput("at least one job type is required")


def _kinds_of(name: str) -> tuple[JobKind, ...]:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import job kind module {name} (PROVISIONER_JOB_KIND_MODULES): {exc}"
        ) from None
    found = getattr(module, "JOB_KINDS", None)
    if not isinstance(found, tuple) or not all(isinstance(k, JobKind) for k in found):
        raise ConfigurationError(f"job kind module {name} has no JOB_KINDS tuple of JobKind")
    return found


def registry(modules: Iterable[str] = ()) -> KindRegistry:
    """The built-in kinds plus the ``JOB_KINDS`` of each importable module in ``modules``."""
    found: dict[str, JobKind] = {}
    for name in dict.fromkeys((*BUILTIN_MODULES, *modules)):
        for kind in _kinds_of(name):
            if kind.name in found and found[kind.name] != kind:
                raise ConfigurationError(f"job type {kind.name} is registered twice")
            found[kind.name] = kind
    return KindRegistry(found)


def for_settings(settings: Settings) -> KindRegistry:
    """The job kinds a process with these settings knows: the built-in ones and those of
    ``settings.job_kind_modules`` (a worker's spawned children build it again from the same
    settings, and so see the same kinds)."""
    return registry(settings.job_kind_modules)


def worker_job_types(settings: Settings) -> tuple[str, ...]:
    """What a worker with these settings drains: ``PROVISIONER_WORKER_JOB_TYPES``, else (the
    settings' empty tuple) the registry's default kinds."""
    return settings.worker_job_types or for_settings(settings).default_worker
