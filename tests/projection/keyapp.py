"""The test application of per-key parallelism: ticks in, one fold per key out.

Importable by worker processes as ``tests.projection.keyapp:app``. Each source aggregate
``src-K`` records ``Ticked(n)`` for n = 1, 2, ...; the policy ``folder`` (``concurrency``
from ``$KEYAPP_CONCURRENCY``, default 8; threads or adaptive from ``$KEYAPP_MODE``) issues, per tick, ``Fold.add(n)`` on the aggregate
``fold-K`` through ``ctx.issue``. ``Fold.add`` refuses any n but its count + 1, so a tick
handled out of key order raises (and would be dead-lettered), and ``ctx.issue`` records the
tick's event id as causation id, so a tick applied twice would show as a second event.
The fold of a key is therefore exactly ``[1..N]`` iff every tick was applied exactly once,
in key order.
"""

from __future__ import annotations

import os

from attrs import frozen

from eventlane.app import App
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.projection import EventContext, Projector, handles


@event("Ticked")
@frozen
class Ticked(DomainEvent):
    n: int


@event("Folded")
@frozen
class Folded(DomainEvent):
    n: int


class Source(Aggregate, topic="ticks"):
    @applies
    def _ticked(self, e: Ticked) -> None:
        pass


class Fold(Aggregate, topic="folds"):
    count: int = 0

    def add(self, n: int) -> None:
        if n != self.count + 1:
            raise ValueError(f"{self.id}: tick {n} after {self.count} (out of key order)")
        self.record_that(Folded(n))

    @applies
    def _folded(self, e: Folded) -> None:
        self.count = e.n


class Folder(Projector):
    name = "folder"
    topics = (Source,)
    concurrency = int(os.environ.get("KEYAPP_CONCURRENCY", "8"))
    # "threads": always the threads; "adaptive": where a probe says (here: the polling
    # thread, the handler computes); the crash test runs both
    adaptive = os.environ.get("KEYAPP_MODE", "threads") == "adaptive"

    @handles
    def ticked(self, event: Ticked, ctx: EventContext) -> None:
        key = ctx.aggregate_id.removeprefix("src-")
        ctx.issue(Fold, f"fold-{key}", lambda fold: fold.add(event.n))


app = App("keyapp", aggregates=[Source, Fold], projectors=[Folder], partitions=2)
