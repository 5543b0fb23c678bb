"""The README's "Using it from code" and "Testing your application" sections, run as written:
each Python block of the first as a script (with the test database's URLs in the environment),
the second as a test module in a pytest subprocess with the plugin."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from provisioner.settings import Settings
from provisioner.testing import SERVER_URL_ENV
from tests.conftest import ROOT, Server, settings_env

README = (ROOT / "README.md").read_text()


def python_blocks(section: str) -> list[str]:
    start = README.index(f"## {section}\n")
    end = README.find("\n## ", start + 1)
    body = README[start : end if end != -1 else None]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def test_using_it_from_code_runs_as_written(settings: Settings, tmp_path: Path) -> None:
    blocks = python_blocks("Using it from code")
    assert len(blocks) == 2
    env = settings_env(settings)
    outputs = []
    for number, block in enumerate(blocks):
        script = tmp_path / f"example_{number}.py"
        script.write_text(block)
        done = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    assert outputs == ["queued\nonboarding\n", "queued\n"]


def test_testing_your_application_runs_as_written(pg_server: Server, tmp_path: Path) -> None:
    (blocks,) = [python_blocks("Testing your application")]
    assert len(blocks) == 1
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "test_readme.py").write_text(blocks[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PROVISIONER_"))}
    env[SERVER_URL_ENV] = pg_server.admin_url
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
