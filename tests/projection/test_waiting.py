"""Waiting for newer code (issue 32 item 3), in-process: one worker of release 1 of
``deployapp`` meets ``GuestRegistered`` v2 (appended here with a release-2 codec). The
projector and the policy (per-key parallel, loading the guest) stop at that record for that
partition only, report the wait in the status document, and dead-letter nothing;
``wait_for_newer=False`` (``--dead-letter-unknown``) dead-letters it as before; an
unknown type is still dead-lettered."""

from __future__ import annotations

import asyncio
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen

from eventlane.app import App, Runtime
from eventlane.app.metrics import StateCollector
from eventlane.codec import Envelope, EventCodec, EventRegistry
from eventlane.domain import DomainEvent, event
from eventlane.log import LogStore, TopicPartition
from eventlane.log.partitioner import partition_for_key
from eventlane.projection import (
    EventContext,
    Projector,
    Worker,
    handles,
    open_readmodel,
    readmodel_path,
)
from eventlane.projection.applier import BatchApplier
from tests.projection import deployapp

assert deployapp.RELEASE == 1


@event("GuestRegistered", version=2)
@frozen
class GuestRegisteredV2(DomainEvent):
    first_name: str
    last_name: str


@event("GuestMoved")
@frozen
class GuestMoved(DomainEvent):  # a type no release of the code knows
    city: str


_registry = EventRegistry()
_registry.register(GuestRegisteredV2, GuestMoved)
NEWER = EventCodec(_registry)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    with deployapp.app.open(tmp_path / "data") as rt:
        for name in ("guests", "confirmations"):
            open_readmodel(rt, name, migrate=True).close()
        yield rt


def append(rt: Runtime, topic: str, aggregate_id: str, version: int, ev: Any) -> int:
    key, value, headers = NEWER.encode(Envelope(ev, aggregate_id, version))
    p = partition_for_key(key, rt.log.partition_count(topic))
    rt.log.append(topic, p, [(key, value, tuple(headers), None)])
    return p


def console_page(rt: Runtime, path: str) -> str:
    """The console's page at ``path``, rendered in-process (no server, no lifespan)."""
    with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what is installed
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient  # noqa: PLC0415

    from eventlane.console import ConsoleData  # noqa: PLC0415
    from eventlane.console.web import create_app  # noqa: PLC0415

    log = LogStore(rt.log.path)
    data = ConsoleData(log, "tests.projection.deployapp:app")
    try:
        response = TestClient(create_app(data, datasette=False), base_url="http://localhost").get(
            path
        )
        assert response.status_code == 200, response.text
        return response.text
    finally:
        data.close()
        log.close()


def drain(worker: Worker, rounds: int = 30) -> None:
    for _ in range(rounds):
        worker.run_once()


def dead(rt: Runtime, name: str) -> int:
    with sqlite3.connect(readmodel_path(rt.log.path, name)) as db:
        return int(db.execute("SELECT count(*) FROM _eventlane_dead_letters").fetchone()[0])


@pytest.mark.parametrize("name", ["guests", "confirmations"])
def test_a_worker_waits_at_an_event_newer_than_its_code(runtime: Runtime, name: str) -> None:
    for i in range(8):
        runtime.execute(
            deployapp.Guest, f"g{i}", lambda g, i=i: g.register("A", f"B{i}"), create=True
        )
    stuck = append(runtime, "guests", "g100", 1, GuestRegisteredV2("Ann", "Lee"))
    runtime.execute(deployapp.Booking, "b100", lambda b: b.place("g100", 2), create=True)
    for i in range(8):  # after the newer event: other partitions keep flowing
        runtime.execute(
            deployapp.Guest, f"h{i}", lambda g, i=i: g.register("C", f"D{i}"), create=True
        )
        runtime.execute(deployapp.Booking, f"b{i}", lambda b, i=i: b.place(f"g{i}", 1), create=True)
    worker = Worker(runtime, name, poll_timeout=0.05)
    try:
        drain(worker)
        assert dead(runtime, name) == 0
        doc = runtime.status(name)
        (wait,) = doc["waiting"]
        assert wait["message"].startswith("waiting for code that knows GuestRegistered v2")
        assert (wait["event_type"], wait["version"], wait["known_version"]) == (
            "GuestRegistered",
            2,
            1,
        )
        tp = TopicPartition(wait["topic"], wait["partition"])
        if name == "guests":
            assert tp.partition == stuck
        assert worker.consumer.paused() == {tp}
        scraped = {
            (
                sample.labels["projector"],
                sample.labels["event_type"],
                sample.labels["version"],
            ): sample.value
            for family in StateCollector(runtime).collect()
            if family.name == "eventlane_projection_waiting_partitions"
            for sample in family.samples
        }
        assert scraped == {(name, "GuestRegistered", "2"): 1.0}
        page = console_page(runtime, f"/projectors/{name}")
        assert "waiting for code that knows GuestRegistered v2" in page
        for row in doc["partitions"]:
            if (row["topic"], row["partition"]) == (tp.topic, tp.partition):
                assert row["position"] == wait["offset"] and row["lag"] > 0
            else:
                assert row["lag"] == 0, row
        assert dead(runtime, name) == 0
    finally:
        worker.close()
    # --dead-letter-unknown: today's behaviour, the newer event becomes a dead letter.
    old = Worker(runtime, name, poll_timeout=0.05, wait_for_newer=False)
    try:
        drain(old)
    finally:
        old.close()
    assert dead(runtime, name) == 1
    doc = runtime.status(name)
    assert doc["waiting"] == [] and doc["lag"] == 0


