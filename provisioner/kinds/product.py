"""The product worker's kinds: they share the queue, and another program runs them (as the
application role); this build has no handler for them, so it never claims one, and knows their
names only to refuse or list them."""

from __future__ import annotations

from provisioner.kinds.registry import JobKind

#: The job types the product worker runs as app_rw; every other kind is the owner's (control
#: c005 lists the same names in its row-level security policies).
PRODUCT_JOB_TYPES: frozenset[str] = frozenset(
    {"train_tenant_model", "materialize_insights", "send_email"}
)

JOB_KINDS: tuple[JobKind, ...] = tuple(
    JobKind(name, by_application=True) for name in sorted(PRODUCT_JOB_TYPES)
)
