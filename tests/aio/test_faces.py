"""The sync and the async runtime pass the same behaviour tests (one parametrised suite).

``face`` is either the sync :class:`Runtime` called directly (concurrency by threads) or the
:class:`AsyncRuntime` driven on an event loop in a thread of its own (concurrency by tasks
on that loop), each on the embedded log and on a real 3-node JetStream cluster (the async
face awaits JetStream's asyncio face on its loop; the embedded log's file work runs in its
pool). Each test is written once against the :class:`Face` protocol; a real log on
disk, real appends and fsyncs. The model is a plain counter per aggregate: N increments
from concurrent callers leave version N and value N, never a lost update.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from store_domain import AGGREGATES, Account, Counter, InsufficientFunds

from eventlane import App
from eventlane.app import Runtime
from eventlane.errors import AggregateNotFoundError, ConcurrencyError
from eventlane.log.position import Position

APP = App("faces", aggregates=AGGREGATES, partitions=2)

# ``face`` asks for the module's cluster by name (getfixturevalue), which the suite's
# grouping cannot see: one worker runs the module, so one cluster is started, not two.
pytestmark = pytest.mark.xdist_group("tests/aio/test_faces.py")


class Face:
    """One API, sync or async underneath: every method returns the plain result."""

    def __init__(self, kind: str, data: Path | Any) -> None:
        self.kind = kind
        self._sync: Runtime | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if kind.startswith("sync"):
            self._sync = APP.open(data)
            self.log = self._sync.log
        else:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True).start()
            self._async = APP.open_async(data)
            self._run(self._async.open())
            self.log = self._async.log

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=120)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._sync is not None:
            return getattr(self._sync, method)(*args, **kwargs)
        return self._run(getattr(self._async, method)(*args, **kwargs))

    def concurrently(
        self, method: str, calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[Any]:
        """The calls at once: threads (sync) or tasks on the loop (async); results or the
        exceptions raised, in order."""
        if self._sync is not None:
            sync = self._sync

            def one(call: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
                try:
                    return getattr(sync, method)(*call[0], **call[1])
                except Exception as exc:
                    return exc

            with ThreadPoolExecutor(8) as pool:
                return list(pool.map(one, calls))

        async def all_of() -> list[Any]:
            coros = [getattr(self._async, method)(*a, **k) for a, k in calls]
            return list(await asyncio.gather(*coros, return_exceptions=True))

        return list(self._run(all_of()))

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        else:
            self._run(self._async.close())
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A 3-node JetStream cluster for the faces on JetStream (loopback, stopped by PID)."""
    pytest.importorskip("nats", reason="the nats extra is not installed")
    from eventlane.log.jetstream.cluster import LocalCluster  # noqa: PLC0415

    cluster = LocalCluster.create(tmp_path_factory.mktemp("nats"), nodes=3)
    cluster.start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(params=["sync", "async", "sync-jetstream", "async-jetstream"])
def face(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Face]:
    if request.param.endswith("jetstream"):
        from eventlane.log.jetstream.log import JetStreamLog  # noqa: PLC0415

        url = request.getfixturevalue("nats_url")
        log = JetStreamLog.from_url(url, namespace="t" + uuid.uuid4().hex[:12])
        f = Face(request.param, log)
        yield f
        f.close()
        log.close()
        return
    f = Face(request.param, tmp_path / "data")
    yield f
    f.close()


def inc(by: int = 1) -> Callable[[Counter], None]:
    return lambda c: c.increment(by)


def test_execute_load_and_the_position_of_a_write(face: Face) -> None:
    counter = face.call("execute", Counter, "c-1", inc(3), create=True)
    assert (counter.version, counter.value) == (1, 3)
    position = counter.stored_position
    assert isinstance(position, Position) and Position.parse(position.token) == position
    again = face.call("execute", Counter, "c-1", inc(4))
    assert again.stored_position[next(iter(position))] == position[next(iter(position))] + 1
    loaded = face.call("load", Counter, "c-1")
    assert (loaded.version, loaded.value) == (2, 7)
    assert face.call("load", Counter, "c-1", 1).value == 3
    with pytest.raises(AggregateNotFoundError):
        face.call("load", Counter, "nobody")
    with pytest.raises(AggregateNotFoundError):
        face.call("execute", Counter, "nobody", inc())


