"""A small app with personal data for the erasure tests (importable by worker processes as
``tests.replay.erasure_app:app``, with the repository root on ``PYTHONPATH``).

* ``Member`` (topic ``members``, snapshots every 2 events, sealed under the member's key):
  ``MemberJoined`` (name and e-mail personal), ``PlanChanged`` (nothing personal),
  ``Vouched`` (another subject's note: the voucher's data in the member's stream);
* ``Mailbox`` (topic ``mail``): ``WelcomeSent``, the welcome policy's side effect;
* projectors: ``directory`` (a table of members: names, e-mails, plans, notes; a member
  joining with plan ``poison`` makes it raise with the name and e-mail in the message: a
  dead letter), ``welcome`` (a policy: one ``WelcomeSent`` per member, via ``ctx.issue``),
  ``strict`` (like ``directory``'s failure, with a breaker that trips at 2 of 4).
"""

from __future__ import annotations

from typing import ClassVar

from attrs import frozen

from eventlane import App, EventContext, Projector, handles
from eventlane.codec.keystore import LogKeyStore
from eventlane.domain import Aggregate, DomainEvent, applies, event, personal, subject
from eventlane.projection._sqlite_utils import Database


@event("MemberJoined")
@frozen
class MemberJoined(DomainEvent):
    name: str = personal()
    email: str = personal()
    plan: str = "basic"


@event("PlanChanged")
@frozen
class PlanChanged(DomainEvent):
    plan: str


@event("Vouched")
@frozen
class Vouched(DomainEvent):
    voucher_id: str = subject()
    note: str = personal(erased="")


@event("WelcomeSent")
@frozen
class WelcomeSent(DomainEvent):
    member_id: str


class Member(Aggregate):
    topic: ClassVar[str] = "members"
    snapshot_every: ClassVar[int | None] = 2
    snapshot_subject: ClassVar[str | None] = "id"
    name: str
    email: str
    plan: str
    notes: tuple[str, ...]

    def init_state(self) -> None:
        self.name = ""
        self.email = ""
        self.plan = ""
        self.notes = ()

    def join(self, name: str, email: str, plan: str) -> None:
        self.record_that(MemberJoined(name, email, plan))

    def change_plan(self, plan: str) -> None:
        self.record_that(PlanChanged(plan))

    def vouch(self, voucher_id: str, note: str) -> None:
        self.record_that(Vouched(voucher_id, note))

    @applies
    def _joined(self, e: MemberJoined) -> None:
        self.name, self.email, self.plan = e.name, e.email, e.plan

    @applies
    def _plan(self, e: PlanChanged) -> None:
        self.plan = e.plan

    @applies
    def _vouched(self, e: Vouched) -> None:
        self.notes = (*self.notes, e.note)


class Mailbox(Aggregate):
    topic: ClassVar[str] = "mail"
    sent: bool

    def init_state(self) -> None:
        self.sent = False

    def send(self, member_id: str) -> None:
        if not self.sent:
            self.record_that(WelcomeSent(member_id))

    @applies
    def _sent(self, e: WelcomeSent) -> None:
        self.sent = True


def refuse(e: MemberJoined) -> None:
    if e.plan == "poison":
        raise ValueError(f"cannot file {e.name} <{e.email}>")


class Directory(Projector):
    name = "directory"
    topics = (Member,)
    poison_breaker = None

    def setup(self, db: Database) -> None:
        db.execute(
            "CREATE TABLE members (id TEXT PRIMARY KEY, name TEXT, email TEXT, plan TEXT,"
            " notes TEXT)"
        )

    @handles
    def joined(self, e: MemberJoined, ctx: EventContext) -> None:
        refuse(e)
        ctx.conn.execute(
            "INSERT INTO members VALUES (?, ?, ?, ?, '')",
            (ctx.aggregate_id, e.name, e.email, e.plan),
        )

    @handles
    def plan(self, e: PlanChanged, ctx: EventContext) -> None:
        ctx.conn.execute("UPDATE members SET plan=? WHERE id=?", (e.plan, ctx.aggregate_id))

    @handles
    def vouched(self, e: Vouched, ctx: EventContext) -> None:
        ctx.conn.execute(
            "UPDATE members SET notes = notes || ? || ';' WHERE id=?", (e.note, ctx.aggregate_id)
        )


class Welcome(Projector):
    """The policy: one welcome per member (its side effect)."""

    name = "welcome"
    topics = (Member,)

    @handles
    def joined(self, e: MemberJoined, ctx: EventContext) -> None:
        member = ctx.aggregate_id
        ctx.issue(Mailbox, f"mail-{member}", lambda box: box.send(member))


class Strict(Projector):
    name = "strict"
    topics = (Member,)
    poison_breaker = (2, 4)
    handler_attempts = 1

    def setup(self, db: Database) -> None:
        db.execute("CREATE TABLE names (id TEXT PRIMARY KEY, name TEXT)")

    @handles
    def joined(self, e: MemberJoined, ctx: EventContext) -> None:
        refuse(e)
        ctx.conn.execute("INSERT INTO names VALUES (?, ?)", (ctx.aggregate_id, e.name))


app = App(
    "club",
    aggregates=[Member, Mailbox],
    projectors=[Directory, Welcome, Strict],
    partitions=1,
    # a 10 ms key refresh (50 by default): forget waits two refreshes for other processes,
    # and the model test runs hundreds of forgets
    keys=lambda log: LogKeyStore(log, "club.keys", refresh_ms=10),
)
