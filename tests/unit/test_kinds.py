"""One place per kind: the registry loads every kind from its module, built-in or not, and the
engine, the settings and the queue's callers learn all a kind is from its JobKind."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from dataclasses import replace
from pathlib import Path

import pytest

import provisioner
from provisioner import errors, kinds
from provisioner.errors import ConfigurationError
from provisioner.kinds import Scope
from provisioner.kinds import provision as provision_kind
from provisioner.kinds.provision import PROVISION_JOB_TYPE
from provisioner.models import Job, JobStatus
from provisioner.settings import DEFAULT_JOB_TYPES, Settings

PACKAGE = Path(kinds.__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    """Every module a source file imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_every_builtin_kind_comes_from_a_module_of_the_kinds_package() -> None:
    for name in kinds.BUILTIN_MODULES:
        assert name.startswith("provisioner.kinds.")
    from_modules = [
        kind.name
        for name in kinds.BUILTIN_MODULES
        for kind in __import__(name, fromlist=["JOB_KINDS"]).JOB_KINDS
    ]
    assert from_modules == list(kinds.BUILTIN.kinds)


def test_the_settings_default_job_types_are_the_registrys_default() -> None:
    assert kinds.BUILTIN.default_worker == DEFAULT_JOB_TYPES
    assert kinds.worker_job_types(Settings()) == kinds.BUILTIN.default_worker


def test_with_kind_modules_the_registry_resolves_the_default_job_types() -> None:
    settings = Settings.from_env({"PROVISIONER_JOB_KIND_MODULES": "tests.unit.test_kinds"})
    assert settings.worker_job_types == ()  # the registry's to resolve
    assert kinds.worker_job_types(settings) == (PROVISION_JOB_TYPE, "drained_by_default")
    explicit = replace(settings, worker_job_types=("drained_by_default",))
    assert kinds.worker_job_types(explicit) == ("drained_by_default",)


JOB_KINDS = (kinds.JobKind("drained_by_default", default_worker=True),)


def test_a_kind_module_that_does_not_import_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="PROVISIONER_JOB_KIND_MODULES"):
        kinds.registry(["tests.unit.no_such_kind_module"])


def test_settings_import_no_kind() -> None:
    assert not {m for m in imports_of(PACKAGE / "settings.py") if "kinds" in m}


@pytest.mark.parametrize("name", ["engine.py", "sessions.py", "events.py", "runner.py"])
def test_the_engine_knows_no_kind_by_name(name: str) -> None:
    path = PACKAGE / "engine" / name
    source = path.read_text()
    for word in ("PROVISION_JOB_TYPE", "provision_tenant", "run_tenant_migrations", "STEPS"):
        assert word not in source, f"{name} names {word}"
    imported = imports_of(path)
    assert not {m for m in imported if m.startswith("provisioner.pool")}
    assert not {m for m in imported if m.startswith("provisioner.kinds.")} - {
        "provisioner.kinds.JobKind",
        "provisioner.kinds.KindRegistry",
        "provisioner.kinds.Scope",
        "provisioner.kinds.Step",
        "provisioner.kinds.StepContext",
    }


def job(payload: dict[str, str], done: list[str]) -> Job:
    return Job(
        id=__import__("uuid").UUID(int=1),
        tenant_id="acme",
        job_type=PROVISION_JOB_TYPE,
        status=JobStatus.RUNNING,
        progress=0,
        steps_completed=done,
        error_detail=None,
        attempts=1,
        max_attempts=5,
        payload=payload,
    )


def test_the_provisioning_kinds_scope_is_the_migration_step_alone_for_a_fleet_upgrade() -> None:
    kind = kinds.BUILTIN[PROVISION_JOB_TYPE]
    head = provision_kind.migrations.head_label(provision_kind.migrations.tenant_heads())
    steps = [s for s in provision_kind.STEPS if s != provision_kind.MIGRATION_STEP]
    assert kind.scope(job({"upgrade_to": head}, steps)) is Scope.PENDING
    assert kind.scope(job({"upgrade_to": "t000"}, steps)) is Scope.ALL  # the head moved on
    assert kind.scope(job({}, steps)) is Scope.ALL
    assert kinds.BUILTIN["suspend_tenant"].scope(job({"upgrade_to": head}, [])) is Scope.ALL


def test_the_pools_plans_and_memo_belong_to_the_provisioning_kind() -> None:
    kind = kinds.BUILTIN[PROVISION_JOB_TYPE]
    assert kinds.BUILTIN.prepared_plans == kind.prepared_plans != ()
    assert isinstance(kind.memo(), provision_kind.SpareMemo)
    assert not hasattr(kinds.RunMemo(), "spare_taken")


def test_the_permanent_rule_is_written_once() -> None:
    assert errors.is_permanent(errors.WrongState("x"))
    assert errors.is_permanent(errors.InvalidInput("x"))
    assert errors.is_permanent(errors.GrantVerificationFailed("x"))
    assert not errors.is_permanent(errors.DatabaseUnavailable("x"))
    assert not errors.is_permanent(RuntimeError("x"))


#: The modules whose exceptions this test holds to the tree (the worker's process signals are
#: its own business).
UNDER_THE_ROOT = ("db", "engine", "kinds", "pool", "templates", "tenant", "errors", "models")


def test_every_exception_class_of_the_engine_and_below_is_under_the_root() -> None:
    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(provisioner.__path__, "provisioner."):
        if info.name.split(".")[1] not in UNDER_THE_ROOT:
            continue
        module = importlib.import_module(info.name)
        found.extend(
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, BaseException)
            and value.__module__ == info.name
        )
    assert errors.StepFailed in found and errors.SpareRejected in found
    assert [c for c in found if not issubclass(c, errors.ProvisionerError)] == []
    assert errors.StepFailed("x").exit_code == 1
