"""infra/docker-compose.yml (+ the Azure override): valid for the real compose binary, and the
privilege split, dependencies and restart policies the design asks for.

The model under test is ``compose config --format json``: interpolated, merged and normalised by
compose itself, so these assertions see what ``docker compose up`` would run.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from provisioner.settings import Settings
from tests.static.lint_tools import (
    AZURE_OVERRIDE,
    COMPOSE_FILE,
    INFRA,
    REPO_ROOT,
    compose,
    compose_config,
    describe,
    package_env_names,
)

DEFAULT = [COMPOSE_FILE]
AZURE = [COMPOSE_FILE, AZURE_OVERRIDE]
VARIANTS = {"default": DEFAULT, "azure": AZURE}

OWNER_HOLDERS = {"migrate", "provisioner-worker"}
OWNER_URL_PREFIX = "postgresql://provisioner_owner"
COMPLETED = "service_completed_successfully"

# Environment variables the worker may be given: those the package reads, plus the AWS
# credential pair boto3 reads itself.
AWS_CREDENTIALS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


@pytest.fixture(scope="module")
def default_model() -> dict[str, Any]:
    return compose_config(DEFAULT)


@pytest.fixture(scope="module")
def azure_model() -> dict[str, Any]:
    return compose_config(AZURE)


def env_of(model: dict[str, Any], service: str) -> dict[str, str]:
    return {k: v for k, v in (model["services"][service].get("environment") or {}).items()}


def conditions(model: dict[str, Any], service: str) -> dict[str, str]:
    deps = model["services"][service].get("depends_on") or {}
    return {name: spec["condition"] for name, spec in deps.items()}


def url_user(url: str) -> str:
    return urlsplit(url).username or ""


# --- validity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_compose_file_is_valid_for_the_real_compose_binary(variant: str) -> None:
    result = compose(VARIANTS[variant], "config", "-q")
    assert result.returncode == 0, describe(result)
    assert "warn" not in result.stderr.lower(), describe(result)


BREAKAGES = {
    "undefined dependency": (
        "      migrate:\n        condition: service_completed_successfully\n",
        "      migrat:\n        condition: service_completed_successfully\n",
    ),
    "unknown service property": ("    restart: unless-stopped\n", "    restart_policy: always\n"),
    "bad depends_on condition": ("condition: service_healthy", "condition: service_happy"),
    "yaml syntax": ("services:\n", "services:\n  - [\n"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_compose_file_fails_validation(tmp_path: Path, breakage: str) -> None:
    """The validity check can fail: a copy with one deliberate mistake is rejected."""
    old, new = BREAKAGES[breakage]
    text = COMPOSE_FILE.read_text()
    assert old in text, f"the breakage {breakage!r} no longer applies to {COMPOSE_FILE}"
    shutil.copytree(INFRA, tmp_path / "infra")
    broken = tmp_path / "infra" / COMPOSE_FILE.name
    broken.write_text(text.replace(old, new, 1))
    result = compose([broken], "config", "-q")
    assert result.returncode != 0, describe(result)


# --- the privilege split ----------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_owner_url_only_in_migrate_and_the_provisioner_worker(variant: str) -> None:
    model = compose_config(VARIANTS[variant])
    holders = {
        name
        for name, service in model["services"].items()
        if OWNER_URL_PREFIX in json.dumps(service)
        or "MIGRATIONS_DATABASE_URL" in json.dumps(service)
    }
    assert holders == OWNER_HOLDERS


def test_migrate_holds_the_owner_url_and_nothing_else(default_model: dict[str, Any]) -> None:
    env = env_of(default_model, "migrate")
    assert url_user(env["MIGRATIONS_DATABASE_URL"]) == "provisioner_owner"
    assert "APP_DATABASE_URL" not in env
    service = default_model["services"]["migrate"]
    assert service["command"] == ["provisioner", "migrate"]
    assert conditions(default_model, "migrate") == {"postgres": "service_healthy"}
    assert service["restart"] == "no"


def test_worker_holds_both_urls_for_the_two_roles(default_model: dict[str, Any]) -> None:
    env = env_of(default_model, "provisioner-worker")
    app, owner = env["APP_DATABASE_URL"], env["MIGRATIONS_DATABASE_URL"]
    assert url_user(app) == "app_rw"
    assert url_user(owner) == "provisioner_owner"
    # Same server and database, different roles.
    assert urlsplit(app).hostname == urlsplit(owner).hostname == "postgres"
    assert urlsplit(app).path == urlsplit(owner).path


def test_nothing_but_the_worker_gets_the_app_role_url(default_model: dict[str, Any]) -> None:
    holders = {
        name
        for name, service in default_model["services"].items()
        if "postgresql://app_rw" in json.dumps(service)
    }
    assert holders == {"provisioner-worker"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_worker_runs_provision_tenant_only_without_redis_or_email(variant: str) -> None:
    model = compose_config(VARIANTS[variant])
    env = env_of(model, "provisioner-worker")
    settings = Settings.from_env(env)
    assert settings.worker_job_types == ("provision_tenant",)
    assert settings.worker_component == "provisioner-worker"
    assert not settings.embedded
    assert "REDIS_URL" not in env
    assert not [key for key in env if re.search(r"REDIS|EMAIL|SMTP|MAIL", key)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_worker_env_names_are_all_read_by_the_settings(variant: str) -> None:
    """A misspelt variable would be silently ignored: every name must be one we read."""
    env = env_of(compose_config(VARIANTS[variant]), "provisioner-worker")
    known = package_env_names() | AWS_CREDENTIALS
    assert "MIGRATIONS_DATABASE_URL" in known, "could not read the names from the package"
    assert set(env) - known == set()


# --- dependencies, restart, scaling -----------------------------------------------------------


def test_worker_waits_for_migrate_and_minio_init_only(default_model: dict[str, Any]) -> None:
    assert conditions(default_model, "provisioner-worker") == {
        "migrate": COMPLETED,
        "minio-init": COMPLETED,
    }


def test_worker_restarts_and_can_be_scaled(default_model: dict[str, Any]) -> None:
    worker = default_model["services"]["provisioner-worker"]
    assert worker["restart"] == "unless-stopped"
    # --scale needs no fixed container name and no published host port.
    assert "container_name" not in worker
    assert not worker.get("ports")
    # The image's CMD (provisioner worker) and HEALTHCHECK apply unchanged.
    assert not worker.get("command")
    assert not (worker.get("healthcheck") or {}).get("disable")


def test_worker_and_migrate_build_the_same_image_from_the_repo(
    default_model: dict[str, Any],
) -> None:
    images = set()
    for name in ("migrate", "provisioner-worker"):
        service = default_model["services"][name]
        assert Path(service["build"]["context"]) == REPO_ROOT
        assert service["build"]["dockerfile"] == "infra/Dockerfile"
        images.add(service["image"])
    assert len(images) == 1


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_one_shot_jobs_do_not_restart(variant: str) -> None:
    model = compose_config(VARIANTS[variant])
    one_shots = {"migrate", "minio-init"} | ({"azurite-init"} if variant == "azure" else set())
    for name in one_shots:
        assert model["services"][name]["restart"] == "no", name
    for name, service in model["services"].items():
        if name not in one_shots:
            assert service.get("restart") == "unless-stopped", name


# --- postgres ---------------------------------------------------------------------------------


def test_postgres_is_initialised_by_the_bootstrap_script(default_model: dict[str, Any]) -> None:
    postgres = default_model["services"]["postgres"]
    assert postgres["image"].startswith("postgres:16")
    mounts = {v["target"]: Path(v["source"]) for v in postgres["volumes"] if v["type"] == "bind"}
    script = mounts["/docker-entrypoint-initdb.d/10-bootstrap.sh"]
    assert script == INFRA / "postgres" / "10-bootstrap.sh"
    env = env_of(default_model, "postgres")
    assert mounts[env["PROVISIONER_BOOTSTRAP_SQL"]] == INFRA / "postgres" / "bootstrap.sql"
    # The SQL is not in the init directory itself, or the entrypoint would run it twice.
    assert not [
        t for t in mounts if t.startswith("/docker-entrypoint-initdb.d/") and t.endswith(".sql")
    ]
    assert env["PROVISIONER_OWNER_PASSWORD"]
    assert env["APP_RW_PASSWORD"]
    health = postgres["healthcheck"]
    assert "pg_isready" in " ".join(health["test"])
    assert not health.get("disable")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_bind_mount_source_exists(variant: str) -> None:
    model = compose_config(VARIANTS[variant])
    for name, service in model["services"].items():
        for volume in service.get("volumes") or []:
            if volume["type"] == "bind":
                assert Path(volume["source"]).exists(), f"{name}: {volume['source']}"


def test_passwords_come_from_the_environment() -> None:
    model = compose_config(
        DEFAULT,
        overrides={
            "PROVISIONER_OWNER_PASSWORD": "owner-from-env",
            "APP_RW_PASSWORD": "app-from-env",
            "S3_READONLY_SECRET_KEY": "reader-from-env",
        },
    )
    worker = env_of(model, "provisioner-worker")
    assert urlsplit(worker["MIGRATIONS_DATABASE_URL"]).password == "owner-from-env"
    assert (
        urlsplit(env_of(model, "migrate")["MIGRATIONS_DATABASE_URL"]).password == "owner-from-env"
    )
    assert urlsplit(worker["APP_DATABASE_URL"]).password == "app-from-env"
    assert worker["AWS_SECRET_ACCESS_KEY"] == "reader-from-env"
    postgres = env_of(model, "postgres")
    assert postgres["PROVISIONER_OWNER_PASSWORD"] == "owner-from-env"
    assert postgres["APP_RW_PASSWORD"] == "app-from-env"
    assert env_of(model, "minio-init")["S3_READONLY_SECRET_KEY"] == "reader-from-env"


# --- object stores ----------------------------------------------------------------------------


def test_s3_worker_uses_the_read_only_key_minio_init_creates(default_model: dict[str, Any]) -> None:
    worker = env_of(default_model, "provisioner-worker")
    init = env_of(default_model, "minio-init")
    settings = Settings.from_env(worker)
    assert settings.object_store_provider == "s3"
    assert settings.s3_bucket == init["S3_BUCKET"]
    assert settings.s3_endpoint_url == init["MINIO_ENDPOINT"] == "http://minio:9000"
    assert worker["AWS_ACCESS_KEY_ID"] == init["S3_READONLY_ACCESS_KEY"]
    assert worker["AWS_SECRET_ACCESS_KEY"] == init["S3_READONLY_SECRET_KEY"]
    assert worker["AWS_ACCESS_KEY_ID"] != init["MINIO_ROOT_USER"]
    # MinIO's root credentials stay with MinIO and its init job.
    root_holders = {
        name
        for name, service in default_model["services"].items()
        if "MINIO_ROOT_PASSWORD" in (service.get("environment") or {})
    }
    assert root_holders == {"minio", "minio-init"}
    assert conditions(default_model, "minio-init") == {"minio": "service_healthy"}
    assert (INFRA / "minio-init.sh").is_file()


def test_azurite_serves_blob_only(default_model: dict[str, Any]) -> None:
    azurite = default_model["services"]["azurite"]
    assert azurite["image"].startswith("mcr.microsoft.com/azure-storage/azurite")
    assert azurite["command"][0] == "azurite-blob"
    assert "--skipApiVersionCheck" in azurite["command"]


def test_azure_variant_switches_the_worker_to_azurite(azure_model: dict[str, Any]) -> None:
    env = env_of(azure_model, "provisioner-worker")
    settings = Settings.from_env(env)
    assert settings.object_store_provider == "azure"
    assert (
        settings.azure_container == env_of(azure_model, "azurite-init")["AZURE_STORAGE_CONTAINER"]
    )
    assert "BlobEndpoint=http://azurite:10000/" in env["AZURE_STORAGE_CONNECTION_STRING"]
    # No S3 leftovers on the worker.
    assert not [key for key in env if key.startswith(("S3_", "AWS_"))]
    assert conditions(azure_model, "provisioner-worker") == {
        "migrate": COMPLETED,
        "azurite-init": COMPLETED,
    }
    init = azure_model["services"]["azurite-init"]
    assert init["restart"] == "no"
    assert "create_container" in " ".join(init["command"])
    assert conditions(azure_model, "azurite-init") == {"azurite": "service_started"}
