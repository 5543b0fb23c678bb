"""The cloud SDKs are optional extras: without them the package imports, the filesystem store
provisions, and choosing their provider is refused with one line naming the extra.

Each case runs a fresh interpreter whose import system refuses the SDK (a meta-path finder that
raises ``ModuleNotFoundError``, as a missing distribution does), so nothing installed in this
environment is uninstalled or mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.settings import Settings
from tests.conftest import ROOT, settings_env

#: Installed first in each child: ``boto3``/``botocore`` or ``azure.*`` cannot be imported.
BLOCKER = """
import sys
BLOCKED = set(sys.argv.pop(1).split(","))

class MissingExtra:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, MissingExtra())
"""

RUN_CLI = BLOCKER + "import runpy; runpy.run_module('provisioner', run_name='__main__')\n"

SDK_MODULES = ("boto3", "botocore", "azure")

#: Dummy URLs: the worker refuses its configuration before it connects to anything.
UNREACHABLE = {
    "MIGRATIONS_DATABASE_URL": "postgresql://provisioner_owner@127.0.0.1:9/none",
    "APP_DATABASE_URL": "postgresql://app_rw@127.0.0.1:9/none",
}

PROVIDERS = {
    "s3": (
        "boto3,botocore",
        {"OBJECT_STORE_PROVIDER": "s3", "S3_BUCKET": "tenants"},
        "OBJECT_STORE_PROVIDER=s3 needs boto3: pip install 'pg-tenant-provisioner[s3]'",
    ),
    "azure": (
        "azure",
        {
            "OBJECT_STORE_PROVIDER": "azure",
            "AZURE_STORAGE_CONTAINER": "tenants",
            "AZURE_STORAGE_CONNECTION_STRING": "AccountName=devstoreaccount1;AccountKey=a2V5",
        },
        "OBJECT_STORE_PROVIDER=azure needs azure-storage-blob: "
        "pip install 'pg-tenant-provisioner[azure]'",
    ),
}


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = settings_env(Settings())
    for name in ("MIGRATIONS_DATABASE_URL", "APP_DATABASE_URL"):
        env.pop(name, None)
    env.update(extra)
    return env


def run(
    program: str, blocked: str, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program, blocked, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_the_worker_refuses_a_provider_without_its_extra(provider: str) -> None:
    blocked, env, line = PROVIDERS[provider]
    done = run(RUN_CLI, blocked, "worker", "--once", env=child_env({**UNREACHABLE, **env}))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {line}"], done.stderr


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_the_library_refuses_a_provider_without_its_extra(provider: str) -> None:
    """``store_from_settings`` says it (ConfigurationError); a store built by hand fails its
    check with the same line (StorageMisconfigured: the job fails, it is never retried)."""
    blocked, env, line = PROVIDERS[provider]
    program = (
        BLOCKER
        + """
import json
from provisioner import ConfigurationError, Settings
from provisioner.errors import StorageMisconfigured
from provisioner.storage import AzureBlobStore, S3Store, store_from_settings
out = {}
try:
    store_from_settings(Settings.from_env())
except ConfigurationError as exc:
    out["configured"] = [type(exc).__name__, str(exc), exc.exit_code]
store = S3Store(bucket="tenants") if sys.argv[1] == "s3" else AzureBlobStore(
    container="tenants", connection_string="AccountName=devstoreaccount1;AccountKey=a2V5"
)
try:
    store.check()
except StorageMisconfigured as exc:
    out["checked"] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""
    )
    done = run(program, blocked, provider, env=child_env(env))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == {
        "configured": ["ConfigurationError", line, 2],
        "checked": ["StorageMisconfigured", line],
    }


def test_import_and_a_filesystem_provisioning_need_no_sdk(
    settings: Settings, tmp_path: Path
) -> None:
    """With every SDK unimportable, ``import provisioner`` and a whole provisioning on the
    filesystem store succeed, and no SDK module was even looked up successfully."""
    program = (
        BLOCKER
        + """
import json
import provisioner
imported = sorted(m for m in sys.modules if m.split(".")[0] in ("boto3", "botocore", "azure"))
result = provisioner.provision("no_sdk_tenant")
after = sorted(m for m in sys.modules if m.split(".")[0] in ("boto3", "botocore", "azure"))
print(json.dumps([imported, result.job.status.value, after]))
"""
    )
    done = run(program, ",".join(SDK_MODULES), env=settings_env(settings))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [[], "succeeded", []]