def test_an_unknown_type_is_still_dead_lettered(runtime: Runtime) -> None:
    append(runtime, "guests", "g1", 1, GuestMoved("Oslo"))
    worker = Worker(runtime, "guests", poll_timeout=0.05)
    try:
        drain(worker, 10)
    finally:
        worker.close()
    assert dead(runtime, "guests") == 1
    assert runtime.status("guests")["waiting"] == []


def test_a_rebuild_applier_dead_letters_a_newer_event_never_skips_it(runtime: Runtime) -> None:
    """Only a worker waits (it re-seeks and pauses); an applier reading on, as a rebuild
    does, dead-letters the newer event rather than passing it silently."""
    runtime.execute(deployapp.Guest, "g1", lambda g: g.register("A", "B"), create=True)
    p = append(runtime, "guests", "g100", 1, GuestRegisteredV2("Ann", "Lee"))
    for i in range(20):
        runtime.execute(deployapp.Guest, f"h{i}", lambda g: g.register("C", "D"), create=True)
    records, _ = runtime.log.read("guests", p, 0)
    newer = next(r.offset for r in records if r.key == b"g100")
    assert records[-1].offset > newer  # (fixed ids: always true)
    readmodel = open_readmodel(runtime, "guests")
    try:
        applier = BatchApplier(
            runtime.app.projector("guests")(), runtime.codec, readmodel, replaying=True
        )
        applier.apply(records)
        assert applier.waiting == {}
        assert readmodel.positions()[TopicPartition("guests", p)] == records[-1].offset + 1
    finally:
        readmodel.close()
    assert dead(runtime, "guests") == 1


class AsyncConfirmations(Projector):
    """``confirmations`` with ``async def`` handlers (tasks on the worker's loop, not
    threads): it also reads the guests topic, so it meets the newer event itself (decoding)
    as well as through a load (a booking of that guest)."""

    name = "async_confirmations"
    topics = ("guests", "bookings")
    concurrency = 4

    @handles(deployapp.GuestRegistered)
    async def registered(self, event: Any, ctx: EventContext) -> None:
        await asyncio.sleep(0)

    @handles(deployapp.BookingPlaced)
    async def placed(self, event: deployapp.BookingPlaced, ctx: EventContext) -> None:
        guest = await asyncio.to_thread(ctx.app.load, deployapp.Guest, event.guest_id)
        booking_id = ctx.aggregate_id
        await ctx.issue_async(
            deployapp.Confirmation,
            f"conf-{booking_id}",
            lambda c: c.confirm(booking_id, guest.name),
        )


async_app = App(
    "hotel",
    aggregates=[deployapp.Guest, deployapp.Booking, deployapp.Confirmation],
    projectors=[AsyncConfirmations],
    partitions={"guests": 4, "bookings": 4, "confirmations": 4},
    registry=deployapp.registry,
)


def test_an_async_policy_waits_at_an_event_newer_than_its_code(tmp_path: Path) -> None:
    """The async applier honours the wait as the threaded one does: the newer event (met by
    decoding it, and by loading its guest for a booking) is not dead-lettered; both
    partitions wait, the others flow, and the status names the wait."""
    name = "async_confirmations"
    with async_app.open(tmp_path / "data") as rt:
        open_readmodel(rt, name, migrate=True).close()
        for i in range(8):
            rt.execute(
                deployapp.Guest, f"g{i}", lambda g, i=i: g.register("A", f"B{i}"), create=True
            )
        stuck_guests = append(rt, "guests", "g100", 1, GuestRegisteredV2("Ann", "Lee"))
        rt.execute(deployapp.Booking, "b100", lambda b: b.place("g100", 2), create=True)
        stuck_bookings = partition_for_key(b"b100", rt.log.partition_count("bookings"))
        for i in range(8):
            rt.execute(deployapp.Booking, f"b{i}", lambda b, i=i: b.place(f"g{i}", 1), create=True)
        worker = Worker(rt, name, poll_timeout=0.05)
        try:
            drain(worker)
            assert dead(rt, name) == 0
            waits = {(w["topic"], w["partition"]): w for w in rt.status(name)["waiting"]}
            assert set(waits) == {("guests", stuck_guests), ("bookings", stuck_bookings)}
            for wait in waits.values():
                assert wait["message"].startswith("waiting for code that knows GuestRegistered v2")
            assert worker.consumer.paused() == {TopicPartition(*tp) for tp in waits}
            for i in range(8):  # every other booking was confirmed, once
                assert len(rt.store.read("confirmations", f"conf-b{i}")) == 1
            assert rt.store.read("confirmations", "conf-b100") == []
        finally:
            worker.close()
