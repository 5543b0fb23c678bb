"""One error tree: every exception class the package defines is under ProvisionerError, with
its exit code, except the one signal that must not be (said in errors.py and its docstring)."""

from __future__ import annotations

import importlib
import pkgutil
import re

import provisioner
from provisioner import errors
from provisioner.worker.processes import Interrupted

#: Outside the tree on purpose, each saying why in its docstring.
OUTSIDE = {Interrupted}


def exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(provisioner.__path__, "provisioner."):
        if info.name == "provisioner.__main__":
            continue  # running it is the CLI
        module = importlib.import_module(info.name)
        found.extend(
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, BaseException)
            and value.__module__ == info.name
        )
    return found


def test_every_exception_class_of_the_package_is_under_the_root() -> None:
    found = exception_classes()
    assert errors.StepFailed in found and Interrupted in found
    assert [c for c in found if not issubclass(c, errors.ProvisionerError)] == list(OUTSIDE)
    for outside in OUTSIDE:
        assert "Outside the" in (outside.__doc__ or "")
        assert outside.__name__ in (errors.__doc__ or "")


def test_each_class_is_drawn_with_its_exit_code() -> None:
    drawing = errors.__doc__ or ""
    drawn = {name: int(code) for name, code in re.findall(r"(\w+) \((\d)\)", drawing)}
    assert drawn and all(getattr(errors, name).exit_code == code for name, code in drawn.items())
    for cls in exception_classes():
        if issubclass(cls, errors.ProvisionerError) and cls.__module__ == errors.__name__:
            assert cls.__name__ in drawing, cls
            assert cls.exit_code in (1, 2, 3), cls
