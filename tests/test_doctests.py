"""Run the examples in the framework's docstrings (pure functions document themselves)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import eventlane


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(eventlane.__path__, "eventlane."):
        if info.name.startswith(("eventlane.replay", "eventlane.cli")):
            continue  # Spark and CLI modules are covered by their own tests
        if info.name.endswith(".__main__"):
            continue  # entry points run when imported
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
