"""Job kinds: what each job type is, its steps, who drains it.

* :mod:`provisioner.kinds.registry`: :class:`JobKind` (everything a kind is),
  :class:`KindRegistry`, :func:`registry`;
* :mod:`provisioner.kinds.step`: :class:`Step`, :class:`StepContext`, :class:`RunMemo`;
* one module per family of kinds, each defining ``JOB_KINDS`` next to its steps:
  :mod:`~provisioner.kinds.provision`, :mod:`~provisioner.kinds.lifecycle`,
  :mod:`~provisioner.kinds.product`.

Adding a kind is one such module and its tests (``tests/integration/test_job_kinds.py`` adds
one from outside the package, through ``PROVISIONER_JOB_KIND_MODULES``).
"""

from __future__ import annotations

from provisioner.kinds.registry import (
    BUILTIN_MODULES,
    JobKind,
    KindRegistry,
    Scope,
    every_step,
    for_settings,
    keyed_by_tenant,
    registry,
    worker_job_types,
)
from provisioner.kinds.step import RunMemo, Step, StepContext

__all__ = [
    "BUILTIN",
    "BUILTIN_MODULES",
    "JobKind",
    "KindRegistry",
    "RunMemo",
    "Scope",
    "Step",
    "StepContext",
    "every_step",
    "for_settings",
    "keyed_by_tenant",
    "registry",
    "worker_job_types",
]

#: The built-in kinds: the registry of a process that names no kind module.
BUILTIN: KindRegistry = registry()
