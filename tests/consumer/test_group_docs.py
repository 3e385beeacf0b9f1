"""docs/consumer-groups.md shows every group CLI command and option.

(Its Python examples run with every other doc's in ``tests/test_docs.py``.)
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from eventlane.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "consumer-groups.md"


def test_the_doc_has_runnable_examples() -> None:
    assert len(re.findall(r"^```python\n", DOC.read_text(), flags=re.M)) >= 5


def test_every_groups_command_and_consume_option_is_documented() -> None:
    text = DOC.read_text()
    groups = main.get_command(click.Context(main), "groups")  # (the root group loads lazily)
    assert isinstance(groups, click.Group)
    for name in groups.commands:
        assert f"eventlane groups {name}" in text, name
    for option in ("--group", "--commit before", "--session-timeout-ms", "--follow"):
        assert option in text, option
    for flag in (
        "--to-earliest",
        "--to-latest",
        "--to-offset",
        "--to-datetime",
        "--shift-by",
        "--execute",
        "--json",
    ):
        assert flag in text, flag
