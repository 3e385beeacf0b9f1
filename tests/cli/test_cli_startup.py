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

HEAVY = (
    "pyspark",
    "sqlite_utils",
    "sqlite3",
    "pandas",
    "cryptography",
    "nats",
    "starlette",
    "uvicorn",
    "structlog",
    "cattrs",
    "framework.app",
    "framework.consumer",
    "framework.projection",
    "framework.replay",
    "framework.codec",
)
"""Never imported by ``topics list``: libraries and layers the command does not use."""

TRIMMED = ("attr", "ctypes", "_hashlib", "shutil", "rich._emoji_codes")
"""Also never imported by ``topics list``; each once was, and cost start-up time (issue 15):
``attrs`` (TopicConfig is a dataclass), ``ctypes`` (the futex loads on the first append or
wait), OpenSSL's ``_hashlib`` (the boot hash takes blake2b from ``_blake2``), ``shutil``
(only create/delete remove trees), rich's emoji table (the consoles print no emoji codes)."""

CLI = "from framework.cli import main; main(prog_name='eventlane')"

PROBE = """
import sys
from framework.cli import main
try:
    main(["--data", sys.argv[1], "topics", "list", *sys.argv[2:]], prog_name="eventlane")
except SystemExit as exc:
    assert not exc.code, exc.code
print("LOADED", *sorted(sys.modules))
"""


@pytest.mark.parametrize("form", [["--json"], []], ids=["json", "table"])
def test_topics_list_imports_no_heavy_module(tmp_path: Path, form: list[str]) -> None:
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
        [sys.executable, "-c", PROBE, data, *form], capture_output=True, text=True, check=False
    )
    assert probe.returncode == 0, probe.stderr
    assert ('"t"' if form else "│ t ") in probe.stdout
    loaded = probe.stdout.split("LOADED", 1)[1].split()
    assert "framework.cli.topics" in loaded
    assert [m for m in loaded if m.startswith(HEAVY)] == []
    assert [m for m in loaded if m.split(".")[0] in TRIMMED or m in TRIMMED] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_lazy_command_resolves(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert isinstance(command, click.Command)
    assert name in main.list_commands(click.Context(main))
