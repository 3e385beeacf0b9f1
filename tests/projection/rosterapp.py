"""The app of the forget tests on both read-model engines (``test_readmodel_forget.py``),
importable by worker processes as ``tests.projection.rosterapp:app``.

``Member`` (topic ``members``; personal name and e-mail: ``tests.replay.erasure_app``) and
two projectors written with the portable table API, so they run unchanged on SQLite and
PostgreSQL (the engine comes from ``$EVENTLANE_READMODELS``):

* ``roster`` copies each member's name and e-mail into a table (personal: ``forget``
  rebuilds it). A member joining with plan ``poison`` makes it raise with the name and
  e-mail in the message (a dead letter; the framework redacts its error text);
* ``plans`` keeps each member's latest plan (``PlanChanged``: nothing personal, so
  ``forget`` does not rebuild it); the app's ``on_forget`` hook :func:`drop_plans` deletes
  the subject's row, on either engine.
"""

from __future__ import annotations

from typing import Any

from eventlane import App, EventContext, Projector, Runtime, handles
from eventlane.codec.keystore import LogKeyStore
from eventlane.projection import open_store
from tests.replay.erasure_app import Member, MemberJoined, PlanChanged


class Roster(Projector):
    name = "roster"
    topics = ("members",)
    poison_breaker = None

    def setup(self, db: Any) -> None:
        db.execute("CREATE TABLE roster (id TEXT PRIMARY KEY, name TEXT, email TEXT)")

    @handles(MemberJoined)
    def joined(self, event: MemberJoined, ctx: EventContext) -> None:
        if event.plan == "poison":
            raise ValueError(f"cannot file {event.name} <{event.email}>")
        ctx.table("roster").insert(
            {"id": ctx.aggregate_id, "name": event.name, "email": event.email}
        )


class Plans(Projector):
    name = "plans"
    topics = ("members",)

    def setup(self, db: Any) -> None:
        db.execute("CREATE TABLE plans (id TEXT PRIMARY KEY, plan TEXT)")

    @handles(PlanChanged)
    def changed(self, event: PlanChanged, ctx: EventContext) -> None:
        ctx.table("plans").upsert({"id": ctx.aggregate_id, "plan": event.plan}, key=["id"])


def drop_plans(runtime: Runtime, subject: str) -> None:
    """``on_forget``: the subject's row leaves the ``plans`` read model (if it ever ran)."""
    readmodel = open_store(runtime, "plans")
    try:
        if readmodel.is_fresh():
            return
        with readmodel.transaction() as conn:
            conn.execute("DELETE FROM plans WHERE id = ?", (subject,))
    finally:
        readmodel.close()


app = App(
    "club",
    aggregates=[Member],
    projectors=[Roster, Plans],
    partitions=2,
    keys=lambda log: LogKeyStore(log, "club.keys", refresh_ms=10),
    on_forget=[drop_plans],
)
