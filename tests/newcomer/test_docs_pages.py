"""Items 2 and 3: the docs say how to give an App its registry and upcasters (with a v1 ->
v2 example that tests/test_docs.py runs), and how to use eventlane in one's own project."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _python_blocks(name: str) -> str:
    text = (DOCS / name).read_text()
    return "\n".join(re.findall(r"^```python[ \t]*\n(.*?)^```", text, re.S | re.M))


def test_registry_and_upcasters_are_documented_with_a_runnable_example() -> None:
    events = _python_blocks("events.md")
    assert '@event("MemberRegistered", version=1)' in events
    assert '@library_registry.upcaster("MemberRegistered", 1)' in events
    assert "registry=library_registry" in events and "library.codec().decode" in events
    assert "registry=bank_registry" in _python_blocks("tutorial.md")


def test_own_project_page_covers_what_a_newcomer_needs() -> None:
    page = (DOCS / "own-project.md").read_text()
    for needle in (
        "pip install -e '/path/to/eventlane[spark]'",  # from a clone
        ".whl",  # or a wheel
        "the Python package it installs\n(`from eventlane import App, Aggregate, ...`) and the command are all `eventlane`",
        "eventlane-example-apps",  # the sample app's commands only on purpose
        "Where migrations live",
        "eventlane project run library.app:app",
        "Scenario",
        "py.typed",
        "current directory",
    ):
        assert needle in page, needle
    assert "from eventlane import" in _python_blocks("own-project.md")
    assert "docs/own-project.md" in (DOCS.parent / "README.md").read_text()
