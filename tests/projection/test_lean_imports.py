"""The projection layer loads sqlite-utils without pandas and numpy (half a second per
worker and per ``eventlane project`` command), and leaves both importable afterwards."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import eventlane.projection
import eventlane.projection.readmodel
loaded = sorted(m for m in ("pandas", "numpy") if m in sys.modules)
import pandas, numpy  # still importable, as usual
import sqlite_utils.db
print(loaded, sys.modules["pandas"] is pandas, type(numpy.int64(1)).__name__)
"""

ALREADY = """
import sys
import pandas
import eventlane.projection.readmodel
import sqlite_utils.db
print(sqlite_utils.db.pd is pandas)
"""


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_projection_layer_does_not_import_pandas_or_numpy() -> None:
    assert _run(PROBE) == "[] True int64"


def test_a_process_that_imported_pandas_first_keeps_it_in_sqlite_utils() -> None:
    assert _run(ALREADY) == "True"
