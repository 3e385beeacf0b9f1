"""The web console (``eventlane console``): topics, records, aggregates, consumer groups,
lag, projectors and read models in a browser. Guide: ``docs/console.md``.

* :mod:`.data`: the one module that calls the framework (the log port, group admin, the app
  runtime, dead letters, rebuild) and returns JSON-able dicts;
* :mod:`.web`: the Starlette app (Jinja2 pages, htmx fragments, SSE streams, ``/api/...``),
  read-only unless started with ``--read-write``;
* :mod:`.lag`: lag over time, sampled by the console.

Needs the ``console`` extra (``pip install 'eventlane[console]'``).
"""

from eventlane.console.data import ConsoleData, Filters, open_log
from eventlane.console.web import create_app

__all__ = ["ConsoleData", "Filters", "create_app", "open_log"]
