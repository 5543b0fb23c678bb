"""Every connection form libpq accepts, against a server that asks for a password (scram).

A second throwaway cluster, started here, refuses every TCP login without the right password
(``scram-sha-256`` in ``pg_hba.conf``). Its roles share a password made of the characters that
break URL and key=value parsing (``@ : / = ' \\`` and spaces). Each form reaches it through
real ``provisioner`` processes (``migrate``, ``provision``, ``enqueue`` + ``worker --once``
and its children, ``status``) and through the pytest plugin in a pytest subprocess (the forms
with the password inside the address on a server of their own: the plugin then gives the
roles passwords of their own):

* a multi-host URL (the first host down) with ``target_session_attrs=read-write``, the
  password percent-encoded in it;
* a libpq key=value string, the password quoted in it, with the same host list;
* a service file (``PGSERVICEFILE``), named as ``service=NAME`` and as ``postgresql://?service=``;
* a URL without a password, the password in ``PGPASSWORD``;
* a key=value string without a password, the password in a password file (``PGPASSFILE``).

No output of any of them, success or failure, holds the password in any spelling.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from provisioner.local import cluster as local_pg
from tests.conftest import BOOTSTRAP_SQL, ROOT

PASSWORD = "p@ss:w/rd='q' \\ x y=z"
#: Every spelling of the password a leak could take: raw, percent-encoded, quoted for libpq,
#: escaped for a password file, and pieces of it (a parser that split it at '@' or ':').
SPELLINGS = (
    PASSWORD,
    quote(PASSWORD, safe=""),
    quote(PASSWORD),
    PASSWORD.replace("\\", "\\\\").replace("'", "\\'"),
    PASSWORD.replace("\\", "\\\\").replace(":", "\\:"),
    "p@ss",
    "ss:w",
    "w/rd",
    "rd='q'",
    "x y=z",
)
ROLES = ("postgres", "provisioner_owner", "app_rw")


def assert_no_secret(*outputs: str) -> None:
    for output in outputs:
        for spelling in SPELLINGS:
            assert spelling not in output, f"the password ({spelling!r}) leaked:\n{output}"


@dataclass
class ScramServer:
    """A throwaway cluster whose TCP logins all need :data:`PASSWORD`."""

    cluster: local_pg.Cluster
    port: int
    #: a port nothing listens on: the first host of every host list
    dead_port: int

    def admin(self, database: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(
            make_conninfo(
                "",
                host="127.0.0.1",
                port=self.port,
                user="postgres",
                dbname=database,
                password=PASSWORD,
            ),
            autocommit=True,
        )

    def create_database(self) -> str:
        name = f"f_{uuid.uuid4().hex[:10]}"
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        with self.admin(name) as conn:
            conn.execute(BOOTSTRAP_SQL.read_text())
        return name


@contextmanager
def _started_scram_server() -> Iterator[ScramServer]:
    cluster = local_pg.Cluster(Path(tempfile.mkdtemp(prefix="provisioner-scram-")), durable=False)
    cluster.ensure_running()
    try:
        with psycopg.connect(cluster.superuser_url(), autocommit=True) as conn:
            conn.execute(BOOTSTRAP_SQL.read_text())  # the roles exist before their passwords
            for role in ROLES:
                conn.execute(
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                        sql.Identifier(role), sql.Literal(PASSWORD)
                    )
                )
            hba = conn.execute("SHOW hba_file").fetchone()[0]
            Path(hba).write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
            conn.execute("SELECT pg_reload_conf()")
        assert cluster.port is not None
        server = ScramServer(cluster, cluster.port, local_pg.free_port())
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(cluster.superuser_url()).close()  # the server does ask
        yield server
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(scope="module")
def scram_server() -> Iterator[ScramServer]:
    with _started_scram_server() as server:
        yield server


@pytest.fixture
def own_scram_server() -> Iterator[ScramServer]:
    """A server of its own: the plugin, given the superuser's password in the address, gives
    the bootstrap roles passwords of their own (derived from it), which the other forms'
    tests on the shared server do not know."""
    with _started_scram_server() as server:
        yield server


@dataclass
class Form:
    """One way of naming the database: an address per role, and the environment it needs."""

    name: str
    address: Callable[[ScramServer, str, str, Path], str]
    env: Callable[[ScramServer, Path], dict[str, str]] = field(default=lambda s, d: {})
    #: the password comes from libpq's own sources, so the plugin can name other roles too
    for_plugin: bool = False


def _multi_host_url(s: ScramServer, role: str, database: str, _: Path) -> str:
    return (
        f"postgresql://{role}:{quote(PASSWORD, safe='')}@127.0.0.1:{s.dead_port},"
        f"127.0.0.1:{s.port}/{database}?target_session_attrs=read-write&connect_timeout=5"
    )


def _key_value(s: ScramServer, role: str, database: str, _: Path) -> str:
    return make_conninfo(
        "",
        host="127.0.0.1,127.0.0.1",
        port=f"{s.dead_port},{s.port}",
        dbname=database,
        user=role,
        password=PASSWORD,
        target_session_attrs="read-write",
    )


def _service(s: ScramServer, role: str, database: str, tmp: Path) -> str:
    """A section per role and database in the service file; owners by ``service=``, the
    others by a URL naming the service."""
    section = f"{role}_{database}"
    with (tmp / "pg_service.conf").open("a") as out:
        out.write(
            f"[{section}]\nhost=127.0.0.1,127.0.0.1\nport={s.dead_port},{s.port}\n"
            f"dbname={database}\nuser={role}\npassword={PASSWORD}\n"
            "target_session_attrs=read-write\n\n"
        )
    return f"service={section}" if role != "app_rw" else f"postgresql://?service={section}"


def _service_env(_: ScramServer, tmp: Path) -> dict[str, str]:
    return {"PGSERVICEFILE": str(tmp / "pg_service.conf")}


def _plain_url(s: ScramServer, role: str, database: str, _: Path) -> str:
    return f"postgresql://{role}@127.0.0.1:{s.dead_port},127.0.0.1:{s.port}/{database}"


def _pgpassword_env(_: ScramServer, __: Path) -> dict[str, str]:
    return {"PGPASSWORD": PASSWORD}


def _plain_key_value(s: ScramServer, role: str, database: str, _: Path) -> str:
    return f"host=127.0.0.1 port={s.port} dbname={database} user={role}"


def _pgpass_env(s: ScramServer, tmp: Path) -> dict[str, str]:
    path = tmp / "pgpass"
    escaped = PASSWORD.replace("\\", "\\\\").replace(":", "\\:")
    path.write_text(f"127.0.0.1:{s.port}:*:*:{escaped}\n")
    path.chmod(0o600)
    return {"PGPASSFILE": str(path)}


FORMS = [
    Form("multi-host URL", _multi_host_url),
    Form("key=value", _key_value),
    Form("service file", _service, _service_env, for_plugin=True),
    Form("PGPASSWORD", _plain_url, _pgpassword_env, for_plugin=True),
    Form("password file", _plain_key_value, _pgpass_env, for_plugin=True),
]


def _env(server: ScramServer, form: Form, database: str, tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PROVISIONER_", "OBJECT_", "PG", "DATABASE_URL"))
        and k not in ("MIGRATIONS_DATABASE_URL", "APP_DATABASE_URL")
    }
    env.update(form.env(server, tmp))
    env.update(
        MIGRATIONS_DATABASE_URL=form.address(server, "provisioner_owner", database, tmp),
        APP_DATABASE_URL=form.address(server, "app_rw", database, tmp),
        OBJECT_STORE_PROVIDER="filesystem",
        OBJECT_STORE_PATH=str(tmp / "objects"),
        PROVISIONER_STATE_DIR=str(tmp / "state"),
        PROVISIONER_POLL_SECONDS="0.5",
        PYTHONPATH=str(ROOT),
    )
    (tmp / "objects").mkdir(exist_ok=True)
    return env


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "provisioner", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert_no_secret(result.stdout, result.stderr)
    return result


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_every_command_works_with_the_form_and_never_prints_the_password(
    scram_server: ScramServer, form: Form, tmp_path: Path
) -> None:
    database = scram_server.create_database()
    env = _env(scram_server, form, database, tmp_path)

    migrated = _run(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    provisioned = _run(env, "provision", "acme")
    assert provisioned.returncode == 0, provisioned.stdout + provisioned.stderr
    assert "succeeded" in provisioned.stdout

    queued = _run(env, "enqueue", "beta")
    assert queued.returncode == 0, queued.stderr
    worker = _run(env, "worker", "--once", "--log-format", "json")
    assert worker.returncode == 0, worker.stderr
    status = _run(env, "status", "beta", "--json")
    assert status.returncode == 0, status.stderr
    assert '"status": "succeeded"' in status.stdout

    with scram_server.admin(database) as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tenant_%' ORDER BY 1"
        ).fetchall()
        leaked = conn.execute(
            "SELECT count(*) FROM control.platform_jobs WHERE error_detail LIKE %s",
            (f"%{PASSWORD[:4]}%",),
        ).fetchone()
    assert schemas == [("tenant_acme",), ("tenant_beta",)]
    assert leaked == (0,)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_a_failing_connection_never_prints_the_password(
    scram_server: ScramServer, form: Form, tmp_path: Path
) -> None:
    """The same forms naming a database that does not exist: each command fails in one line,
    the password in none of its output."""
    env = _env(scram_server, form, "no_such_database", tmp_path)
    for args in (("migrate",), ("provision", "acme"), ("status", "acme"), ("worker", "--once")):
        result = _run(env, *args)
        assert result.returncode != 0, args
        assert "Traceback" not in result.stderr, result.stderr
        assert "no_such_database" in result.stderr or "database" in result.stderr


PLUGIN_TEST = textwrap.dedent(
    """
    import provisioner


    def test_a_tenant_through_the_plugin(tenant, provisioner_settings):
        with tenant.connect() as conn:
            conn.execute("INSERT INTO datasets (name) VALUES ('sales')")
            assert conn.execute("SELECT count(*) FROM datasets").fetchone() == (1,)
        engine = tenant.sqlalchemy_engine()
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM datasets").scalar() == 1
        engine.dispose()
        status = provisioner.status(tenant.id, settings=provisioner_settings)
        assert status.job.status is provisioner.JobStatus.SUCCEEDED
    """
)


@pytest.mark.parametrize("form", [f for f in FORMS if f.for_plugin], ids=lambda f: f.name)
def test_the_pytest_plugin_works_with_the_form(
    scram_server: ScramServer, form: Form, tmp_path: Path
) -> None:
    _run_plugin(scram_server, form, tmp_path)


@pytest.mark.parametrize("form", [f for f in FORMS if not f.for_plugin], ids=lambda f: f.name)
def test_the_pytest_plugin_works_with_the_password_in_the_address(
    own_scram_server: ScramServer, form: Form, tmp_path: Path
) -> None:
    """The superuser's password inside a multi-host URL or a key=value string: the plugin
    gives the roles passwords derived from it and connects them through the same host list."""
    _run_plugin(own_scram_server, form, tmp_path)


def _run_plugin(scram_server: ScramServer, form: Form, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_signup.py").write_text(PLUGIN_TEST)
    env = _env(scram_server, form, "postgres", tmp_path)
    env["PROVISIONER_TEST_DATABASE_URL"] = form.address(
        scram_server, "postgres", "postgres", tmp_path
    )
    for name in ("MIGRATIONS_DATABASE_URL", "APP_DATABASE_URL"):
        env.pop(name)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project)],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=300,
        check=False,
    )
    assert_no_secret(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout
