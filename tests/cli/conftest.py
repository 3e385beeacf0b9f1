"""Fixtures for the CLI tests: run ``eventlane`` in-process (CliRunner) or as a real process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner, Result

from framework.cli import main

Cli = Callable[..., Result]


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """The CLI configures structlog for the process; put the previous configuration back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
def cli(data_dir: Path) -> Cli:
    """``cli("topics", "list", input=...)`` runs ``eventlane --data <data_dir> topics list``."""

    def run(*args: str, input: bytes | str | None = None, data: Path | None = data_dir) -> Result:
        runner = CliRunner(env={"EVENTLANE_DATA": None, "EVENTLANE_LOG_LEVEL": None})
        argv = [*(["--data", str(data)] if data is not None else []), *args]
        return runner.invoke(main, argv, input=input, catch_exceptions=False)

    return run