def test_save_is_conditional_and_returns_its_records(face: Face) -> None:
    account = Account("a-1")
    account.open("ada")
    account.deposit(10)
    written = face.call("save", account)
    assert [m.offset for m in written] == [written[0].offset, written[0].offset + 1]
    assert written.position == Position.of(written)
    stale = face.call("load", Account, "a-1")
    fresh = face.call("load", Account, "a-1")
    fresh.deposit(1)
    face.call("save", fresh)
    stale.deposit(2)
    with pytest.raises(ConcurrencyError):
        face.call("save", stale)
    assert face.call("load", Account, "a-1").balance == 11
    with pytest.raises(InsufficientFunds):
        face.call("execute", Account, "a-1", lambda a: a.withdraw(100))
    assert face.call("load", Account, "a-1").version == 3


def test_concurrent_commands_on_one_aggregate_lose_no_update(face: Face) -> None:
    """24 commands race on one aggregate. Both faces retry a lost race on the one command
    plan, with the same jittered back-off (``conflict_pause``). A command loses a race only
    to another one's write, and 23 others write once each, so 24 attempts suffice but for an
    unknown outcome or a slow loser's stale reload; the default 20 ran out twice on a
    loaded 2-core machine (ConcurrencyError, no update lost): ``attempts=48``."""
    face.call("execute", Counter, "hot", inc(0), create=True)
    results = face.concurrently(
        "execute", [((Counter, "hot", inc(1)), {"attempts": 48}) for _ in range(24)]
    )
    assert not [r for r in results if isinstance(r, Exception)]
    counter = face.call("load", Counter, "hot")
    assert (counter.version, counter.value) == (25, 24)
    versions = sorted(r.version for r in results)
    assert versions == list(range(2, 26))  # each command saw its own write


def test_issue_happens_once_per_cause(face: Face) -> None:
    first = face.call("issue", Counter, "inv-1", inc(5), caused_by="event-1")
    again = face.call("issue", Counter, "inv-1", inc(5), caused_by="event-1")
    other = face.call("issue", Counter, "inv-1", inc(1), caused_by="event-2")
    assert len(first) == 1 and len(again) == 0 and len(other) == 1
    assert face.call("load", Counter, "inv-1").value == 6
    # racing deliveries of one event: one is stored
    results = face.concurrently(
        "issue", [((Counter, "inv-2", inc(1)), {"caused_by": "event-3"}) for _ in range(6)]
    )
    assert sum(len(r) for r in results) == 1
    assert face.call("load", Counter, "inv-2").value == 1


def test_load_as_of_a_moment(face: Face) -> None:
    face.call("execute", Counter, "t-1", inc(1), create=True)
    records = [r for p in range(2) for r in _raw(face, p)]
    moment = max(r.timestamp for r in records)
    later = datetime.fromtimestamp((moment + 5) / 1000, UTC)
    time.sleep(0.02)
    face.call("execute", Counter, "t-1", inc(1))
    assert face.call("load", Counter, "t-1", as_of=later).version in (1, 2)
    assert face.call("load", Counter, "t-1", as_of=moment).version == 1
    with pytest.raises(AggregateNotFoundError):
        face.call("load", Counter, "t-1", as_of=moment - 60_000)


def _raw(face: Face, partition: int) -> list[Any]:
    records, _ = face.log.read("counters", partition, face.log.offsets("counters", partition).lwm)
    return records


