"""Addresses in every libpq form: redacted whatever the password holds, and re-aimed at another
role without being re-parsed into something libpq reads differently."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from provisioner.db import libpq_address, with_role
from provisioner.db.conninfo import KEEPALIVES, keepalive_args
from provisioner.kinds.move_copy import Passwords
from provisioner.redact import redact
from provisioner.servers.moves import End
from provisioner.settings import Settings

PASSWORD = "p@ss:w/rd='q' \\ x y=z"


@pytest.mark.parametrize(
    "address",
    [
        f"postgresql://owner:{quote(PASSWORD, safe='')}@h1:5432,h2:5433/app"
        "?target_session_attrs=read-write",
        make_conninfo("", host="h1,h2", port="5432,5433", user="owner", password=PASSWORD),
        f'host=h1 password="{PASSWORD}" user=owner',
        f"postgresql://owner@h1,h2/app?password={quote(PASSWORD, safe='')}&sslmode=require",
    ],
    ids=["multi-host URL", "key=value quoted", "double-quoted", "URL parameter"],
)
def test_redact_hides_the_password_of_every_form(address: str) -> None:
    shown = redact(f"could not connect with {address}: refused")
    for piece in (PASSWORD, quote(PASSWORD, safe=""), "p@ss", "w/rd", "rd='q'", "x y=z"):
        assert piece not in shown, shown
    assert "owner" in shown and "refused" in shown


def test_every_form_passes_the_settings_check() -> None:
    for address in (
        "postgresql://u@h1:5432,h2:5433/app?target_session_attrs=read-write",
        "postgresql://?service=prod",
        "service=prod",
        make_conninfo("", host="h1,h2", port="1,2", user="u", password=PASSWORD),
    ):
        assert Settings(migrations_database_url=address).owner_url == address


def test_with_role_keeps_hosts_and_parameters_and_drops_the_password() -> None:
    url = (
        f"postgresql+psycopg://admin:{quote(PASSWORD, safe='')}@h1:1,h2:2/postgres"
        "?target_session_attrs=read-write&user=x"
    )
    assert with_role(url, "app_rw", "db") == (
        "postgresql://app_rw@h1:1,h2:2/db?target_session_attrs=read-write"
    )
    kv = make_conninfo("", service="prod", password=PASSWORD, user="admin", dbname="postgres")
    assert conninfo_to_dict(with_role(kv, "app_rw", "db")) == {
        "service": "prod",
        "user": "app_rw",
        "dbname": "db",
    }


def test_libpq_gets_the_address_as_written_but_the_driver_name() -> None:
    kv = "host=h1,h2 port=1,2 dbname=app"
    assert libpq_address(kv) == kv
    assert libpq_address("postgresql+psycopg://u@h1:1,h2:2/a") == "postgresql://u@h1:1,h2:2/a"


@pytest.mark.parametrize(
    "address",
    [
        "postgresql://owner@db1:5432,db2:5432/app?target_session_attrs=read-write",
        "postgresql+psycopg://owner@db/app",
        "host=db1,db2 port=5432,5433 dbname=app user=owner",
    ],
)
def test_every_address_gets_the_tcp_keepalives_and_keeps_its_own(address: str) -> None:
    """db/conninfo.py KEEPALIVES: every connection is given TCP keepalives and a user timeout
    (a server gone silent mid-statement is given up in about 25-30 s, not the kernel's 2 h),
    except those its address sets itself."""
    assert keepalive_args(address) == KEEPALIVES
    own = make_conninfo(libpq_address(address), keepalives_idle=60, tcp_user_timeout=0)
    kept = keepalive_args(own)
    assert "keepalives_idle" not in kept and "tcp_user_timeout" not in kept
    assert kept == {k: v for k, v in KEEPALIVES.items() if k in kept} and len(kept) == 3


def test_a_moves_child_gets_the_bounds_and_its_password_in_a_file() -> None:
    """kinds/move_copy.py Passwords.address: ``pg_dump``/``pg_restore``'s address carries the
    connect timeout and the keepalives (none of which it had), its password only in a file."""
    end = End("east", "postgresql://owner@db:5432/app?connect_timeout=9", password="s3cret")
    with Passwords() as passwords:
        given = conninfo_to_dict(passwords.address(end))
    assert given["connect_timeout"] == "9"  # the address's own
    assert {k: given[k] for k in KEEPALIVES} == {k: str(v) for k, v in KEEPALIVES.items()}
    assert "password" not in given and given["passfile"].startswith("/dev/fd/")
