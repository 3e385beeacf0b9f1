"""The application object: a declaration of aggregates, events and projectors, no I/O.

The CLI's ``APP`` argument (``module:attribute``, or ``$EVENTLANE_APP``) names an :class:`App`;
``app.open(data_dir)`` connects it to a log and returns a :class:`Runtime` (the command side
of :class:`~framework.store.Application` plus the projectors)::

    app = App("invoicing", aggregates=[Order, Invoice], projectors=[Invoices])
    with app.open("./eventlane-data") as runtime:
        written = runtime.save(order)
        runtime.wait_for("invoices", written, timeout=5.0)   # read your own writes

Policies reach the command side through :meth:`Runtime.issue` (``ctx.issue`` in a handler),
which issues a command at most once per triggering event.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import structlog

from framework.codec import Envelope, EventCodec, EventRegistry
from framework.codec.converter import OrjsonConverter
from framework.domain import Aggregate, DomainEvent
from framework.errors import AggregateNotFoundError, ConcurrencyError, ConfigError
from framework.log import Log, RecordMetadata, TopicPartition
from framework.projection.projector import Projector
from framework.projection.readmodel import readmodel_path
from framework.projection.status import offsets_after, projection_status, wait_for_offsets
from framework.store import Application

log = structlog.get_logger("eventlane.projection")

A = TypeVar("A", bound=Aggregate)


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

    def codec(self) -> EventCodec:
        """The codec a :class:`Runtime` of this app uses (every aggregate's, declared and
        handled event registered, upcasters included), with no log and no data directory:
        what golden-file tests of stored events need::

            env = app.codec().decode(None, b'{"type":"MemberRegistered","version":1,...}')
        """
        registry = self.registry
        registry.register_aggregate(*self.aggregates)
        registry.register(*self.events)
        for cls in self.projectors.values():
            registry.register(*cls.handled_types())
        registry.validate()
        return EventCodec(registry, configure=self.configure)

    def open(self, log: Log | str | Path | None = None, *, create_topics: bool = True) -> Runtime:
        """Connect to a log (a :class:`Log`, or a data directory for the embedded one).

        ``create_topics=False`` opens without creating the aggregates' topics (tools that
        only look)."""
        return Runtime(self, log, create_topics=create_topics)


class Runtime(Application):
    """An :class:`App` connected to a log: save/load aggregates, find read models."""

    def __init__(
        self, app: App, log: Log | str | Path | None, *, create_topics: bool = True
    ) -> None:
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
            create_topics=create_topics,
        )
        self.app = app

    def readmodel_path(self, projector: str) -> Path:
        self.app.projector(projector)
        return readmodel_path(self.log.path, projector)

    # ------------------------------------------------------------------ queries
    def wait_for(
        self,
        projector: str,
        written: Iterable[RecordMetadata] | Mapping[TopicPartition, int],
        timeout: float = 10.0,
    ) -> bool:
        """Read-your-writes: wait until ``projector`` has applied ``written`` (what
        :meth:`save` returned, or ``{partition: next offset}``). False on timeout."""
        return wait_for_offsets(
            self.log, self.readmodel_path(projector), offsets_after(written), timeout
        )

    def status(self, projector: str) -> dict[str, Any]:
        """Positions, high-water marks, lag and members of ``projector`` (see
        :func:`framework.projection.status.projection_status`)."""
        cls = self.app.projector(projector)
        return projection_status(
            self.log, projector, cls.topics, self.readmodel_path(projector), cls.migrations
        )

    # ------------------------------------------------------------------ policies
    def issue(
        self,
        cls: type[A],
        aggregate_id: str,
        command: Callable[[A], Any],
        *,
        caused_by: Envelope[Any] | str,
        create: bool = True,
        attempts: int = 20,
    ) -> list[RecordMetadata]:
        """Run ``command`` on aggregate ``aggregate_id`` and save what it records, unless an
        event caused by ``caused_by`` is already in that aggregate's stream.

        The idempotent command of a policy: the saved events carry ``caused_by``'s event id
        as their ``causation_id`` (and its correlation id, or that event id, as their
        ``correlation_id``). The check and the save are one optimistic-concurrency step: if
        two deliveries of the same event race (a zombie and the partition's new owner), one
        save conflicts, reloads, sees the other's event and does nothing. Hence: pick
        ``aggregate_id`` deterministically from the triggering event, and still make the
        command a no-op when its work is done (a command that records nothing leaves no
        causation mark to find). The target's whole stream is read: keep policy targets
        small (an invoice, a shipment), not a long-lived ledger.

        Returns the appended records' metadata (empty when nothing was appended).
        """
        if isinstance(caused_by, str):
            causation, correlation = caused_by, caused_by
        else:
            causation = str(caused_by.event_id)
            correlation = caused_by.correlation_id or causation
        for attempt in range(1, attempts + 1):
            history = self.store.read(cls.topic, aggregate_id)
            if any(env.causation_id == causation for env in history):
                log.info(
                    "command already issued for this event; not again",
                    topic=cls.topic,
                    aggregate_id=aggregate_id,
                    causation_id=causation,
                )
                return []
            if not history and not create:
                raise AggregateNotFoundError(
                    f"no events for {cls.__qualname__} {aggregate_id!r}", topic=cls.topic
                )
            aggregate = cls.rehydrate(aggregate_id, [env.event for env in history])
            command(aggregate)
            try:
                return self.save(aggregate, correlation_id=correlation, causation_id=causation)
            except ConcurrencyError:
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def __enter__(self) -> Runtime:
        return self


def load_app(spec: str | None = None) -> App:
    """Import the :class:`App` named ``module:attribute``, or ``module`` (its attribute
    ``app``); default ``$EVENTLANE_APP``.

    The module is looked up in the current directory first, then on ``sys.path``, as
    ``uvicorn``, ``flask`` and ``celery`` do. A file path (``library/app.py[:app]``) under
    the current directory is accepted as its dotted module name (``library.app:app``).
    """
    spec = spec or os.environ.get("EVENTLANE_APP")
    if not spec:
        raise ConfigError("APP must be 'module:attribute' or 'module' (or set EVENTLANE_APP)")
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    module_name = _module_of_path(module_name, attr, spec)
    if not module_name:
        raise ConfigError(f"APP must be 'module:attribute' or 'module', got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # what `python -m` gives a script: the current directory
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"cannot import {module_name!r} for APP {spec!r}: {exc} (APP is module:attribute,"
            f" e.g. library.app:app, importable from the current directory {cwd} or PYTHONPATH)"
        ) from None
    app: Any = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not an eventlane App (got {type(app).__name__})")
    return app


def _module_of_path(name: str, attr: str, spec: str) -> str:
    """``library/app.py`` -> ``library.app`` (a path under the current directory)."""
    if "/" not in name and os.sep not in name and not name.endswith(".py"):
        return name
    path = Path(name)
    if path.is_absolute() and path.is_relative_to(Path.cwd()):
        path = path.relative_to(Path.cwd())
    dotted = ".".join(path.with_suffix("").parts) if path.suffix == ".py" else ""
    if path.is_absolute() or ".." in path.parts or not dotted.replace(".", "").isidentifier():
        package = path.resolve().parent
        raise ConfigError(
            f"APP {spec!r} is a path outside the current directory; give it as"
            f" module:attribute, e.g. {package.name}.{path.stem}:{attr}, and run from"
            f" {package.parent} (the directory that holds the package)"
        )
    return dotted
