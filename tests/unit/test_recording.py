"""The replay's verdict from a recorded Alembic run (provisioner.templates.recording): allowed
only when what the revisions sent is the offline script, with nothing read back."""

from __future__ import annotations

from provisioner.templates.recording import Recording, Statement

HEADS = Statement("SELECT alembic_version.version_num FROM s.alembic_version", False, True)
BEFORE = Statement("SELECT set_config('lock_timeout', %(t)s, true)", True, True)
VERSION = Statement("UPDATE s.alembic_version SET version_num=%(v)s", True, False)
ADD = Statement("ALTER TABLE t ADD COLUMN c TEXT", False, False)
OFFLINE = ["ALTER TABLE t ADD COLUMN c TEXT;", "UPDATE alembic_version SET version_num='b';"]


def test_the_same_statements_replay() -> None:
    assert Recording([BEFORE, HEADS, ADD, VERSION]).refusal(OFFLINE, "s") is None


def test_a_read_back_a_parameter_or_another_statement_is_refused() -> None:
    read = Statement("SELECT count(*) FROM t", False, True)
    refused = Recording([HEADS, read, ADD, VERSION]).refusal(OFFLINE, "s")
    assert refused == "a revision reads the database: SELECT count(*) FROM t"
    bound = Statement("UPDATE t SET c = %(c)s", True, False)
    assert "bound parameters" in (Recording([HEADS, bound, ADD]).refusal(OFFLINE, "s") or "")
    other = Statement("ALTER TABLE t ADD COLUMN d TEXT", False, False)
    assert "differs" in (Recording([HEADS, other, VERSION]).refusal(OFFLINE, "s") or "")
    assert "differs" in (Recording([HEADS, ADD, ADD]).refusal(OFFLINE, "s") or "")


def test_a_run_whose_version_read_was_not_seen_is_refused() -> None:
    assert "could not be observed" in (Recording([ADD]).refusal(OFFLINE, "s") or "")
