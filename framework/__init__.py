"""eventlane: event sourcing and CQRS on a partitioned, compacted, append-only log.

Everything an application needs is importable from here (``docs/api.md`` lists it)::

    from framework import Aggregate, App, DomainEvent, EventContext, Projector, event

The names are imported lazily, on first use (PEP 562), so ``import framework`` is cheap and
has no side effects: it configures no logging (eventlane's loggers are standard-library
loggers under ``eventlane.``, governed by the application's configuration; the ``eventlane``
command and its worker processes configure their own output, see
:mod:`framework.observability`).
Machinery stays in the subpackages (``framework.log``, ``framework.consumer``,
``framework.projection``, ``framework.replay`` …).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from framework.app import App as App
    from framework.app import Runtime as Runtime
    from framework.codec import Envelope as Envelope
    from framework.codec import EventRegistry as EventRegistry
    from framework.consumer import Consumer as Consumer
    from framework.consumer import GroupConsumer as GroupConsumer
    from framework.domain import Aggregate as Aggregate
    from framework.domain import DomainEvent as DomainEvent
    from framework.domain import applies as applies
    from framework.domain import event as event
    from framework.domain import personal as personal
    from framework.domain import subject as subject
    from framework.errors import AggregateNotFoundError as AggregateNotFoundError
    from framework.errors import ConcurrencyError as ConcurrencyError
    from framework.errors import ConfigError as ConfigError
    from framework.errors import DomainError as DomainError
    from framework.errors import FrameworkError as FrameworkError
    from framework.errors import OutcomeUnknownError as OutcomeUnknownError
    from framework.log import LogStore as LogStore
    from framework.log import Producer as Producer
    from framework.log import ProducerRecord as ProducerRecord
    from framework.log import TopicConfig as TopicConfig
    from framework.log import TopicPartition as TopicPartition
    from framework.projection import EventContext as EventContext
    from framework.projection import Projector as Projector
    from framework.projection import Worker as Worker
    from framework.projection import handles as handles
    from framework.replay import verify_rebuild as verify_rebuild
    from framework.replay.forget import forget as forget
    from framework.replay.rebuild import rebuild as rebuild
    from framework.testing import Scenario as Scenario

_EXPORTS: dict[str, str] = {
    "Aggregate": "framework.domain",
    "AggregateNotFoundError": "framework.errors",
    "App": "framework.app",
    "ConcurrencyError": "framework.errors",
    "ConfigError": "framework.errors",
    "Consumer": "framework.consumer",
    "DomainError": "framework.errors",
    "DomainEvent": "framework.domain",
    "Envelope": "framework.codec",
    "EventContext": "framework.projection",
    "EventRegistry": "framework.codec",
    "FrameworkError": "framework.errors",
    "GroupConsumer": "framework.consumer",
    "LogStore": "framework.log",
    "OutcomeUnknownError": "framework.errors",
    "Producer": "framework.log",
    "ProducerRecord": "framework.log",
    "Projector": "framework.projection",
    "Runtime": "framework.app",
    "Scenario": "framework.testing",
    "TopicConfig": "framework.log",
    "TopicPartition": "framework.log",
    "Worker": "framework.projection",
    "applies": "framework.domain",
    "event": "framework.domain",
    "forget": "framework.replay",
    "handles": "framework.projection",
    "personal": "framework.domain",
    "rebuild": "framework.replay",
    "subject": "framework.domain",
    "verify_rebuild": "framework.replay",
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
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'framework' has no attribute {name!r}")
        import importlib  # noqa: PLC0415 - only when a name is first used

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # the next lookup skips this function
        return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__")})
