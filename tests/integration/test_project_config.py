"""The project configuration file (issue 24, item 1): ``provisioner.toml`` or
``[tool.provisioner]`` in ``pyproject.toml``, found from a sub-folder as a user runs commands,
overridden by the environment, shown by ``provisioner config`` with its sources and no secret;
a bad file is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from provisioner.settings import Settings
from tests.conftest import Database, run_cli
from tests.integration.test_project_seeds import SEED_SQL, own_tree

# Its digits are seven, so no port or generated name in the output can hold them by chance.
SECRET = "Top$ecret@:/9876543"


def cli(
    settings: Settings, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(settings, *args, env=env, cwd=cwd)


def make_project(tmp_path: Path, text: str, name: str = "provisioner.toml") -> Path:
    """A repository with the project's tree and seeds under db/, and a sub-folder to run in."""
    root = tmp_path / "repo"
    (root / "db").mkdir(parents=True)
    own_tree(root / "db")
    (root / "db" / "seeds").mkdir()
    (root / "db" / "seeds" / "001_plans.sql").write_text(SEED_SQL)
    (root / name).write_text(text)
    (root / "app" / "handlers").mkdir(parents=True)
    return root


FILE = """
tenant_tree = "db/tenant_tree"
seeds = ["db/seeds"]
object_store_provider = "none"
"""


def test_commands_run_from_a_sub_folder_use_the_project_file(
    tmp_path: Path, settings: Settings, database: Database
) -> None:
    root = make_project(tmp_path, FILE)
    env = {"OBJECT_STORE_PROVIDER": ""}  # the suite's settings set one: leave it to the file
    result = cli(settings, root / "app" / "handlers", "provision", "acme", env=env)
    assert result.returncode == 0, result.stderr
    with database.owner() as conn:
        assert conn.execute("SELECT code, owner_tenant FROM tenant_acme.plans").fetchall() == [
            ("starter", "acme")
        ]
        storage = conn.execute(
            "SELECT detail FROM control.job_step_runs "
            "WHERE tenant_id = 'acme' AND step = 'verify_object_storage'"
        ).fetchone()
    assert storage is not None and "no object store configured" in storage[0]


def test_pyproject_tool_table_and_the_environment_over_it(
    tmp_path: Path, settings: Settings
) -> None:
    root = make_project(
        tmp_path,
        '[project]\nname = "signup"\n\n[tool.provisioner]\n' + FILE + "pool_size = 3\n",
        name="pyproject.toml",
    )
    env = {
        "PROVISIONER_POOL_SIZE": "5",
        "MIGRATIONS_DATABASE_URL": settings.migrations_database_url or "",
        "APP_DATABASE_URL": "",
    }
    result = cli(settings, root / "app", "config", "--json", env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["file"] == str(root / "pyproject.toml")
    rows = {row["key"]: row for row in shown["settings"]}
    assert rows["tenant_tree"] == {
        "key": "tenant_tree",
        "variable": "PROVISIONER_TENANT_TREE",
        "value": str(root / "db" / "tenant_tree"),
        "source": "file",
    }
    assert (rows["pool_size"]["value"], rows["pool_size"]["source"]) == ("5", "environment")
    assert (rows["app_roles"]["value"], rows["app_roles"]["source"]) == (
        "app_rw=readwrite",
        "default",
    )


def test_config_hides_secrets_whatever_their_characters(tmp_path: Path, settings: Settings) -> None:
    root = make_project(tmp_path, FILE)
    from urllib.parse import quote

    url = f"postgresql://owner:{quote(SECRET, safe='')}@127.0.0.1:5/db"
    env = {
        "MIGRATIONS_DATABASE_URL": url,
        "AZURE_STORAGE_CONNECTION_STRING": f"AccountName=a;AccountKey={SECRET}",
    }
    for args in (("config",), ("config", "--json"), ("--owner-url", url, "config")):
        result = cli(settings, root, *args, env=env)
        assert result.returncode == 0, result.stderr
        out = result.stdout + result.stderr
        assert "Top" not in out and "9876543" not in out and quote(SECRET, safe="") not in out
        assert "postgresql://owner:***@127.0.0.1:5/db" in out


def test_a_bad_file_is_one_line_and_exit_2(tmp_path: Path, settings: Settings) -> None:
    cases = {
        "bogus = 1\n": "unknown key 'bogus'",
        'pool_size = "many"\n': "pool_size must be a number",
        'tenant_tree = "x"\nseeds = 3\n': "seeds must be a string or an array of strings",
        'migrations_database_url = "postgresql://o:p@h/d"\n': "belongs in the environment",
        "tenant_tree = \n": "cannot be read as TOML",
    }
    for number, (text, message) in enumerate(cases.items()):
        root = make_project(tmp_path / str(number), text)
        result = cli(settings, root, "provision", "acme")
        assert result.returncode == 2, (text, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (text, result.stderr)
        assert "postgresql://o:p@" not in result.stderr


def test_the_docs_list_every_key_with_its_variable_and_default() -> None:
    from provisioner.project import KEYS

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for key in KEYS:
        assert f"| `{key.name}` | `{key.env}` | {key.default or '(none)'} |" in page, key.name
