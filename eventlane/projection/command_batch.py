"""The command side as one batch's handlers see it: their schedules are written together.

An applier hands its handlers (``ctx.app``) a :class:`BatchedCommandSide` around the
application: ``schedule``/``cancel_schedule`` go to the application's schedule batch
(``app.schedule_batch()``, :class:`eventlane.app.schedules.ScheduleBatch`), everything else
to the application itself. The applier calls :meth:`BatchedCommandSide.flush` before it
commits positions, so an event whose position is committed has its schedules stored; were the
process to die before the flush, the event is redelivered and asks again (the schedule's id
is derived from the event: the same schedule). An application without ``schedule_batch``
(a test double) is used as it is.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BatchedCommandSide", "batched", "flush"]


class BatchedCommandSide:
    """``app`` with its schedule writes collected until :meth:`flush` (module docstring)."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._batch = app.schedule_batch()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)

    def schedule(self, command: Any, *, at: Any, key: str, caused_by: str | None = None) -> str:
        sid: str = self._batch.schedule(command, at=at, key=key, caused_by=caused_by)
        return sid

    def cancel_schedule(self, key: str) -> bool:
        done: bool = self._batch.cancel(key)
        return done

    def flush(self) -> None:
        """Write the schedules and cancels asked for since the last flush."""
        self._batch.flush()


def batched(app: Any) -> Any:
    """``app`` wrapped when it can batch schedules (``None`` and others as they are)."""
    if app is None or not callable(getattr(app, "schedule_batch", None)):
        return app
    return BatchedCommandSide(app)


def flush(app: Any) -> None:
    """Flush ``app``'s batch if it is a :class:`BatchedCommandSide`."""
    if isinstance(app, BatchedCommandSide):
        app.flush()
