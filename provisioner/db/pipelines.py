"""Pipeline mode, left cleanly when a statement in it fails.

psycopg's ``with conn.pipeline():`` sends a Sync on the way out and reads back every result
still due. When a statement in the block failed, the server answers each later statement with
*pipeline aborted*; whether those answers were read before the error reached Python, or are
still in flight when the block is left, is a race. In flight, psycopg's exit raises
``PipelineAborted``, cannot raise it over the block's own error, and logs it instead as a
warning (``error ignored terminating <psycopg.Pipeline [INERROR] ...>: pipeline aborted``), which
lands on a command's stderr beside its one-line error in some runs and not in others.

:func:`pipeline` and :func:`async_pipeline` read those answers inside the block (a Sync of their
own, whose *pipeline aborted* errors are the first error's consequences and are dropped), so the
exit has nothing left to report, and the error raised is always the first statement's own.
Pinned by ``tests/integration/test_operations_hardening.py::
test_a_failed_pipeline_is_left_cleanly_every_time``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg

#: Syncs tried after an error: the first reads what was in flight, a second what the first
#: could not (psycopg stops reading at the first error it meets while sending).
_SYNCS = 3


@contextmanager
def pipeline(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Pipeline]:
    """``conn.pipeline()`` whose exit never meets an answer left over from a failed statement;
    the block's exception is re-raised as it was."""
    failure: Exception | None = None
    with conn.pipeline() as pipe:
        try:
            yield pipe
        except Exception as exc:
            failure = exc
            _drain(conn, pipe)
    if failure is not None:
        raise failure


def _drain(conn: psycopg.Connection[Any], pipe: psycopg.Pipeline) -> None:
    for _ in range(_SYNCS):
        if conn.broken:
            return  # nothing to read from a lost connection; psycopg's exit skips it too
        try:
            pipe.sync()
        except psycopg.Error:
            continue  # the aborted statements' answers: the first error's consequences
        return


@asynccontextmanager
async def async_pipeline(
    conn: psycopg.AsyncConnection[Any],
) -> AsyncIterator[psycopg.AsyncPipeline]:
    """:func:`pipeline` for an async connection."""
    failure: Exception | None = None
    async with conn.pipeline() as pipe:
        try:
            yield pipe
        except Exception as exc:
            failure = exc
            await _async_drain(conn, pipe)
    if failure is not None:
        raise failure


async def _async_drain(conn: psycopg.AsyncConnection[Any], pipe: psycopg.AsyncPipeline) -> None:
    for _ in range(_SYNCS):
        if conn.broken:
            return
        try:
            await pipe.sync()
        except psycopg.Error:
            continue
        return
