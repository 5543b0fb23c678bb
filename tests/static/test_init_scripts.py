"""The compose init scripts, run against recording stand-ins for ``psql`` and ``mc``.

No container engine here: the scripts run on the host with a stub first on PATH that records
its arguments, its stdin and the environment it was given. That is enough to check what the
scripts ask of the real tools, and that secrets stay off command lines and out of output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.static.lint_tools import INFRA

BOOTSTRAP_SCRIPT = INFRA / "postgres" / "10-bootstrap.sh"
MINIO_SCRIPT = INFRA / "minio-init.sh"

OWNER_PW = "owner-Secret-1"
APP_PW = "app-Secret-2"
ROOT_PW = "root-Secret-3"
READER_SECRET = "reader-Secret-4"

# A stub that appends one JSON record per call: argv, stdin, selected environment.
STUB = """#!/usr/bin/env python3
import json, os, sys
record = {{"argv": sys.argv[1:], "stdin": "" if sys.stdin.isatty() else sys.stdin.read(),
           "env": {{k: v for k, v in os.environ.items() if k.startswith(("MC_HOST_", "PG"))}}}}
files = [a for a in sys.argv[1:] if a.endswith(".json") and os.path.isfile(a)]
record["files"] = {{f: open(f).read() for f in files}}
with open({log!r}, "a") as out:
    out.write(json.dumps(record) + "\\n")
{behaviour}
"""


def install_stub(bin_dir: Path, name: str, log: Path, behaviour: str = "") -> None:
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / name
    stub.write_text(STUB.format(log=str(log), behaviour=behaviour))
    stub.chmod(0o755)


def calls(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def run_script(
    interpreter: str, script: Path, bin_dir: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    shell = shutil.which(interpreter)
    assert shell, f"{interpreter} is needed to run {script.name}"
    full_env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", **env}
    return subprocess.run(
        [shell, str(script)],
        env=full_env,
        stdin=subprocess.DEVNULL,  # never the test runner's stdin: a stub would wait on it
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- infra/postgres/10-bootstrap.sh ----------------------------------------------------------


def bootstrap_env(tmp_path: Path) -> dict[str, str]:
    sql = tmp_path / "bootstrap.sql"
    sql.write_text("SELECT 1;\n")
    return {
        "POSTGRES_USER": "postgres",
        "POSTGRES_DB": "provisioner",
        "PROVISIONER_BOOTSTRAP_SQL": str(sql),
        "PROVISIONER_OWNER_PASSWORD": OWNER_PW,
        "APP_RW_PASSWORD": APP_PW,
        "PGHOST": "/somewhere/else",
    }


def test_bootstrap_runs_the_sql_then_sets_passwords_without_exposing_them(tmp_path: Path) -> None:
    log = tmp_path / "psql.log"
    install_stub(tmp_path / "bin", "psql", log)
    env = bootstrap_env(tmp_path)
    result = run_script("bash", BOOTSTRAP_SCRIPT, tmp_path / "bin", env)
    assert result.returncode == 0, result.stderr
    first, second = calls(log)

    assert first["argv"][-2:] == ["--file", env["PROVISIONER_BOOTSTRAP_SQL"]]
    for call in (first, second):
        argv = call["argv"]
        assert "ON_ERROR_STOP=1" in argv
        assert "--no-psqlrc" in argv
        assert argv[argv.index("--dbname") + 1] == "provisioner"
        # The init server listens on its Unix socket only: an inherited PGHOST is dropped.
        assert "PGHOST" not in call["env"]

    script = second["stdin"]
    assert "\\getenv owner_password PROVISIONER_OWNER_PASSWORD" in script
    assert "\\getenv app_password APP_RW_PASSWORD" in script
    assert "ALTER ROLE provisioner_owner PASSWORD :'owner_password';" in script
    assert "ALTER ROLE app_rw PASSWORD :'app_password';" in script
    assert "log_statement = 'none'" in script

    everything = json.dumps(calls(log)) + result.stdout + result.stderr
    assert OWNER_PW not in everything
    assert APP_PW not in everything


@pytest.mark.parametrize("missing", ["PROVISIONER_OWNER_PASSWORD", "APP_RW_PASSWORD"])
def test_bootstrap_refuses_to_run_without_both_passwords(tmp_path: Path, missing: str) -> None:
    log = tmp_path / "psql.log"
    install_stub(tmp_path / "bin", "psql", log)
    env = bootstrap_env(tmp_path)
    env[missing] = ""
    result = run_script("bash", BOOTSTRAP_SCRIPT, tmp_path / "bin", env)
    assert result.returncode != 0
    assert calls(log) == []


def test_bootstrap_stops_when_psql_fails(tmp_path: Path) -> None:
    log = tmp_path / "psql.log"
    install_stub(tmp_path / "bin", "psql", log, behaviour="sys.exit(3)")
    result = run_script("bash", BOOTSTRAP_SCRIPT, tmp_path / "bin", bootstrap_env(tmp_path))
    assert result.returncode != 0
    assert len(calls(log)) == 1


# --- infra/minio-init.sh ---------------------------------------------------------------------


def minio_env(tmp_path: Path) -> dict[str, str]:
    return {
        "MINIO_ENDPOINT": "http://minio:9000",
        "MINIO_ROOT_USER": "minio-root",
        "MINIO_ROOT_PASSWORD": ROOT_PW,
        "S3_BUCKET": "tenants",
        "S3_READONLY_ACCESS_KEY": "reader",
        "S3_READONLY_SECRET_KEY": READER_SECRET,
        "TMPDIR": str(tmp_path),
    }


ATTACH = {
    "ok": "",
    "already": (
        "if sys.argv[1:4] == ['admin', 'policy', 'attach']:\n"
        "    print('mc: <ERROR> The specified policy change is already in effect.')\n"
        "    sys.exit(1)"
    ),
    "denied": (
        "if sys.argv[1:4] == ['admin', 'policy', 'attach']:\n"
        "    print('mc: <ERROR> Access Denied.', file=sys.stderr)\n"
        "    sys.exit(1)"
    ),
}


@pytest.mark.parametrize("attach", ["ok", "already"])
def test_minio_init_creates_bucket_and_read_only_user(tmp_path: Path, attach: str) -> None:
    log = tmp_path / "mc.log"
    install_stub(tmp_path / "bin", "mc", log, behaviour=ATTACH[attach])
    result = run_script("sh", MINIO_SCRIPT, tmp_path / "bin", minio_env(tmp_path))
    assert result.returncode == 0, result.stderr
    records = calls(log)
    argvs = [r["argv"] for r in records]
    assert argvs[0] == ["ready", "local"]
    assert ["mb", "--ignore-existing", "local/tenants"] in argvs
    assert ["admin", "user", "add", "local", "reader", READER_SECRET] in argvs
    assert ["admin", "policy", "attach", "local", "tenants-readonly", "--user", "reader"] in argvs

    # Root credentials reach mc through MC_HOST_local only, never its arguments or the output.
    assert all(
        r["env"]["MC_HOST_local"] == f"http://minio-root:{ROOT_PW}@minio:9000" for r in records
    )
    assert ROOT_PW not in json.dumps(argvs) + result.stdout + result.stderr

    create = next(r for r in records if r["argv"][:3] == ["admin", "policy", "create"])
    assert create["argv"][3:5] == ["local", "tenants-readonly"]
    policy = json.loads(next(iter(create["files"].values())))
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert actions == {"s3:ListBucket", "s3:GetBucketLocation", "s3:GetObject"}
    assert {s["Effect"] for s in policy["Statement"]} == {"Allow"}
    resources = {r for s in policy["Statement"] for r in s["Resource"]}
    assert resources == {"arn:aws:s3:::tenants", "arn:aws:s3:::tenants/*"}
    assert not list(tmp_path.glob("*.json")), "the policy file is left behind"


def test_minio_init_fails_on_a_real_attach_error(tmp_path: Path) -> None:
    log = tmp_path / "mc.log"
    install_stub(tmp_path / "bin", "mc", log, behaviour=ATTACH["denied"])
    result = run_script("sh", MINIO_SCRIPT, tmp_path / "bin", minio_env(tmp_path))
    assert result.returncode != 0
    assert "Access Denied" in result.stderr


def test_minio_init_needs_its_settings(tmp_path: Path) -> None:
    log = tmp_path / "mc.log"
    install_stub(tmp_path / "bin", "mc", log)
    env = minio_env(tmp_path)
    del env["S3_READONLY_SECRET_KEY"]
    result = run_script("sh", MINIO_SCRIPT, tmp_path / "bin", env)
    assert result.returncode != 0
    assert calls(log) == []
