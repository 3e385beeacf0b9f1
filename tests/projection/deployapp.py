"""A hotel app in two releases, for the rolling-deploy test (issue 32 item 3).

The release a process runs is read at import from the file named by ``$DEPLOYAPP_CODE_FILE``
(``1`` or ``2``; default 1), as if the code installed on the host had changed: a worker
started after the file says ``2`` imports release 2.

* Release 1: ``GuestRegistered`` v1 (``name``).
* Release 2: ``GuestRegistered`` v2 (``first_name``, ``last_name``) with an upcaster from v1.

Projector ``guests`` (read model ``guests(id PK, name, events)``, ``name`` the full name
either way); policy ``confirmations`` (``concurrency = 4``): per ``BookingPlaced`` it loads
the guest (whose stream may hold a v2 event) and issues ``Confirmation.confirm`` once,
with the guest's full name.

``python -m tests.projection.deployapp DATA guests FIRST COUNT`` registers guests
``g<FIRST>`` ... with this release's event, and places one booking for each;
``... DATA bookings FIRST COUNT`` places bookings for existing guests ``g<FIRST>`` ....
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import ClassVar

from attrs import frozen
from sqlite_utils import Database, Migrations

from eventlane.app import App
from eventlane.codec import EventRegistry
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.projection import EventContext, Projector, handles

_file = os.environ.get("DEPLOYAPP_CODE_FILE")
RELEASE = int(Path(_file).read_text().strip()) if _file and Path(_file).exists() else 1

registry = EventRegistry()

if RELEASE == 1:

    @event("GuestRegistered", version=1)
    @frozen
    class GuestRegistered(DomainEvent):
        name: str

    def full_name(e: GuestRegistered) -> str:
        return e.name

    def registered(first: str, last: str) -> GuestRegistered:
        return GuestRegistered(f"{first} {last}")

else:

    @event("GuestRegistered", version=2)
    @frozen
    class GuestRegistered(DomainEvent):  # type: ignore[no-redef]
        first_name: str
        last_name: str

    def full_name(e: GuestRegistered) -> str:
        return f"{e.first_name} {e.last_name}"  # type: ignore[attr-defined]

    def registered(first: str, last: str) -> GuestRegistered:
        return GuestRegistered(first, last)  # type: ignore[call-arg]

    @registry.upcaster("GuestRegistered", 1)
    def split_name(data: dict) -> dict:  # type: ignore[type-arg]
        first, _, last = data["name"].partition(" ")
        return {"first_name": first, "last_name": last}


@event("BookingPlaced")
@frozen
class BookingPlaced(DomainEvent):
    guest_id: str
    nights: int


@event("BookingConfirmed")
@frozen
class BookingConfirmed(DomainEvent):
    booking_id: str
    guest_name: str


class Guest(Aggregate):
    topic: ClassVar[str] = "guests"

    def init_state(self) -> None:
        self.name = ""

    def register(self, first: str, last: str) -> None:
        self.record_that(registered(first, last))

    @applies(GuestRegistered)
    def _registered(self, e: GuestRegistered) -> None:
        self.name = full_name(e)


class Booking(Aggregate):
    topic: ClassVar[str] = "bookings"

    def init_state(self) -> None:
        self.guest_id = ""

    def place(self, guest_id: str, nights: int) -> None:
        self.record_that(BookingPlaced(guest_id, nights))

    @applies(BookingPlaced)
    def _placed(self, e: BookingPlaced) -> None:
        self.guest_id = e.guest_id


class Confirmation(Aggregate):
    topic: ClassVar[str] = "confirmations"

    def init_state(self) -> None:
        self.done = False

    def confirm(self, booking_id: str, guest_name: str) -> None:
        if not self.done:
            self.record_that(BookingConfirmed(booking_id, guest_name))

    @applies(BookingConfirmed)
    def _confirmed(self, e: BookingConfirmed) -> None:
        self.done = True


guests_migrations = Migrations("deployapp.guests")


@guests_migrations()
def m001_guests(db: Database) -> None:
    db.execute("CREATE TABLE guests (id TEXT PRIMARY KEY, name TEXT NOT NULL, events INT)")


class Guests(Projector):
    name = "guests"
    topics = ("guests",)
    migrations = guests_migrations

    @handles(GuestRegistered)
    def registered(self, event: GuestRegistered, ctx: EventContext) -> None:
        ctx.conn.execute(
            "INSERT INTO guests VALUES (?, ?, 1) ON CONFLICT(id) DO UPDATE SET"
            " name = excluded.name, events = events + 1",
            (ctx.aggregate_id, full_name(event)),
        )


class Confirmations(Projector):
    name = "confirmations"
    topics = ("bookings",)
    concurrency = 4

    @handles(BookingPlaced)
    def placed(self, event: BookingPlaced, ctx: EventContext) -> None:
        guest = ctx.app.load(Guest, event.guest_id)
        booking_id = ctx.aggregate_id
        ctx.issue(
            Confirmation,
            f"conf-{booking_id}",
            lambda c: c.confirm(booking_id, guest.name),
        )


app = App(
    "hotel",
    aggregates=[Guest, Booking, Confirmation],
    projectors=[Guests, Confirmations],
    partitions={"guests": 4, "bookings": 4, "confirmations": 4},
    registry=registry,
)


def main(data: str, what: str, first: int, count: int) -> None:
    with app.open(Path(data)) as runtime:
        for i in range(first, first + count):
            if what == "guests":
                runtime.execute(
                    Guest, f"g{i}", lambda g, i=i: g.register(f"Ann{i}", f"Lee{i}"), create=True
                )
            runtime.execute(
                Booking, f"b{i}-{what}", lambda b, i=i: b.place(f"g{i}", 1 + i % 3), create=True
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
