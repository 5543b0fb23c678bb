"""Whether an upgrade's offline SQL is all it does: decided by watching Alembic run it once.

A fleet upgrade replays the SQL Alembic's offline mode emits for the new revisions
(:mod:`provisioner.templates.upgrade`). That is only right when the revisions' Python, run
online, does exactly that and nothing more: an ordinary revision (``op.add_column``,
``op.create_index``, ``op.execute("ALTER ...")``) does; one that reads the database and decides
(``bind.execute(select ...)``, an inspector, a data fix that depends on rows) does not.

So no marker is asked of anyone. When the upgrade's reference is computed (once per database,
tree state and starting revision), Alembic runs the revisions online on a scratch schema and
every statement it sends is recorded. The replay is allowed when, after Alembic's own reads of
its version table, the statements sent are exactly the offline script's, in order, none with
bound parameters and none whose rows came back; the verdict is stored with the reference, so
every process follows it, and a refused replay's step record says why.

Invariant: a revision whose online run differs in any statement from its offline SQL, or reads
anything back, never replays. Pinned by ``tests/integration/test_fleet_upgrade.py``
(an unmarked ordinary revision replays; one that reads the database runs through Alembic).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["Recording", "recorded"]

#: Alembic's read of the schema's current revisions: the recording starts after it (what comes
#: before is env.py's settings and Alembic's check that the version table exists).
_HEADS_READ = re.compile(r"^\s*SELECT\s.*\bFROM\s+\S*alembic_version\b", re.I | re.S)
#: Alembic's own writes of the version table, which the replay's script carries as it emits them.
_VERSION_WRITE = re.compile(
    r"^\s*(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+\S*alembic_version\b", re.I
)


@dataclass(frozen=True)
class Statement:
    text: str
    has_parameters: bool
    read_back: bool


@dataclass
class Recording:
    """The statements Alembic sent during an upgrade, as the connection saw them."""

    statements: list[Statement] = field(default_factory=list)

    def _migrations(self) -> list[Statement] | None:
        """What the revisions sent: after Alembic read its heads, its version writes left out
        (None: that read was never seen, so the window cannot be told)."""
        for i, statement in enumerate(self.statements):
            if _HEADS_READ.match(statement.text):
                rest = self.statements[i + 1 :]
                return [s for s in rest if not _VERSION_WRITE.match(s.text)]
        return None

    def refusal(self, offline: Sequence[str], schema: str) -> str | None:
        """Why the offline script must not be replayed (None: it is what Alembic did)."""
        sent = self._migrations()
        if sent is None:
            return "Alembic's run could not be observed (no read of its version table)"
        for statement in sent:
            if statement.read_back:
                return f"a revision reads the database: {_short(statement.text)}"
            if statement.has_parameters:
                return f"a revision sends bound parameters: {_short(statement.text)}"
        online = [_normal(s.text, schema) for s in sent]
        script = [_normal(text, schema) for text in offline if not _VERSION_WRITE.match(text)]
        if online != script:
            first = next(
                (
                    f"{a!r} online, {b!r} offline"
                    for a, b in zip(online, script, strict=False)
                    if a != b
                ),
                f"{len(online)} statements online, {len(script)} offline",
            )
            return f"the offline SQL differs from what Alembic runs: {_short(first)}"
        return None


def _normal(text: str, schema: str) -> str:
    """Whitespace and a final semicolon aside, and the schema's qualifier removed."""
    text = text.replace(f'"{schema}".', "").replace(f"{schema}.", "")
    return " ".join(text.split()).rstrip(";").strip()


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 120 else flat[:117] + "..."


@contextmanager
def recorded(connection: sa.Connection) -> Iterator[Recording]:
    """Record every statement sent on ``connection`` inside the block."""
    import sqlalchemy as sa  # loaded already: ``connection`` is one of its connections

    recording = Recording()

    def after(
        conn: sa.Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        recording.statements.append(
            Statement(
                statement,
                has_parameters=bool(parameters),
                read_back=getattr(cursor, "description", None) is not None,
            )
        )

    sa.event.listen(connection, "after_cursor_execute", after)
    try:
        yield recording
    finally:
        sa.event.remove(connection, "after_cursor_execute", after)
