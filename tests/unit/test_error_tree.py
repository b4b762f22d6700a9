"""One exception root: every exception class the package defines sits under
ProtomoltJobsError, except the two the errors module names as outside on purpose."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import protomolt_jobs
from protomolt_jobs.errors import ActionError, ProtomoltJobsError

OUTSIDE = {"protomolt_jobs.hooks.contract.ComposerError", "protomolt_jobs.service.InjectedFailure"}


def _exception_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(protomolt_jobs.__path__, "protomolt_jobs."):
        if ".pb." in info.name or info.name.endswith(("__main__", ".pb")):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_exception_of_ours_has_the_one_root():
    classes = _exception_classes()
    assert len(classes) > 20
    stray = sorted(n for n, c in classes.items() if not issubclass(c, ProtomoltJobsError))
    assert stray == sorted(OUTSIDE)


def test_the_verb_boundary_keeps_its_codes():
    from protomolt_jobs.errors import ERROR_CLASSES

    assert all(issubclass(c, ActionError) for c in ERROR_CLASSES.values())
    assert {c.code for c in ERROR_CLASSES.values()} == set(ERROR_CLASSES)
