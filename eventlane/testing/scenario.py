"""A testing kit for aggregates: given events → when a command → then events, or raises.

    >>> from attrs import frozen
    >>> from typing import ClassVar
    >>> from eventlane.domain import Aggregate, DomainEvent, applies, event
    >>> from eventlane.errors import DomainError
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

With a codec, ``given`` events first make a round trip through it (encode, decode, upcast)
and ``then`` checks the recorded events survive one too, so a scenario also proves the
events survive storage. ``raises`` also checks the failed command recorded nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from eventlane.codec import Envelope, EventCodec
from eventlane.domain import Aggregate, DomainEvent

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
        if self.codec is None:
            return event
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

    def _ran(self) -> A:
        if self._aggregate is None:
            raise AssertionError("call given(...).when(command) first")
        return self._aggregate

    def then(self, *expected: DomainEvent) -> A:
        """Assert the command recorded exactly ``expected`` (and, with a codec, that they
        survive a round trip through it); return the aggregate."""
        aggregate = self._ran()
        if self._error is not None:
            raise AssertionError(f"command raised {self._error!r}; expected events {expected}")
        recorded: Sequence[DomainEvent] = aggregate.pending_events
        if tuple(recorded) != expected:
            raise AssertionError(f"expected events {expected}, recorded {tuple(recorded)}")
        base = aggregate.committed_version
        for version, event in enumerate(recorded, start=base + 1):
            back = self._round_trip(event, version)
            if back != event:
                raise AssertionError(f"{event!r} comes back from the codec as {back!r}")
        return aggregate

    def raises(self, error: type[BaseException], match: str | None = None) -> BaseException:
        """Assert the command raised ``error`` (its message matching the regular expression
        ``match``, if given) and recorded nothing; return the error."""
        aggregate = self._ran()
        if not isinstance(self._error, error):
            raise AssertionError(f"expected {error.__name__}, got {self._error!r}")
        if match is not None and not re.search(match, str(self._error)):
            raise AssertionError(f"{self._error!r} does not match {match!r}")
        if aggregate.pending_events:
            raise AssertionError(
                f"the command raised {self._error!r} but recorded {aggregate.pending_events}"
            )
        return self._error
