"""Fixtures of the projection tests; the helpers live in ``projection_kit.py``.

Test modules import helpers from ``projection_kit`` (a unique module name), never from
``conftest``: when pytest loads several directories' conftests before collecting, the bare
name ``conftest`` means whichever came last.
"""

from projection_kit import (  # noqa: F401  (fixtures and hooks pytest finds here)
    data,
    engine,
    producer,
    pytest_runtest_makereport,
    runtime,
    workers,
)
