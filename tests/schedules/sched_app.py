"""A small app with deadlines: an alarm rings when its schedule fires (not idempotent on its
own: firing twice would ring twice, so exactly once in effect is the scheduler's doing)."""

from __future__ import annotations

from typing import ClassVar

from attrs import frozen

from eventlane import Aggregate, App, DomainEvent, EventContext, Projector, applies, event, handles
from eventlane.domain import Command, command


@event("AlarmSet")
@frozen
class AlarmSet(DomainEvent):
    at_ms: int


@event("AlarmCleared")
@frozen
class AlarmCleared(DomainEvent):
    pass


@event("Rang")
@frozen
class Rang(DomainEvent):
    key: str


class Alarm(Aggregate, topic="alarms"):
    rings: int = 0

    @applies
    def _set(self, e: AlarmSet) -> None:
        pass

    @applies
    def _cleared(self, e: AlarmCleared) -> None:
        pass

    @applies
    def _rang(self, e: Rang) -> None:
        self.rings += 1


@command("Ring")
@frozen
class Ring(Command[Alarm]):
    alarm_id: str
    key: str
    aggregate: ClassVar[type[Aggregate]] = Alarm
    create: ClassVar[bool] = True

    def target(self) -> str:
        return self.alarm_id

    def __call__(self, alarm: Alarm) -> None:
        alarm.record_that(Rang(self.key))


class AlarmPolicy(Projector):
    """Sets a deadline per alarm; clearing the alarm cancels it."""

    name = "alarm_policy"
    topics = (Alarm,)

    @handles
    def set(self, e: AlarmSet, ctx: EventContext) -> None:
        ctx.schedule(
            Ring(f"ring-{ctx.aggregate_id}", ctx.aggregate_id),
            at=e.at_ms,
            key=f"alarm-{ctx.aggregate_id}",
        )

    @handles
    def cleared(self, e: AlarmCleared, ctx: EventContext) -> None:
        ctx.cancel_schedule(f"alarm-{ctx.aggregate_id}")


app = App("alarms", aggregates=[Alarm], projectors=[AlarmPolicy], commands=[Ring], partitions=3)
