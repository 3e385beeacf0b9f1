"""Rebuilds of a projection whose read model is in PostgreSQL (issue 34).

Rebuilding into a PostgreSQL shadow schema is not built yet: a hand-off (``--swap``) of such
a projection must be refused before anything runs, never "succeed" by swapping a SQLite file
nobody reads while the live schema stays as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from projection_kit import Producer

from framework.app import Runtime
from framework.errors import ConfigError
from framework.replay.handoff import rebuild_and_swap


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_swap_into_a_postgresql_read_model_is_refused(
    engine: str, runtime: Runtime, data: Path
) -> None:
    Producer(runtime).deposits(50)
    with pytest.raises(ConfigError, match="PostgreSQL"):
        rebuild_and_swap(runtime, "balances", engine="local")
    assert not (data / "readmodels" / "balances.sqlite").exists()
