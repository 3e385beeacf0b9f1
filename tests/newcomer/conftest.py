"""Fixtures of the newcomer tests: a working directory holding the ``library`` app."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.newcomer.kit import write_app


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A user's project directory: the ``library`` package, no data yet."""
    return write_app(tmp_path / "myapp")
