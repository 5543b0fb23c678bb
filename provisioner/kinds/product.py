"""The product worker's kinds: they share the queue, and another program runs them (as the
application role); this build has no handler for them, so it never claims one, and knows their
names only to refuse or list them."""

from __future__ import annotations

from provisioner.kinds.registry import JobKind
from provisioner.models import PRODUCT_JOB_TYPES

JOB_KINDS: tuple[JobKind, ...] = tuple(JobKind(name) for name in sorted(PRODUCT_JOB_TYPES))
