"""The poison-rate circuit breaker: a handler bug must not quietly dead-letter a topic.

A projector's ``poison_breaker = (LIMIT, WINDOW)`` (default ``(50, 100)``; ``None`` turns it
off) trips when LIMIT of the last WINDOW events one worker applied were dead-lettered
(parked events do not count: they follow a key's first dead letter by design). A single
poison event keeps the ordinary behaviour: dead-lettered, the partition moves on.

When it trips, the event that tripped it raises :class:`PoisonRateError` inside the batch's
transaction, so nothing of that batch is kept: the positions stay where the last committed
batch left them, and no more events are dead-lettered. The worker logs the error (with the
last handler traceback), records it in ``<data>/readmodels/<name>.breaker.json`` (what
``eventlane project status`` shows) and exits with :data:`EXIT_BREAKER`; ``project run``
does not replace it and, once no worker is left, exits with status 1 and the same message.
Fix the handler, ``eventlane dlq retry`` the letters written before it tripped, and start
the workers again: a starting worker clears the record.

The record, JSON: ``{"projector", "limit", "window", "dead", "topic", "partition",
"offset", "error", "pid", "tripped_ms"}``.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path
from typing import Any

import orjson

from eventlane.errors import ConfigError, ProjectionError

EXIT_BREAKER = 3
"""Exit status of a worker stopped by its breaker (``project run`` does not restart it)."""
DEFAULT = (50, 100)


class PoisonRateError(ProjectionError):
    """Too many of the last events were dead-lettered: the projector stopped applying."""

    def __init__(self, message: str, *, record: dict[str, Any]) -> None:
        super().__init__(
            message, topic=record["topic"], partition=record["partition"], offset=record["offset"]
        )
        self.record = record


class PoisonBreaker:
    """Counts events and dead letters over a sliding window of the last ``window`` events."""

    def __init__(self, projector: str, limit: int, window: int) -> None:
        if not 1 <= limit <= window:
            raise ConfigError(f"poison_breaker needs 1 <= limit <= window, got {limit}/{window}")
        self.projector = projector
        self.limit = limit
        self.window = window
        self.seen = 0
        self._dead: collections.deque[int] = collections.deque()

    def passed(self, count: int) -> None:
        """``count`` events were applied (or skipped) without a dead letter."""
        self.seen += count

    def dead_lettered(self, topic: str, partition: int, offset: int, error: str) -> None:
        """One event was dead-lettered; raise :class:`PoisonRateError` if that trips it."""
        self.seen += 1
        dead = self._dead
        dead.append(self.seen)
        while dead[0] <= self.seen - self.window:
            dead.popleft()
        if len(dead) < self.limit:
            return
        record = {
            "projector": self.projector,
            "limit": self.limit,
            "window": self.window,
            "dead": len(dead),
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "error": error,
            "pid": os.getpid(),
            "tripped_ms": int(time.time() * 1000),
        }
        raise PoisonRateError(describe(record), record=record)


def describe(record: dict[str, Any]) -> str:
    """One line for a tripped breaker (``project run``, ``project status``, worker log)."""
    last = (record.get("error") or "").strip().splitlines() or ["?"]
    return (
        f"projector {record['projector']!r} stopped applying: poison-rate breaker tripped,"
        f" {record['dead']} of the last {record['window']} events dead-lettered (limit"
        f" {record['limit']}); last error: {last[-1]}; its position is kept. Fix the handler,"
        " run `eventlane dlq retry`, then start the workers again"
    )


def breaker_path(readmodel: Path) -> Path:
    """``<data>/readmodels/<name>.breaker.json`` next to ``<name>.sqlite``."""
    return readmodel.with_suffix(".breaker.json")


def save_tripped(readmodel: Path, record: dict[str, Any]) -> None:
    path = breaker_path(readmodel)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(record))
    os.replace(tmp, path)


def load_tripped(readmodel: Path) -> dict[str, Any] | None:
    """The record of a tripped breaker, or ``None``."""
    try:
        doc = orjson.loads(breaker_path(readmodel).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def clear_tripped(readmodel: Path) -> None:
    breaker_path(readmodel).unlink(missing_ok=True)
