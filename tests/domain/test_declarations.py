"""Declaring less: ``@applies``/``@handles`` without an argument take the event class from the
annotation; an aggregate names its topic once (a class keyword); a projector may name
aggregate classes as its topics; ``setup`` is the first migration of a projector without any.
The explicit forms keep working (the other tests use them)."""

from __future__ import annotations

from typing import ClassVar

import pytest
from attrs import frozen
from domain_samples import CartCheckedOut, CartOpened
from sqlite_utils import Database, Migrations

from eventlane import Aggregate, DomainEvent, EventContext, Projector, applies, event, handles
from eventlane.errors import ConfigError


@event("Barked")
@frozen
class Barked(DomainEvent):
    volume: int


class Dog(Aggregate, topic="dogs"):
    barks: int = 0

    def bark(self, volume: int) -> None:
        self.record_that(Barked(volume))

    @applies
    def _barked(self, e: Barked) -> None:
        self.barks += e.volume


def test_bare_applies_dispatches_on_the_annotation_and_topic_is_a_class_keyword() -> None:
    dog = Dog("rex")
    dog.bark(2)
    dog.bark(3)
    assert (dog.barks, dog.version, Dog.topic) == (5, 2, "dogs")
    assert tuple(Dog._appliers) == (Barked,)
    assert Dog.rehydrate("rex", dog.pending_events).barks == 5


def test_topic_keyword_and_classvar_agree_and_bad_topics_are_refused() -> None:
    class Cat(Aggregate):
        topic: ClassVar[str] = "cats"

    assert Cat.topic == "cats"
    with pytest.raises(ConfigError, match="topic must be a non-empty string"):

        class Nameless(Aggregate, topic=""):
            pass


def test_bare_decorators_refuse_what_they_cannot_resolve() -> None:
    with pytest.raises(ConfigError, match=r"annotate 'e' with the event class, or name it"):

        class NoHint(Aggregate, topic="x"):
            @applies
            def _a(self, e) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(ConfigError, match="not a DomainEvent subclass"):

        class WrongHint(Aggregate, topic="x"):
            @applies
            def _a(self, e: int) -> None: ...  # type: ignore[type-var]

    @event("Local")
    @frozen
    class Local(DomainEvent):
        pass

    # A class only visible in this function: a string annotation cannot be resolved.
    with pytest.raises(ConfigError, match=r"cannot resolve the annotation 'Local'.*@applies\("):

        class Scoped(Aggregate, topic="x"):
            @applies
            def _a(self, e: Local) -> None: ...

    class Explicit(Aggregate, topic="x"):  # the explicit form works for it
        @applies(Local)
        def _a(self, e: Local) -> None: ...

    assert Local in Explicit._appliers


def test_bare_and_explicit_forms_collide_like_two_explicit_ones() -> None:
    with pytest.raises(ConfigError, match=r"both _a\(\) and _b\(\) apply CartOpened"):

        class Twice(Aggregate, topic="t"):
            @applies
            def _a(self, e: CartOpened) -> None: ...

            @applies(CartOpened)
            def _b(self, e: CartOpened) -> None: ...

    with pytest.raises(ConfigError, match=r"both a\(\) and b\(\) handle CartOpened"):

        class TwiceP(Projector):
            name = "p"
            topics = ("t",)

            @handles
            def a(self, e: CartOpened, ctx: EventContext) -> None: ...

            @handles(CartOpened)
            def b(self, e: CartOpened, ctx: EventContext) -> None: ...


def test_projector_topics_may_name_aggregates_and_handlers_be_bare() -> None:
    class Barks(Projector):
        name = "barks"
        topics = (Dog, "cats")

        @handles
        def barked(self, e: Barked, ctx: EventContext) -> None: ...

        @handles(CartCheckedOut)
        def checked_out(self, e: CartCheckedOut, ctx: EventContext) -> None: ...

    assert Barks.topic_names == ("dogs", "cats")
    assert set(Barks.handled_types()) == {Barked, CartCheckedOut}
    with pytest.raises(ConfigError, match="neither a topic name nor an aggregate"):

        class Bad(Projector):
            name = "bad"
            topics = (int,)  # type: ignore[assignment]

    with pytest.raises(ConfigError, match="must be a tuple"):

        class Str(Projector):
            name = "str"
            topics = "dogs"


def test_setup_is_the_first_migration_and_not_a_second_way() -> None:
    class Counts(Projector):
        name = "counts"
        topics = (Dog,)

        def setup(self, db: Database) -> None:
            db.execute("CREATE TABLE counts (n INT)")

    migrations = Counts.migrations
    assert migrations is not None and migrations.name == "counts.setup"
    db = Database(memory=True)
    assert [m.name for m in migrations.pending(db)] == ["m001_setup"]
    migrations.apply(db)
    assert db["counts"].exists() and not migrations.pending(db)

    schema = Migrations("both")
    with pytest.raises(ConfigError, match="in its migrations or in setup"):

        class Both(Projector):
            name = "both"
            topics = (Dog,)
            migrations = schema

            def setup(self, db: Database) -> None: ...
