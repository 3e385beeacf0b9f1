"""Moments for time travel: ``as_of`` arguments as epoch milliseconds.

A moment is a timezone-aware :class:`~datetime.datetime` or epoch milliseconds (what record
timestamps are). "As of T" means: the records each partition holds before its first record
stamped *after* T (Kafka's ``offsetsForTimes(T + 1)``): a prefix of every partition, never a
filter (``docs/time-travel.md``).
"""

from __future__ import annotations

from datetime import datetime

from eventlane.errors import ConfigError

__all__ = ["as_of_ms"]


def as_of_ms(moment: datetime | int) -> int:
    """Epoch milliseconds of ``moment``.

    >>> from datetime import UTC, datetime
    >>> as_of_ms(datetime(2024, 1, 1, tzinfo=UTC))
    1704067200000
    >>> as_of_ms(1704067200000)
    1704067200000
    """
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise ConfigError(f"as_of must be timezone-aware, got {moment.isoformat()}")
        return int(moment.timestamp() * 1000)
    if isinstance(moment, bool) or not isinstance(moment, int):
        raise ConfigError(f"as_of must be a datetime or epoch milliseconds, got {moment!r}")
    return moment
