"""docs/consumer-groups.md: its Python examples run, and it shows every group CLI command."""

from __future__ import annotations

import re
from pathlib import Path

import click

from framework.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "consumer-groups.md"


def test_python_examples_run_top_to_bottom(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict[str, object] = {"__name__": "docs_consumer_groups"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name}[python block {i + 1}]", "exec"), namespace)
    namespace["store"].close()  # type: ignore[attr-defined]


def test_every_groups_command_and_consume_option_is_documented() -> None:
    text = DOC.read_text()
    groups = main.commands["groups"]
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
