"""The one exception tree of the package, with the CLI exit code on each class.

    ProvisionerError (exit 1)
    ├── InvalidInput (2)            bad tenant id, unknown job type, bad flag value
    ├── ConfigurationError (2)      settings that cannot work (missing URL, unknown provider)
    │   ├── NoServerRoom (2)        no tenant server takes the new tenant (draining, full, ...)
    │   └── ServerUnready (2)       an active tenant server a worker cannot use (refused start)
    ├── WrongState (2)              the tenant's lifecycle state does not allow the command
    ├── UnknownTenant (3)           no control row and no job for that tenant
    ├── UnknownJob (3)              no job with that id
    ├── UnknownServer (3)           no tenant server of that name in the directory
    ├── LeaseLost (1)               another process took this job over; record nothing
    ├── TenantBusy (1)              another live engine works on this tenant right now
    ├── KeyConflict (1)             an idempotency key is held by another tenant's or kind's job
    ├── StepFailed (1)              a job's step raised; the cause is chained, the step named
    ├── DatabaseError (1)           a statement failed (provisioner.db.translate raises it)
    ├── TemplateUnusable (1)        the tenant tree cannot be replayed (Alembic runs instead)
    ├── NotReplayable (1)           an upgrade cannot be replayed (Alembic runs instead)
    ├── SpareRejected (1)           a spare built for the warm pool did not verify
    ├── BuildStopped (1)            a spare build was asked to stop between transactions
    ├── TransientError (1)          worth retrying later: the queue's backoff handles it
    │   ├── DatabaseUnavailable
    │   │   ├── LockNotAvailable    SQLSTATE 55P03: a lock timeout (provisioner.db.translate)
    │   │   └── ConnectionLost      the session went away (crash, failover, restart, network)
    │   └── StorageUnavailable
    └── PermanentError (1)          retrying cannot help until someone changes something
        ├── StorageMisconfigured
        ├── GrantVerificationFailed
        ├── StatementRejected       a migration or seed the server refused for good (22, 23, 42)
        ├── SeedUnusable            a declared seed cannot be read or imported
        └── TenantElsewhere         the tenant is on a tenant server; its kind runs on control only

Retry decisions use ``isinstance`` on these classes, never the message text
(:func:`is_permanent` says which failures fail a job at once). Messages never carry secrets:
adapters redact before raising. The CLI prints ``error: <message>`` and exits with the class's
``exit_code`` (:func:`provisioner.cli.render.fail_cleanly`).

Outside the tree, on purpose (``tests/unit/test_errors.py`` holds every other class to it):

    KeyboardInterrupt
    └── provisioner.worker.processes.Interrupted   a worker child's drain timeout expired

``Interrupted`` is a signal, not a failure: it must be a ``KeyboardInterrupt`` so that psycopg
cancels the running query, and so that no ``except Exception`` (the engine's, the runner's)
mistakes it for a step's failure; the child catches it in one place and hands the job back.
Builtin errors the package raises are programming mistakes, not conditions a caller handles
(``Job.lease`` of a job nobody claimed raises ``LookupError``).
"""

from __future__ import annotations


class ProvisionerError(Exception):
    """Root of every error this package raises on purpose."""

    exit_code = 1


class InvalidInput(ProvisionerError):
    """The caller gave a value that breaks a documented rule."""

    exit_code = 2


class ConfigurationError(ProvisionerError):
    """The settings cannot work; nothing was attempted."""

    exit_code = 2


class WrongState(ProvisionerError):
    """The tenant's state (``control.tenants.state``) does not allow this command or step.

    Also permanent for a job: a step that meets it fails at once, without retries."""

    exit_code = 2


class NoServerRoom(ConfigurationError):
    """Placement found no tenant server for a new tenant: the one named is unknown, not
    active or at its capacity, or every server is. Nothing was created (the enqueue's
    transaction fails with it)."""

    exit_code = 2


