"""The application object: a declaration of aggregates, events and projectors, no I/O.

The CLI's ``APP`` argument (``module:attribute``, or ``$EVENTLANE_APP``) names an :class:`App`;
``app.open(data_dir)`` connects it to a log and returns a :class:`Runtime` (the command side
of :class:`~framework.store.Application` plus the projectors)::

    app = App("invoicing", aggregates=[Order, Invoice], projectors=[Invoices])
    with app.open("./eventlane-data") as runtime:
        runtime.save(order)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from framework.codec import EventRegistry
from framework.codec.converter import OrjsonConverter
from framework.domain import Aggregate, DomainEvent
from framework.errors import ConfigError
from framework.log import Log
from framework.projection.projector import Projector
from framework.projection.readmodel import readmodel_path
from framework.store import Application


class App:
    """What an application is made of. Cheap to import; :meth:`open` does the I/O."""

    def __init__(
        self,
        name: str,
        *,
        aggregates: Iterable[type[Aggregate]] = (),
        events: Iterable[type[DomainEvent]] = (),
        projectors: Iterable[type[Projector]] = (),
        registry: EventRegistry | None = None,
        partitions: int | Mapping[str, int] = 6,
        configure: Callable[[OrjsonConverter], None] | None = None,
    ) -> None:
        self.name = name
        self.aggregates = tuple(aggregates)
        self.events = tuple(events)
        self.projectors: dict[str, type[Projector]] = {}
        for cls in projectors:
            pname = getattr(cls, "name", None)
            if not isinstance(pname, str) or not pname:
                raise ConfigError(f"projector {cls.__qualname__} has no name")
            if pname in self.projectors:
                raise ConfigError(f"two projectors named {pname!r}")
            self.projectors[pname] = cls
        self.registry = registry if registry is not None else EventRegistry()
        self.partitions = partitions
        self.configure = configure

    def projector(self, name: str) -> type[Projector]:
        try:
            return self.projectors[name]
        except KeyError:
            raise ConfigError(
                f"app {self.name!r} has no projector {name!r}; it has "
                f"{', '.join(sorted(self.projectors)) or 'none'}"
            ) from None

    def open(self, log: Log | str | Path | None = None) -> Runtime:
        """Connect to a log (a :class:`Log`, or a data directory for the embedded one)."""
        return Runtime(self, log)


class Runtime(Application):
    """An :class:`App` connected to a log: save/load aggregates, find read models."""

    def __init__(self, app: App, log: Log | str | Path | None) -> None:
        registry = app.registry
        for cls in app.projectors.values():
            registry.register(*cls.handled_types())
        super().__init__(
            log,
            aggregates=app.aggregates,
            events=app.events,
            registry=registry,
            partitions=app.partitions,
            configure=app.configure,
        )
        self.app = app

    def readmodel_path(self, projector: str) -> Path:
        self.app.projector(projector)
        return readmodel_path(self.log.path, projector)

    def __enter__(self) -> Runtime:
        return self


def load_app(spec: str | None = None) -> App:
    """Import the :class:`App` named ``module:attribute`` (default ``$EVENTLANE_APP``)."""
    spec = spec or os.environ.get("EVENTLANE_APP")
    if not spec or ":" not in spec:
        raise ConfigError(f"APP must be 'module:attribute' (or set EVENTLANE_APP), got {spec!r}")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for APP {spec!r}: {exc}") from None
    app: Any = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not an eventlane App (got {type(app).__name__})")
    return app
