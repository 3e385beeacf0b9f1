"""Capturing eventlane's log records in tests, as dicts: ``event``, ``log_level``, ``logger``
and the record's fields (eventlane's loggers are standard-library loggers under
``eventlane``; :mod:`eventlane.observability`).

    >>> from eventlane.observability import get_logger
    >>> with capture_logs() as logs:
    ...     get_logger("eventlane.doc").warning("segment truncated", topic="t", offset=7)
    >>> logs[0]["event"], logs[0]["topic"], logs[0]["log_level"]
    ('segment truncated', 't', 'warning')
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.entries: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "eventlane_fields", {})
        event = getattr(record, "eventlane_event", record.getMessage())
        self.entries.append(
            {"event": event, "log_level": record.levelname.lower(), "logger": record.name, **fields}
        )


@contextmanager
def capture_logs(name: str = "eventlane") -> Iterator[list[dict[str, Any]]]:
    """Every record of logger ``name`` and its children, at every level, while inside."""
    logger = logging.getLogger(name)
    handler = _Capture()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.entries
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
