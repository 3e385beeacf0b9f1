"""A testing kit for aggregates: given events → when a command → then events, or raises.

    >>> from attrs import frozen
    >>> from typing import ClassVar
    >>> from framework.domain import Aggregate, DomainEvent, applies, event
    >>> from framework.errors import DomainError
    >>> @event("Deposited")
    ... @frozen
    ... class Deposited(DomainEvent):
    ...     amount: int
    >>> @event("Withdrawn")
    ... @frozen
    ... class Withdrawn(DomainEvent):
    ...     amount: int
    >>> class InsufficientFunds(DomainError): ...
    >>> class Account(Aggregate):
    ...     topic: ClassVar[str] = "accounts"
    ...     balance: int
    ...     def init_state(self) -> None:
    ...         self.balance = 0
    ...     def withdraw(self, amount: int) -> None:
    ...         if amount > self.balance:
    ...             raise InsufficientFunds(f"balance {self.balance} < {amount}")
    ...         self.record_that(Withdrawn(amount))
    ...     @applies(Deposited)
    ...     def _deposited(self, e: Deposited) -> None:
    ...         self.balance += e.amount
    ...     @applies(Withdrawn)
    ...     def _withdrawn(self, e: Withdrawn) -> None:
    ...         self.balance -= e.amount
    >>> scenario = Scenario(Account, "acc-1")
    >>> _ = scenario.given(Deposited(10)).when(lambda a: a.withdraw(4)).then(Withdrawn(4))
    >>> _ = scenario.given(Deposited(1)).when(lambda a: a.withdraw(4)).raises(InsufficientFunds)

With a codec, ``given`` events first make a round trip through it (encode, decode, upcast),
so a scenario also proves the events survive storage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from framework.codec import Envelope, EventCodec
from framework.domain import Aggregate, DomainEvent

A = TypeVar("A", bound=Aggregate)


class Scenario(Generic[A]):
    """Given-when-then for one aggregate class. Each ``given`` starts a fresh scenario."""

    def __init__(
        self, cls: type[A], aggregate_id: str = "test-1", codec: EventCodec | None = None
    ) -> None:
        self.cls = cls
        self.aggregate_id = aggregate_id
        self.codec = codec
        self._history: list[DomainEvent] = []
        self._aggregate: A | None = None
        self._error: BaseException | None = None

    def given(self, *events: DomainEvent) -> Scenario[A]:
        """The aggregate's stored history (may be empty)."""
        history = list(events)
        if self.codec is not None:
            history = [self._round_trip(e, v) for v, e in enumerate(history, start=1)]
        self._history = history
        self._aggregate = None
        self._error = None
        return self

    def _round_trip(self, event: DomainEvent, version: int) -> DomainEvent:
        assert self.codec is not None
        key, value, headers = self.codec.encode(Envelope(event, self.aggregate_id, version))
        return self.codec.decode(key, value, headers).event

    def when(self, command: Callable[[A], Any]) -> Scenario[A]:
        """Run ``command`` on the aggregate rebuilt from the history."""
        aggregate = self.cls.rehydrate(self.aggregate_id, self._history)
        try:
            command(aggregate)
        except Exception as exc:
            self._error = exc
        self._aggregate = aggregate
        return self

    def then(self, *expected: DomainEvent) -> A:
        """Assert the command recorded exactly ``expected``; return the aggregate."""
        if self._error is not None:
            raise AssertionError(f"command raised {self._error!r}; expected events {expected}")
        assert self._aggregate is not None, "call when() first"
        recorded: Sequence[DomainEvent] = self._aggregate.pending_events
        if tuple(recorded) != expected:
            raise AssertionError(f"expected events {expected}, recorded {tuple(recorded)}")
        return self._aggregate

    def raises(self, error: type[BaseException]) -> BaseException:
        """Assert the command raised ``error`` and recorded nothing; return the error."""
        if not isinstance(self._error, error):
            raise AssertionError(f"expected {error.__name__}, got {self._error!r}")
        return self._error