def test_async_awaits_on_one_partition_share_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit from the loop: 64 concurrent saves of new aggregates in one partition
    take fewer fsyncs than saves (the face writes a partition's waiting appends together)."""
    syncs = [0]
    real = os.fdatasync

    def counted(fd: int) -> None:
        syncs[0] += 1
        real(fd)

    async def main() -> int:
        async with App("gc", aggregates=[Counter], partitions=1).open_async(tmp_path) as rt:
            await rt.execute(Counter, "warm", inc(), create=True)
            monkeypatch.setattr(os, "fdatasync", counted)
            await asyncio.gather(
                *(rt.execute(Counter, f"c-{i}", inc(), create=True) for i in range(64))
            )
            monkeypatch.undo()
            return sum(1 for p in [0] for _ in range(rt.log.offsets("counters", p).hwm))

    stored = asyncio.run(main())
    assert stored == 65
    assert syncs[0] < 64, f"{syncs[0]} fsyncs for 64 concurrent saves: no group commit"


def test_async_consumers_free_and_group(tmp_path: Path) -> None:
    """``async for`` over a free consumer (assigned partitions) and a group member: every
    record of the topic, each once, in offset order per partition."""

    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        async with App("cons", aggregates=[Counter], partitions=2).open_async(tmp_path) as rt:
            await asyncio.gather(
                *(rt.execute(Counter, f"c-{i}", inc(), create=True) for i in range(30))
            )
            free: list[Any] = []
            async with rt.consumer(auto_offset_reset="earliest") as consumer:
                await consumer.call("assign", [("counters", 0), ("counters", 1)])
                async for record in consumer:
                    free.append(record)
                    if len(free) == 30:
                        break
            grouped: list[Any] = []
            async with rt.group_consumer(
                "g1", ["counters"], auto_offset_reset="earliest", enable_auto_commit=False
            ) as member:
                async for record in member:
                    grouped.append(record)
                    if len(grouped) == 30:
                        break
                await member.call("commit")
            expected = [r for p in range(2) for r in _raw_of(rt.log, p)]
            return free, grouped, expected

    free, grouped, expected = asyncio.run(main())
    key = lambda r: (r.partition, r.offset)  # noqa: E731
    assert sorted(map(key, free)) == sorted(map(key, expected)) == sorted(map(key, grouped))
    for got in (free, grouped):
        for p in range(2):
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == sorted(offsets)


def _raw_of(log: Any, partition: int) -> list[Any]:
    records, _ = log.read("counters", partition, log.offsets("counters", partition).lwm)
    return records


def test_async_runtime_on_jetstream_awaits_the_asyncio_face(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On JetStream, ``app.open_async`` performs the command path's log calls (appends,
    per-key reads, key heads: conflicts and policy checks included) on the log's asyncio
    face on the caller's loop: the sync log under the runtime (whose calls cross its bridge
    from a thread) serves none of them, nor a load's check for a snapshot topic (an
    aggregate with ``snapshot_every``). The outcomes are the sync face's."""
    from store_domain import SnapCounter  # noqa: PLC0415

    from eventlane.log.jetstream.log import JetStreamLog  # noqa: PLC0415

    log = JetStreamLog.from_url(nats_url, namespace="t" + uuid.uuid4().hex[:12])
    sync_calls: list[str] = []
    for name in ("append", "read", "read_key", "key_head", "topic_exists"):
        real = getattr(log, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            sync_calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(log, name, counted)

    async def main() -> tuple[Counter, Account, list[Any], Counter]:
        async with APP.open_async(log) as rt:
            await rt.execute(SnapCounter, "snap", inc(1), create=True)
            for _ in range(3):  # below snapshot_every: no snapshot written
                await rt.execute(SnapCounter, "snap", inc(1))
            snap = await rt.load(SnapCounter, "snap")
            await rt.execute(Counter, "hot", inc(0), create=True)
            await asyncio.gather(*(rt.execute(Counter, "hot", inc(1)) for _ in range(12)))
            issued = await asyncio.gather(
                *(rt.issue(Counter, "inv", inc(1), caused_by="event-1") for _ in range(4))
            )
            account = Account("a-1")
            account.open("ada")
            await rt.save(account)
            stale = await rt.load(Account, "a-1")
            account.deposit(1)
            await rt.save(account)
            stale.deposit(2)
            with pytest.raises(ConcurrencyError):
                await rt.save(stale)
            hot = await rt.load(Counter, "hot")
            return hot, await rt.load(Account, "a-1"), issued, snap

    try:
        before = len(sync_calls)
        hot, account, issued, snap = asyncio.run(main())
    finally:
        log.close()
    assert (hot.version, hot.value) == (13, 12)
    assert (snap.version, snap.value) == (4, 4)
    assert account.balance == 1 and account.version == 2
    assert sorted(len(w) for w in issued) == [0, 0, 0, 1]
    assert sync_calls[before:] == [], f"the sync log served {sync_calls[before:]}"


def test_async_runtime_on_jetstream_never_blocks_its_loop_on_the_sync_log(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commands on aggregates with personal fields (the invoicing sample's orders: a key
    per customer in the log's key topic) on JetStream's asyncio face: no call of the sync
    log, whose every call waits for a round trip through its bridge, is made on the event
    loop's thread (it stalls every task of the loop), but for the key store's catch-up when
    the runtime's key tail is behind (a saturated machine: see eventlane/app/aio_keys.py).
    Before, a new customer's key was looked up and written there. The orders are stored,
    and load decrypted."""
    from eventlane.log.jetstream.log import JetStreamLog  # noqa: PLC0415
    from example_apps.invoicing import app as invoicing  # noqa: PLC0415
    from example_apps.invoicing.domain import Order  # noqa: PLC0415
    from example_apps.invoicing.events import Address, OrderLine  # noqa: PLC0415

    log = JetStreamLog.from_url(nats_url, namespace="t" + uuid.uuid4().hex[:12])
    on_loop: list[str] = []
    loop_thread: list[int] = []
    for name in dir(JetStreamLog):
        real = getattr(log, name)
        if name.startswith("_") or not inspect.ismethod(real):
            continue

        def watched(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            catch_up = _name in ("offsets", "read") and str(args[0]).endswith(".keys")
            if threading.get_ident() in loop_thread and not catch_up:
                on_loop.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(log, name, watched)
    line, home = OrderLine("sku-1", 1, 100), Address("1 Main St", "Oslo", "NO")

    def place(customer: str) -> Callable[[Order], None]:
        return lambda order: order.place(customer, [line], home)

    async def main() -> list[Order]:
        async with invoicing.open_async(log) as rt:
            loop_thread.append(threading.get_ident())
            for round_ in range(3):  # a new customer's key, then the key store's catch-ups
                await asyncio.gather(
                    *(
                        rt.execute(Order, f"o-{round_}-{i}", place(f"c-{i % 3}"), create=True)
                        for i in range(6)
                    )
                )
                await asyncio.sleep(0.1)  # past the key store's refresh interval
            await rt.execute(Order, "o-0-0", lambda order: order.confirm())
            loaded = [await rt.load(Order, f"o-{r}-{i}") for r in range(3) for i in range(6)]
            loop_thread.clear()  # (the runtime closes in its pool)
            return loaded

    try:
        orders = asyncio.run(main())
    finally:
        log.close()
    assert [(o.customer_id, o.version) for o in orders] == [
        (f"c-{i % 3}", 2 if (r, i) == (0, 0) else 1) for r in range(3) for i in range(6)
    ]
    assert on_loop == [], f"the sync log was called on the event loop's thread: {on_loop}"


def test_async_runtime_on_jetstream_answers_cached_metadata_without_awaiting(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command's steps that the JetStream face answers from memory (a topic's cached
    partition count, asked twice a command, and a load's cached check for a snapshot
    topic) are taken by the async runtime's driver without awaiting the face's coroutine
    (issue 30: three of a command's five log steps, each a chain of coroutine frames on
    the loop). The answers are the face's own: commands on new and existing aggregates of
    both partitions and a snapshotting aggregate give the sync face's outcomes."""
    from store_domain import SnapCounter  # noqa: PLC0415

    from eventlane.log.jetstream.aio import AsyncJetStreamLog  # noqa: PLC0415
    from eventlane.log.jetstream.log import JetStreamLog  # noqa: PLC0415
    from eventlane.log.partitioner import partition_for_key  # noqa: PLC0415

    awaited: list[str] = []
    for name in ("partition_count", "topic_exists"):
        real = getattr(AsyncJetStreamLog, name)

        async def counted(self: Any, *args: Any, _name: str = name, _real: Any = real) -> Any:
            awaited.append(_name)
            return await _real(self, *args)

        monkeypatch.setattr(AsyncJetStreamLog, name, counted)
    log = JetStreamLog.from_url(nats_url, namespace="t" + uuid.uuid4().hex[:12])

    async def main() -> tuple[list[Counter], Counter, int]:
        async with APP.open_async(log) as rt:
            await rt.execute(Counter, "warm", inc(1), create=True)  # (fills the caches)
            await rt.execute(SnapCounter, "snap", inc(1), create=True)
            before = len(awaited)
            await asyncio.gather(
                *(rt.execute(Counter, f"c-{i}", inc(i), create=True) for i in range(8))
            )
            for i in range(8):
                await rt.execute(Counter, f"c-{i}", inc(1))
            await rt.execute(SnapCounter, "snap", inc(2))
            counters = [await rt.load(Counter, f"c-{i}") for i in range(8)]
            return counters, await rt.load(SnapCounter, "snap"), before

    try:
        counters, snap, before = asyncio.run(main())
    finally:
        log.close()
    assert [(c.version, c.value) for c in counters] == [(2, i + 1) for i in range(8)]
    assert (snap.version, snap.value) == (2, 3)
    assert {partition_for_key(c.id.encode(), 2) for c in counters} == {0, 1}
    assert awaited[before:] == [], f"awaited on the face: {awaited[before:]}"


def test_async_policy_on_jetstream_issues_on_the_asyncio_face(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On JetStream, an async policy's ``ctx.issue_async`` awaits the command path's log
    calls (the causation check's per-key read, the conditional append) on the log's
    asyncio face on the worker's loop: the worker's sync log, whose calls cross its bridge
    from a thread, serves none of them. Exactly one echo per event, caused by it."""
    from aio_app import app  # noqa: PLC0415
    from test_async_policy import header, raw  # noqa: PLC0415

    from eventlane.codec import HEADER_CAUSATION_ID, HEADER_EVENT_ID  # noqa: PLC0415
    from eventlane.engine import open_log  # noqa: PLC0415
    from eventlane.projection import Worker, open_readmodel  # noqa: PLC0415

    log = open_log(f"{nats_url}?namespace=t{uuid.uuid4().hex[:12]}", data_dir=tmp_path)
    sync_calls: list[str] = []
    for name in ("append", "read_key", "key_head"):
        real = getattr(log, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            sync_calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(log, name, counted)
    orders = 40
    try:
        with app.open(log) as rt:
            open_readmodel(rt, "echo", migrate=True).close()
            for i in range(orders):
                rt.execute(Counter, f"c-{i % (orders // 2)}", lambda c: c.increment(1), create=True)
            events = raw(rt.log, rt.names.aggregate_topic(Counter))
            before = len(sync_calls)
            worker = Worker(rt, "echo", session_timeout_ms=3000, poll_timeout=0.1)
            deadline = time.monotonic() + 60
            try:
                while len(raw(rt.log, "snapcounters")) < orders and time.monotonic() < deadline:
                    worker.run_once()
                served = sync_calls[before:]
            finally:
                worker.close()
            echoes = raw(rt.log, "snapcounters")
    finally:
        log.close()
    assert served == [], f"the sync log served {served}"
    by_stream: dict[bytes, int] = {}
    for r in echoes:
        by_stream[r.key] = by_stream.get(r.key, 0) + 1  # type: ignore[attr-defined]
    assert len(by_stream) == orders and set(by_stream.values()) == {1}
    assert {header(r, HEADER_CAUSATION_ID) for r in echoes} == {
        header(e, HEADER_EVENT_ID) for e in events
    }
