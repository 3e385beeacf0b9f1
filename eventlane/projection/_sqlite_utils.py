"""sqlite-utils without pandas and numpy: the one place the projection layer imports it.

sqlite-utils imports pandas and numpy at import time when they are installed (the ``spark``
extra installs both), only to map their scalar types to column types in ``insert``. That
costs about half a second per process (0.57 s against 0.11 s here), paid by every worker,
every ``eventlane project ...`` command and every Spark task that opens a read model. While
sqlite-utils loads, and only if the process has not imported them already, ``import pandas``
and ``import numpy`` are made to fail (a ``None`` entry in ``sys.modules``), so sqlite-utils
takes its "not installed" branch; the entries are removed right after, and the process can
import both as usual later. The only thing lost is sqlite-utils' automatic column type for
a pandas or numpy scalar passed to ``insert``/``upsert`` in a process that had not imported
pandas/numpy before eventlane: pass plain Python values (or import pandas first).
"""

from __future__ import annotations

import sys

_BLOCKED = tuple(name for name in ("pandas", "numpy") if name not in sys.modules)
for _name in _BLOCKED:
    sys.modules[_name] = None  # type: ignore[assignment]
try:
    from sqlite_utils import Database, Migrations
finally:
    for _name in _BLOCKED:
        if sys.modules.get(_name, 0) is None:
            del sys.modules[_name]

__all__ = ["Database", "Migrations"]
