"""The application layer: the composition root above projection, below replay and cli.

* :class:`App` declares an application's aggregates, events and projectors (no I/O);
* :class:`Runtime` is an :class:`App` connected to a log (``app.open(data)``): the one
  object that saves, loads and executes on aggregates, issues policy commands and waits for
  read models;
* :func:`load_app` imports the :class:`App` a command names (``module:attribute``).

The projection layer does not import this one: a worker sees a runtime through
:class:`eventlane.projection.host.ProjectionHost`, a handler through
:class:`eventlane.projection.CommandSide`.
"""

from eventlane.app.application import App, Runtime
from eventlane.app.loading import load_app

__all__ = ["App", "Runtime", "load_app"]
