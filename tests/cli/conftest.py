"""Fixtures for the CLI tests: run ``eventlane`` in-process (CliRunner) or as a real process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from eventlane.cli import main

Cli = Callable[..., Result]


@pytest.fixture
def cli(data_dir: Path) -> Cli:
    """``cli("topics", "list", input=...)`` runs ``eventlane --data <data_dir> topics list``."""

    def run(*args: str, input: bytes | str | None = None, data: Path | None = data_dir) -> Result:
        runner = CliRunner(env={"EVENTLANE_DATA": None, "EVENTLANE_LOG_LEVEL": None})
        argv = [*(["--data", str(data)] if data is not None else []), *args]
        return runner.invoke(main, argv, input=input, catch_exceptions=False)

    return run
