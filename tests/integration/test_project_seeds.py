"""A project's own tenant tree and seeds, through the CLI as a user runs it (issue 24, items 2
and 3): SQL and Python seeds applied with the tenant id and the schema's search_path, recorded
by digest (a changed seed runs again and says so), and failures no retry can fix (a bad seed, a
bad revision, a missing seed folder) failing the job at its first attempt, named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from provisioner.settings import Settings
from provisioner.templates import migrations
from tests.conftest import Database, run_cli

REVISION = '''"""{title}"""

from alembic import op

revision = "{rev}"
down_revision = {down}
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""{ddl}""")


def downgrade() -> None:
    pass
'''

PLANS = "CREATE TABLE plans (code TEXT PRIMARY KEY, owner_tenant TEXT NOT NULL, seats INT)"

SEED_SQL = """-- the tenant's first plan, named after the tenant (no templating: a setting)
INSERT INTO plans (code, owner_tenant, seats)
VALUES ('starter', current_setting('provisioner.tenant_id'), 5)
ON CONFLICT (code) DO NOTHING;
"""

SEED_MODULE = """
def add_trial(conn, tenant):
    conn.execute(
        "INSERT INTO plans (code, owner_tenant, seats) VALUES ('trial', %s, 1) "
        "ON CONFLICT (code) DO NOTHING",
        (tenant.value,),
    )
"""


def own_tree(tmp_path: Path, ddl: str = PLANS) -> Path:
    """A project's tenant tree: the shipped env.py and ini, one revision of its own, no seeds."""
    shipped = migrations.tenant_tree()
    tree = tmp_path / "tenant_tree"
    tree.mkdir()
    for name in ("env.py", "alembic.ini", "script.py.mako"):
        shutil.copy(shipped / name, tree / name)
    (tree / "versions").mkdir()
    (tree / "versions" / "m001_plans.py").write_text(
        REVISION.format(title="plans", rev="m001", down="None", ddl=ddl)
    )
    return tree


def project(tmp_path: Path, tree: Path, seeds: str) -> dict[str, str]:
    (tmp_path / "seedmods").mkdir(exist_ok=True)
    (tmp_path / "seedmods" / "project_seeds.py").write_text(SEED_MODULE)
    return {
        migrations.TENANT_TREE_ENV: str(tree),
        "PROVISIONER_SEEDS": seeds,
        "PYTHONPATH": f"{tmp_path / 'seedmods'}:{Path(__file__).resolve().parents[2]}",
    }


def status(settings: Settings, tenant: str, env: dict[str, str]) -> dict:
    result = run_cli(settings, "status", tenant, "--json", env=env)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def seed_detail(database: Database, tenant: str) -> list[str]:
    with database.owner() as conn:
        rows = conn.execute(
            "SELECT detail FROM control.job_step_runs "
            "WHERE tenant_id = %s AND step = 'seed_role_profiles' AND outcome = 'succeeded' "
            "ORDER BY started_at",
            (tenant,),
        ).fetchall()
    return [row[0] for row in rows]


def test_a_project_tree_and_its_sql_and_python_seeds(
    tmp_path: Path, settings: Settings, database: Database
) -> None:
    tree = own_tree(tmp_path)
    seeds_dir = tmp_path / "seeds"
    seeds_dir.mkdir()
    (seeds_dir / "001_plans.sql").write_text(SEED_SQL)
    env = project(tmp_path, tree, f"{seeds_dir},project_seeds:add_trial")

    result = run_cli(settings, "provision", "acme", env=env)
    assert result.returncode == 0, result.stderr
    with database.owner() as conn:
        rows = conn.execute("SELECT code, owner_tenant FROM tenant_acme.plans ORDER BY code")
        assert rows.fetchall() == [("starter", "acme"), ("trial", "acme")]
        recorded = conn.execute(
            "SELECT seed FROM control.tenant_seeds WHERE tenant_id = 'acme' ORDER BY seed"
        ).fetchall()
    assert recorded == [("001_plans.sql",), ("project_seeds:add_trial",)]
    assert "applied 001_plans.sql" in seed_detail(database, "acme")[0]
    # The application role cannot read or forge the record.
    with database.app() as conn, pytest.raises(Exception, match="permission denied"):
        conn.execute("SELECT * FROM control.tenant_seeds")

    # A changed seed file: provisioning again runs the seed step again, and says why.
    (seeds_dir / "001_plans.sql").write_text(SEED_SQL.replace("5)", "10)"))
    again = run_cli(settings, "provision", "acme", env=env)
    assert again.returncode == 0, again.stderr
    details = seed_detail(database, "acme")
    assert len(details) == 2 and "changed since last applied: 001_plans.sql" in details[1]


def test_a_tree_without_seeds_provisions_without_any(
    tmp_path: Path, settings: Settings, database: Database
) -> None:
    """The shipped role profiles are the shipped tree's seeds, not everyone's: a tree of its
    own, with no role_profiles table and no seeds declared, provisions (it failed at step 4,
    retried five times)."""
    env = project(tmp_path, own_tree(tmp_path), "")
    result = run_cli(settings, "provision", "mine", env=env)
    assert result.returncode == 0, result.stderr
    assert seed_detail(database, "mine") == ["no seeds declared"]


@pytest.mark.parametrize(
    ("seed_text", "expected"),
    [
        ("INSERT INTO plnas (code) VALUES ('x');", 'relation "plnas" does not exist'),
        ("INSERT INTO plans (code, owner_tenant, seats) VALUES ('x', 'y', 'many');", "invalid"),
        ("INSERT INTO plans (code) VALUES ('x');", "not-null"),
        ("INSRT INTO plans VALUES (1);", "syntax error"),
    ],
    ids=["undefined-table", "data-exception", "constraint", "syntax"],
)
def test_a_seed_that_cannot_succeed_fails_at_its_first_attempt(
    tmp_path: Path, settings: Settings, database: Database, seed_text: str, expected: str
) -> None:
    tree = own_tree(tmp_path)
    seeds_dir = tmp_path / "seeds"
    seeds_dir.mkdir()
    (seeds_dir / "001_ok.sql").write_text(SEED_SQL)
    (seeds_dir / "002_broken.sql").write_text(seed_text)
    env = project(tmp_path, tree, str(seeds_dir))

    result = run_cli(settings, "provision", "acme", env=env)
    assert result.returncode == 1
    job = status(settings, "acme", env)
    assert job["status"] == "failed" and job["attempts"] == 1
    assert "seed 002_broken.sql" in job["error_detail"]
    assert expected in job["error_detail"]
    with database.owner() as conn:
        # Nothing of the failed step's transaction stayed: not even the first seed's row.
        assert conn.execute("SELECT count(*) FROM tenant_acme.plans").fetchone() == (0,)


def test_a_revision_that_cannot_succeed_fails_at_once_and_names_itself(
    tmp_path: Path, settings: Settings
) -> None:
    tree = own_tree(tmp_path)
    (tree / "versions" / "m002_broken.py").write_text(
        REVISION.format(
            title="a typo", rev="m002", down='"m001"', ddl="ALTER TABLE plnas ADD COLUMN x INT"
        )
    )
    env = project(tmp_path, tree, "")
    result = run_cli(settings, "provision", "acme", env=env)
    assert result.returncode == 1
    job = status(settings, "acme", env)
    assert job["status"] == "failed" and job["attempts"] == 1
    assert "revision m002" in job["error_detail"]
    assert 'relation "plnas" does not exist' in job["error_detail"]


def test_a_missing_seed_folder_fails_at_once(tmp_path: Path, settings: Settings) -> None:
    env = project(tmp_path, own_tree(tmp_path), str(tmp_path / "no-such-folder"))
    result = run_cli(settings, "provision", "acme", env=env)
    # Refused before anything is created (service.provision resolves the seeds first): one
    # line, exit 2, no tenant row and no job.
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "no such folder or .sql file" in result.stderr
    assert result.stdout == ""  # not even the first progress line
    assert run_cli(settings, "status", "acme", env=env).returncode == 3
