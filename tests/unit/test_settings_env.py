"""Every environment variable is read in Settings: the Azure credential comes in through
Settings.from_env (a secret: kept out of repr), and no module but settings reads the process
environment (the pytest plugin, the test harness's own edge, aside)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import provisioner
from provisioner.errors import ConfigurationError
from provisioner.settings import AZURE_CREDENTIAL_ENV, Settings

PACKAGE = Path(provisioner.__file__).resolve().parent
#: Reads the environment on purpose: the settings edge, and the pytest plugin (xdist's worker
#: name, the harness's server URL), which runs in a test session rather than a deployment.
READERS = {"settings.py", "testing/server.py", "testing/pytest_plugin.py"}


def test_the_azure_credential_is_a_setting() -> None:
    settings = Settings.from_env({AZURE_CREDENTIAL_ENV: "sv=2024&sig=s3cr3t"})
    assert settings.azure_credential == "sv=2024&sig=s3cr3t"
    assert "s3cr3t" not in repr(settings)
    assert "s3cr3t" not in str(settings.describe())
    assert Settings.from_env({}).azure_credential is None


def test_only_settings_reads_the_environment() -> None:
    readers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"\bos\.environ\b|\bgetenv\(", path.read_text())
    }
    assert readers <= READERS, readers - READERS


def test_the_move_method_is_a_setting_of_three_values() -> None:
    assert Settings.from_env({}).move_method == "auto"
    assert Settings.from_env({"PROVISIONER_MOVE_METHOD": "Logical"}).move_method == "logical"
    refused = "PROVISIONER_MOVE_METHOD must be one of auto, dump, logical, got 'rsync'"
    with pytest.raises(ConfigurationError, match=re.escape(refused) + "$"):
        Settings.from_env({"PROVISIONER_MOVE_METHOD": "rsync"})
