"""The console's view of an app's schedules (deadlines, :mod:`eventlane.app.schedules`).

Read-only: the rows are a fold of the app's ``<app>.schedules`` topic, read from its
low-water mark to its high-water mark; nothing is written. One row per schedule key, its
latest state::

    {"key", "due_ms", "command", "state": "pending" | "fired" | "cancelled", "fired_ms",
     "partition", "offset"}

No personal values: a row names the command's *type*, never its fields (a command is data
stored in clear, and documented to carry no personal values, but the console shows even
less: what is due, when, and what became of it). Rows come in order of their moment.
"""

from __future__ import annotations

from typing import Any

from eventlane.app import Runtime
from eventlane.app.schedules import Schedules
from eventlane.errors import ConfigError

__all__ = ["STATES", "schedule_rows"]

STATES = {"scheduled": "pending", "fired": "fired", "cancelled": "cancelled"}
"""A schedule record's state -> the name the console shows."""


def schedule_rows(runtime: Runtime, state: str | None = None) -> list[dict[str, Any]]:
    """The app's schedules (module docstring), only those in ``state`` (``pending``,
    ``fired``, ``cancelled``; ``None`` or ``all``: every one)."""
    if state in (None, "", "all"):
        wanted = None
    elif state in STATES.values():
        wanted = state
    else:
        raise ConfigError(
            f"schedule state must be one of all, {', '.join(STATES.values())}; got {state!r}"
        )
    rows = [
        {
            "key": e.key,
            "due_ms": e.at,
            "command": e.command,
            "state": STATES.get(e.state, e.state),
            "fired_ms": e.fired_at,
            "partition": e.partition,
            "offset": e.offset,
        }
        for e in Schedules(runtime).entries().values()
    ]
    rows.sort(key=lambda r: (r["due_ms"], r["key"]))
    return [r for r in rows if wanted is None or r["state"] == wanted]
