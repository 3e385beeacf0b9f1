"""eventlane.testing.Scenario: given events → when a command → then events / raises,
with and without the codec round trip; and each assertion can fail."""

from __future__ import annotations

from typing import ClassVar

import pytest
from attrs import frozen
from store_domain import (
    Account,
    AccountClosed,
    Deposited,
    InsufficientFunds,
    Opened,
    Withdrawn,
)

from eventlane.codec import EventCodec, EventRegistry
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.testing import Scenario


@pytest.fixture
def codec() -> EventCodec:
    registry = EventRegistry()
    registry.register_aggregate(Account, Tagger)
    return EventCodec(registry)


@event("Tagged")
@frozen
class Tagged(DomainEvent):
    tags: tuple[str, ...]


class Tagger(Aggregate):
    topic: ClassVar[str] = "taggers"
    tags: tuple[str, ...]

    def init_state(self) -> None:
        self.tags = ()

    def tag(self, *tags: str) -> None:
        self.record_that(Tagged(tags))

    def tag_sloppily(self, *tags: str) -> None:
        self.record_that(Tagged(list(tags)))  # type: ignore[arg-type]  # the bug to catch

    @applies(Tagged)
    def _tagged(self, e: Tagged) -> None:
        self.tags = self.tags + tuple(e.tags)


@pytest.mark.parametrize("with_codec", [False, True])
def test_given_when_then(codec: EventCodec, with_codec: bool) -> None:
    scenario = Scenario(Account, "acc-1", codec=codec if with_codec else None)
    account = (
        scenario.given(Opened("ada"), Deposited(10))
        .when(lambda a: a.withdraw(4))
        .then(Withdrawn(4))
    )
    assert (account.balance, account.version, account.committed_version) == (6, 3, 2)
    scenario.given().when(lambda a: a.open("ada")).then(Opened("ada"))
    scenario.given(Opened("ada")).when(lambda a: None).then()


def test_raises(codec: EventCodec) -> None:
    scenario = Scenario(Account, codec=codec)
    error = (
        scenario.given(Opened("ada"), Deposited(1))
        .when(lambda a: a.withdraw(4))
        .raises(InsufficientFunds, match=r"balance 1 < 4")
    )
    assert isinstance(error, InsufficientFunds)
    scenario.given().when(lambda a: a.deposit(1)).raises(AccountClosed)


def test_each_assertion_can_fail(codec: EventCodec) -> None:
    scenario = Scenario(Account, codec=codec)
    with pytest.raises(AssertionError, match="expected events"):
        scenario.given(Opened("ada")).when(lambda a: a.deposit(5)).then(Deposited(6))
    with pytest.raises(AssertionError, match="command raised"):
        scenario.given().when(lambda a: a.deposit(5)).then(Deposited(5))
    with pytest.raises(AssertionError, match="expected InsufficientFunds, got None"):
        scenario.given(Opened("ada")).when(lambda a: a.deposit(5)).raises(InsufficientFunds)
    with pytest.raises(AssertionError, match="expected InsufficientFunds, got AccountClosed"):
        scenario.given().when(lambda a: a.deposit(1)).raises(InsufficientFunds)
    with pytest.raises(AssertionError, match="does not match"):
        scenario.given().when(lambda a: a.withdraw(1)).raises(InsufficientFunds, match="nope")

    def deposit_then_fail(account: Account) -> None:
        account.deposit(5)
        raise AccountClosed("changed its mind")

    with pytest.raises(AssertionError, match="but recorded"):
        scenario.given(Opened("ada")).when(deposit_then_fail).raises(AccountClosed)
    with pytest.raises(AssertionError, match="when"):
        Scenario(Account).then()


def test_the_codec_round_trip_catches_events_that_do_not_survive_storage(
    codec: EventCodec,
) -> None:
    Scenario(Tagger, codec=codec).given().when(lambda t: t.tag("a", "b")).then(Tagged(("a", "b")))
    sloppy = Scenario(Tagger).given().when(lambda t: t.tag_sloppily("a"))
    sloppy.then(Tagged(["a"]))  # type: ignore[arg-type]  # without a codec: unnoticed
    stored = Scenario(Tagger, codec=codec).given().when(lambda t: t.tag_sloppily("a"))
    with pytest.raises(AssertionError, match="comes back from the codec as"):
        stored.then(Tagged(["a"]))  # type: ignore[arg-type]


def test_given_events_round_trip_through_the_codec(codec: EventCodec) -> None:
    scenario = Scenario(Tagger, "t-1", codec=codec)
    tagger = scenario.given(Tagged(["x"])).when(lambda t: t.tag("y")).then(Tagged(("y",)))  # type: ignore[arg-type]
    assert tagger.tags == ("x", "y")  # the list came back from storage as a tuple
