"""A worker installed with ``pip install .`` (not editable), started from the repository root.

The repository root holds a ``provisioner/`` source folder that is not the installed package (the
tenant tree lives elsewhere in it), so an engine process that imported the current directory's
``provisioner`` would fail every job at ``run_tenant_migrations``. The test installs the
repository into a throwaway virtualenv (its dependencies reused from the running interpreter's
site-packages through a ``.pth`` line, never the editable install's finder), runs that venv's
``provisioner worker --once`` with the repository root as its working directory, and checks the
tenant was provisioned.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import service
from provisioner.models import JobStatus
from provisioner.settings import Settings
from tests.conftest import ROOT, Database, settings_env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway venv with the repository pip-installed (non-editable): its bin folder."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True
    )
    python = venv / "bin" / "python"
    install = subprocess.run(  # this interpreter's pip, installing into the venv
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", ROOT],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Dependencies from the test interpreter: a plain path line, so the site-packages' own .pth
    # files (the editable install's finder among them) are not run.
    (Path(purelib) / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()))
    return venv / "bin"


@pytest.mark.slow
def test_an_installed_worker_started_in_the_repository_root_provisions(
    installed: Path, settings: Settings, database: Database
) -> None:
    service.enqueue(settings, "wheel")
    env = settings_env(settings)
    env.pop("PYTHONPATH", None)
    where = subprocess.run(
        [str(installed / "python"), "-c", "import provisioner; print(provisioner.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        check=True,
    ).stdout
    assert str(installed.parent) in where  # the installed package, not the checkout
    result = subprocess.run(
        [str(installed / "provisioner"), "worker", "--once", "--log-format", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "ModuleNotFoundError" not in output
    assert service.status(settings, "wheel").job.status is JobStatus.SUCCEEDED, output
    assert os.path.isdir(ROOT / "provisioner")  # the shadowing folder was there all along