class ServerUnready(ConfigurationError):
    """An active tenant server a worker cannot use: unreachable or without credentials, its
    owner role a superuser, or the tool's schema there behind this build (``provisioner
    migrate`` applies it): the worker refuses to start, in one line."""

    exit_code = 2


class UnknownTenant(ProvisionerError):
    """No control row and no job exists for the tenant."""

    exit_code = 3


class UnknownJob(ProvisionerError):
    """No job with the given id exists."""

    exit_code = 3


class UnknownServer(ProvisionerError):
    """No tenant server of that name is in the directory (``control.tenant_servers``)."""

    exit_code = 3


class LeaseLost(ProvisionerError):
    """The job row is no longer ours (recovered, re-claimed or cancelled): write nothing."""


class TenantBusy(ProvisionerError):
    """Another live process holds this tenant's job."""


class KeyConflict(ProvisionerError):
    """The idempotency key is held by a job of another tenant or kind: nothing was queued."""


class StepFailed(ProvisionerError):
    """A step (or the resume check before the steps) raised; the cause is chained, and
    ``step`` names where it happened."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


class DatabaseError(ProvisionerError):
    """A statement failed for a reason other than connectivity (retried with backoff)."""


class TemplateUnusable(ProvisionerError):
    """The tree's offline SQL cannot be replayed into another schema (internal to the fast path:
    Alembic runs instead)."""


class NotReplayable(ProvisionerError):
    """The revisions between a schema's version and the head cannot be replayed (internal to
    the upgrade's fast path: Alembic runs instead)."""


class SpareRejected(ProvisionerError):
    """A freshly built spare did not match the reference (it was rolled back)."""


class BuildStopped(ProvisionerError):
    """A spare build was asked to stop between two of its transactions (its schema dropped)."""


class TransientError(ProvisionerError):
    """A failure that may go away by itself: retry with backoff."""


class DatabaseUnavailable(TransientError):
    """The database could not be reached or dropped the connection."""


class LockNotAvailable(DatabaseUnavailable):
    """A statement gave up waiting for a lock (``lock_timeout``, SQLSTATE 55P03): another
    session holds it. Retried later like an outage, never worked around (another path would
    wait for the same lock)."""


class ConnectionLost(DatabaseUnavailable):
    """The session to the server was lost or could not be opened: the server crashed, failed
    over, restarted or shut down, or the network dropped. No fault of the work in flight: a
    job attempt cut this way is retried at once, without the backoff (queue.FAIL_OR_RETRY)."""


class StorageUnavailable(TransientError):
    """The object store could not be reached, timed out, throttled or answered 5xx."""


class PermanentError(ProvisionerError):
    """A failure that will repeat until an operator changes something: fail the job at once."""


class StorageMisconfigured(PermanentError):
    """The bucket or container is missing, or the credentials are refused."""


class GrantVerificationFailed(PermanentError):
    """After granting, the application role still lacks a privilege it needs."""


class StatementRejected(PermanentError):
    """A tenant migration or a seed failed with an error a retry cannot change: a syntax error
    or an undefined object (SQLSTATE class 42), a data exception (22), a constraint violation
    (23). The message names the revision or the seed file and the server's message; the job
    fails at once instead of spending its attempts (and a rollout's failure budget) on it."""


class SeedUnusable(PermanentError):
    """A declared seed cannot be used: a missing folder or file, a ``module:function`` that
    does not import or is not callable."""


class TenantElsewhere(PermanentError):
    """The job's tenant was placed on a tenant server (``control.tenants.server``), and the
    job's kind has no steps for a tenant server (:attr:`provisioner.kinds.JobKind.placed_steps`):
    the job fails at once rather than run in the wrong database."""


def is_permanent(exc: BaseException) -> bool:
    """True for a failure that fails its job at once, without retries: a permanent error, a
    value that breaks a rule, a tenant state that refuses the job. Everything else is retried
    with backoff until the job's attempts run out."""
    return isinstance(exc, PermanentError | InvalidInput | WrongState)
