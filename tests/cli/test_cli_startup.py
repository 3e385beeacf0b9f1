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

from eventlane.cli import COMMANDS, main

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
    "eventlane.app",
    "eventlane.consumer",
    "eventlane.projection",
    "eventlane.replay",
    "eventlane.codec",
)
"""Never imported by ``topics list``: libraries and layers the command does not use."""

TRIMMED = ("attr", "ctypes", "_hashlib", "shutil", "rich._emoji_codes")
"""Also never imported by ``topics list``; each once was, and cost start-up time (issue 15):
``attrs`` (TopicConfig is a dataclass), ``ctypes`` (the futex loads on the first append or
wait), OpenSSL's ``_hashlib`` (the boot hash takes blake2b from ``_blake2``), ``shutil``
(only create/delete remove trees), rich's emoji table (the consoles print no emoji codes)."""

CLI = "from eventlane.cli import main; main(prog_name='eventlane')"

PROBE = """
import sys
from eventlane.cli import main
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
    assert "eventlane.cli.topics" in loaded
    assert [m for m in loaded if m.startswith(HEAVY)] == []
    assert [m for m in loaded if m.split(".")[0] in TRIMMED or m in TRIMMED] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_lazy_command_resolves(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert isinstance(command, click.Command)
    assert name in main.list_commands(click.Context(main))


HELP_PROBE = """
import sys
from eventlane.cli import main
try:
    main(sys.argv[1:], prog_name="eventlane")
except SystemExit as exc:
    assert not exc.code, exc.code
print("LOADED", *sorted(sys.modules))
"""


def plugin_modules(group: str) -> list[str]:
    """The modules the installed plugins of entry point ``group`` live in."""
    from importlib.metadata import entry_points  # noqa: PLC0415

    return [ep.value.partition(":")[0] for ep in entry_points(group=group)]


@pytest.mark.parametrize(
    ("argv", "group"),
    [(["--help"], "eventlane.commands"), (["demo", "--help"], "eventlane.demos")],
    ids=["root", "demo"],
)
def test_help_imports_no_command_and_no_plugin(argv: list[str], group: str) -> None:
    """``--help`` lists every command, built-in and installed, without importing one: the
    built-ins from COMMANDS' summaries, the plugins from their entry-point metadata (issue 36:
    importing the sample app's plugin made ``eventlane --help`` take ~1 s and 129 MiB)."""
    probe = subprocess.run(
        [sys.executable, "-c", HELP_PROBE, *argv], capture_output=True, text=True, check=False
    )
    assert probe.returncode == 0, probe.stderr
    shown, loaded_text = probe.stdout.split("LOADED", 1)
    loaded = set(loaded_text.split())
    plugins = plugin_modules(group)
    assert plugins, f"no plugin installed under {group}: this test needs example_apps installed"
    assert sorted(loaded & {*plugins, "example_apps"}) == []
    if argv[0] == "--help":  # `demo --help` imports the demo group's own module
        assert sorted(loaded & {spec.partition(":")[0] for spec, _ in COMMANDS.values()}) == []
        assert [m for m in loaded if m.startswith(HEAVY)] == []
    names = {line.split()[0] for line in shown.split("Commands:", 1)[1].splitlines() if line}
    assert names >= {"invoicing", *(COMMANDS if argv[0] != "demo" else ())}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_summary_is_what_the_command_says(name: str) -> None:
    """``--help`` shows a built-in command's summary exactly as click shortens its docstring."""
    command = main.get_command(click.Context(main), name)
    assert command is not None
    stand_in = click.Command(name, help=COMMANDS[name][1])
    for limit in range(20, 200, 7):
        assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), limit
