"""eventlane: event sourcing and CQRS on a partitioned, compacted, append-only log.

Everything an application needs is importable from here (``docs/api.md`` lists it)::

    from eventlane import Aggregate, App, DomainEvent, EventContext, Projector, event

The names are imported lazily, on first use (PEP 562), so ``import eventlane`` is cheap and
has no side effects: it configures no logging (eventlane's loggers are standard-library
loggers under ``eventlane.``, governed by the application's configuration; the ``eventlane``
command and its worker processes configure their own output, see
:mod:`eventlane.observability`).
Machinery stays in the subpackages (``eventlane.log``, ``eventlane.consumer``,
``eventlane.projection``, ``eventlane.replay`` …).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from eventlane.app import App as App
    from eventlane.app import Runtime as Runtime
    from eventlane.codec import Envelope as Envelope
    from eventlane.codec import EventRegistry as EventRegistry
    from eventlane.consumer import Consumer as Consumer
    from eventlane.consumer import GroupConsumer as GroupConsumer
    from eventlane.domain import Aggregate as Aggregate
    from eventlane.domain import DomainEvent as DomainEvent
    from eventlane.domain import applies as applies
    from eventlane.domain import event as event
    from eventlane.domain import personal as personal
    from eventlane.domain import subject as subject
    from eventlane.errors import AggregateNotFoundError as AggregateNotFoundError
    from eventlane.errors import ConcurrencyError as ConcurrencyError
    from eventlane.errors import ConfigError as ConfigError
    from eventlane.errors import DomainError as DomainError
    from eventlane.errors import FrameworkError as FrameworkError
    from eventlane.errors import OutcomeUnknownError as OutcomeUnknownError
    from eventlane.log import LogStore as LogStore
    from eventlane.log import Producer as Producer
    from eventlane.log import ProducerRecord as ProducerRecord
    from eventlane.log import TopicConfig as TopicConfig
    from eventlane.log import TopicPartition as TopicPartition
    from eventlane.projection import EventContext as EventContext
    from eventlane.projection import Projector as Projector
    from eventlane.projection import Worker as Worker
    from eventlane.projection import handles as handles
    from eventlane.replay import verify_rebuild as verify_rebuild
    from eventlane.replay.forget import forget as forget
    from eventlane.replay.rebuild import rebuild as rebuild
    from eventlane.testing import Scenario as Scenario

    __version__: str  # the installed distribution's version (importlib.metadata)

_EXPORTS: dict[str, str] = {
    "Aggregate": "eventlane.domain",
    "AggregateNotFoundError": "eventlane.errors",
    "App": "eventlane.app",
    "ConcurrencyError": "eventlane.errors",
    "ConfigError": "eventlane.errors",
    "Consumer": "eventlane.consumer",
    "DomainError": "eventlane.errors",
    "DomainEvent": "eventlane.domain",
    "Envelope": "eventlane.codec",
    "EventContext": "eventlane.projection",
    "EventRegistry": "eventlane.codec",
    "FrameworkError": "eventlane.errors",
    "GroupConsumer": "eventlane.consumer",
    "LogStore": "eventlane.log",
    "OutcomeUnknownError": "eventlane.errors",
    "Producer": "eventlane.log",
    "ProducerRecord": "eventlane.log",
    "Projector": "eventlane.projection",
    "Runtime": "eventlane.app",
    "Scenario": "eventlane.testing",
    "TopicConfig": "eventlane.log",
    "TopicPartition": "eventlane.log",
    "Worker": "eventlane.projection",
    "applies": "eventlane.domain",
    "event": "eventlane.domain",
    "forget": "eventlane.replay",
    "handles": "eventlane.projection",
    "personal": "eventlane.domain",
    "rebuild": "eventlane.replay",
    "subject": "eventlane.domain",
    "verify_rebuild": "eventlane.replay",
}
"""Public name -> the module it is imported from on first use."""

__all__ = [
    "Aggregate",
    "AggregateNotFoundError",
    "App",
    "ConcurrencyError",
    "ConfigError",
    "Consumer",
    "DomainError",
    "DomainEvent",
    "Envelope",
    "EventContext",
    "EventRegistry",
    "FrameworkError",
    "GroupConsumer",
    "LogStore",
    "OutcomeUnknownError",
    "Producer",
    "ProducerRecord",
    "Projector",
    "Runtime",
    "Scenario",
    "TopicConfig",
    "TopicPartition",
    "Worker",
    "applies",
    "event",
    "forget",
    "handles",
    "personal",
    "rebuild",
    "subject",
    "verify_rebuild",
]


if not TYPE_CHECKING:  # hidden from type checkers: a typo stays an error for them

    def __getattr__(name: str) -> object:
        import importlib  # noqa: PLC0415 - only when a name is first used

        if name == "__version__":
            from importlib.metadata import version  # noqa: PLC0415

            value: object = version("eventlane")
        else:
            module = _EXPORTS.get(name)
            if module is None:
                raise AttributeError(f"module 'eventlane' has no attribute {name!r}")
            value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # the next lookup skips this function
        return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__")})
