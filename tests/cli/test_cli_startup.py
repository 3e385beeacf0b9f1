"""CLI start-up: a command imports only the modules it uses (issue 15, CLI start-up).

Speed itself is measured by benchmarks/bench_cli_startup.py; this checks the mechanism: the
root group imports a subcommand's module only when the command line names it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from framework.cli import COMMANDS, main

HEAVY = ("pyspark", "sqlite_utils", "pandas", "framework.projection", "framework.replay")

CLI = "from framework.cli import main; main(prog_name='eventlane')"

PROBE = """
import sys
from framework.cli import main
try:
    main(["--data", sys.argv[1], "topics", "list", "--json"], prog_name="eventlane")
except SystemExit as exc:
    assert not exc.code, exc.code
print("LOADED", *sorted(sys.modules))
"""


def test_topics_list_imports_no_heavy_module(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    create = ["topics", "create", "t", "--partitions", "1"]
    made = subprocess.run(
        [sys.executable, "-c", CLI, "--data", data, *create],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, data], capture_output=True, text=True, check=False
    )
    assert probe.returncode == 0, probe.stderr
    assert '"t"' in probe.stdout
    loaded = probe.stdout.split("LOADED", 1)[1].split()
    assert "framework.cli.topics" in loaded
    assert [m for m in loaded if m.startswith(HEAVY)] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_lazy_command_resolves(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert isinstance(command, click.Command)
    assert name in main.list_commands(click.Context(main))
