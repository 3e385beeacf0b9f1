"""The workload the power-loss explorer records: real eventlane operations on one data dir.

Run as ``python -m tests.powerloss.workload DATA ACKS SIZE SEED`` (under ``strace``, see
:mod:`tests.powerloss.trace`). It writes its **acknowledgement log** to ``ACKS`` (a file
outside ``DATA``), one JSON object per line, each with one ``write(2)``, so the trace orders
every acknowledgement exactly among the file-system operations. Kinds (``k``):

* ``try``   ``{t, v}``: a record with the unique value ``v`` is about to be appended to ``t``.
* ``rec``   ``{t, p, o, v, key}``: the append returned: acknowledged (fsync returned).
* ``compact`` / ``retain`` ``{t, phase: begin|end, lwm?}``: a maintenance pass ran.
* ``aggtry`` ``{id, version, amount}``: a save of one deposit is about to be made.
* ``agg``   ``{id, version, t, p, o, amount}``: an event-store save returned.
* ``rm``    ``{name, t, p, pos}``: the read model committed position ``pos`` (the projector's
  transaction returned).
* ``commit`` ``{group, t, p, o}``: a consumer-group offset commit returned.
* ``state`` ``{path, hex}``: the current bytes of a memory-mapped ``state`` file (relative
  path): a power loss may leave any copy written before it on disk.

The steps cover: producer group commit (concurrent ``send``), ``send_batch``, appends of
threads queueing for one partition's lock (in flight until one fsync after the lock covers
them), segment rolls,
compaction of a keyed topic, retention, event-store saves (key-index updates, SQLite), saves
of concurrent asyncio tasks (the asyncio face's grouped appends, one fsync a group), saves
of threads through a relay process (its groups, written and fsynced by that process), a
projector worker's read-model commits (SQLite WAL) and its consumer group's offset commits.
``SIZE`` scales the number of records.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import orjson
from attrs import frozen
from sqlite_utils import Database

from eventlane.app import App
from eventlane.domain import Aggregate, DomainEvent, applies, event
from eventlane.errors import AggregateNotFoundError
from eventlane.log import LogStore, Producer, ProducerRecord
from eventlane.projection import EventContext, Projector, Worker, handles

EVENTS = "events"
LATEST = "latest"
ACCOUNTS = "accounts"
BALANCES = "balances"


@event("Deposited")
@frozen
class Deposited(DomainEvent):
    amount: int


class Account(Aggregate):
    topic: ClassVar[str] = ACCOUNTS
    balance: int

    def init_state(self) -> None:
        self.balance = 0

    def deposit(self, amount: int) -> None:
        self.record_that(Deposited(amount))

    @applies(Deposited)
    def _deposited(self, e: Deposited) -> None:
        self.balance += e.amount


class Balances(Projector):
    name = BALANCES
    topics = (ACCOUNTS,)

    def setup(self, db: Database) -> None:
        db.execute(
            "CREATE TABLE IF NOT EXISTS balances (id TEXT PRIMARY KEY, total INT, events INT)"
        )

    @handles(Deposited)
    def deposited(self, event: Deposited, ctx: EventContext) -> None:
        ctx.conn.execute(
            "INSERT INTO balances VALUES (?, ?, 1) ON CONFLICT(id) DO UPDATE"
            " SET total = total + excluded.total, events = events + 1",
            (ctx.aggregate_id, event.amount),
        )


app = App("powerloss", aggregates=[Account], projectors=[Balances], partitions={ACCOUNTS: 2})


class Acks:
    """The acknowledgement log: one ``write(2)`` per JSON line, opened ``O_APPEND``."""

    def __init__(self, path: Path, data: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.data = data
        self._states: dict[str, bytes] = {}

    def __call__(self, kind: str, **fields: Any) -> None:
        os.write(self.fd, orjson.dumps({"k": kind, **fields}) + b"\n")

    def saved(self, account: Account, md: Any, amount: int) -> None:
        """An event-store save of one deposit returned."""
        self(
            "agg",
            id=account.id,
            version=account.version,
            t=ACCOUNTS,
            p=md.partition,
            o=md.offset,
            amount=amount,
        )

    def states(self) -> None:
        """Record every ``state`` file whose bytes changed since the last call."""
        for path in sorted(self.data.glob("topics/*/*/state")):
            rel = str(path.relative_to(self.data))
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            if self._states.get(rel) != raw:
                self._states[rel] = raw
                self("state", path=rel, hex=raw.hex())


def run(data: Path, acks_path: Path, size: int, seed: int) -> None:
    rng = random.Random(seed)
    ack = Acks(acks_path, data)
    log = LogStore(data)
    log.create_topic(EVENTS, 2, {"segment_bytes": 200, "retention_bytes": 100})
    log.create_topic(
        LATEST, 1, {"segment_bytes": 250, "cleanup_policy": "compact", "min_compaction_lag_ms": 0}
    )
    ack.states()
    producer = Producer(log, linger_ms=2.0)
    counter = 0

    def value() -> bytes:
        nonlocal counter
        counter += 1
        return b"v-%06d-" % counter + b"x" * rng.randrange(10, 120)

    for round_ in range(size):
        # group commit: concurrent sends share one fsync
        values = [value() for _ in range(rng.randrange(2, 6))]
        for v in values:
            ack("try", t=EVENTS, v=v.decode())
        futures = [producer.send(EVENTS, v, partition=i % 2) for i, v in enumerate(values)]
        for v, fut in zip(values, futures, strict=True):
            md = fut.result(timeout=60)
            ack("rec", t=EVENTS, p=md.partition, o=md.offset, v=v.decode(), key=None)
        # a keyed topic that is compacted
        batch = []
        for _ in range(rng.randrange(2, 5)):
            key = b"k%d" % rng.randrange(4)
            v = value()
            ack("try", t=LATEST, v=v.decode())
            batch.append(ProducerRecord(key, v))
        for rec, md in zip(batch, producer.send_batch(LATEST, batch, partition=0), strict=True):
            assert rec.key is not None and rec.value is not None
            ack("rec", t=LATEST, p=0, o=md.offset, v=rec.value.decode(), key=rec.key.decode())
        ack.states()
        if round_ % 3 == 2 or round_ == size - 1:  # every run compacts and retains
            ack("compact", t=LATEST, phase="begin")
            log.compact(LATEST)
            ack("compact", t=LATEST, phase="end")
            ack("retain", t=EVENTS, phase="begin")
            reports = log.cleanup(EVENTS)
            for p, report in enumerate(reports):
                ack("retain", t=EVENTS, phase="end", p=p, lwm=log.offsets(EVENTS, p).lwm)
                del report
            ack.states()
    producer.close()

    # contended appends: while appenders queue for a partition's lock, each writes its batch,
    # lets go of the lock and fsyncs after it under sync.lock, one fdatasync for every batch
    # written so far (records in flight between the HWM and the LEO until then)
    part = log.partition(EVENTS, 1)
    shares = [[value() for _ in range(size)] for _ in range(3)]

    def appender(share: list[bytes]) -> None:
        for v in share:
            part.state.mark_contended()
            ack("try", t=EVENTS, v=v.decode())
            result = log.append(EVENTS, 1, [(None, v, (), None)])
            ack("rec", t=EVENTS, p=1, o=result.base_offset, v=v.decode(), key=None)

    threads = [threading.Thread(target=appender, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ack.states()

    # event-store saves of concurrent asyncio tasks: the embedded log's asyncio face writes a
    # partition's waiting conditional appends as one group under one fsync, in a thread
    asyncio.run(_async_saves(log, ack, size, rng))
    ack.states()

    # event-store saves through the relay (eventlane/log/embedded/relay.py): another process
    # writes this one's conditional appends, several threads' together under one fsync
    _relayed_saves(data, log, ack, size, rng)
    ack.states()

    runtime = app.open(log)
    worker = Worker(
        runtime,
        BALANCES,
        session_timeout_ms=30_000,
        poll_timeout=0.05,
        group_commit_interval_s=3600,
    )
    committed: dict[Any, int] = {}
    try:
        for round_ in range(size):
            for _ in range(2):
                ident = f"acc-{rng.randrange(3)}"
                try:
                    account = runtime.load(Account, ident)
                except AggregateNotFoundError:
                    account = Account(ident)
                amount = rng.randrange(1, 100)
                account.deposit(amount)
                ack("aggtry", id=ident, version=account.version, amount=amount)
                [md] = runtime.save(account)
                ack.saved(account, md, amount)
            ack.states()
            for _ in range(5):
                worker.apply(worker.poll())
                positions = worker.readmodel.positions()
                if positions == committed:
                    continue
                for tp, pos in sorted(positions.items()):
                    ack("rm", name=BALANCES, t=tp.topic, p=tp.partition, pos=pos)
                worker.consumer.commit(positions)
                for tp, pos in sorted(positions.items()):
                    ack("commit", group=BALANCES, t=tp.topic, p=tp.partition, o=pos)
                committed = positions
                if (
                    all(
                        pos == log.offsets(tp.topic, tp.partition).hwm
                        for tp, pos in positions.items()
                    )
                    and len(positions) == 2
                ):
                    break
            ack.states()
    finally:
        worker.close()
        runtime.close()
        log.close()


def _relayed_saves(data: Path, log: LogStore, ack: Acks, size: int, rng: random.Random) -> None:
    """Saves of three threads (each its own connection) through a relay process started
    here (traced too: ``strace -f``), which is then stopped; the saves after it are direct."""
    relay = subprocess.Popen(
        [sys.executable, "-m", "eventlane.log.embedded.relay_server", str(data)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (data / "relay.sock").exists():
        if relay.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the relay did not start")
        time.sleep(0.01)
    runtime = app.open(log)
    amounts = [[rng.randrange(1, 100) for _ in range(size * 2)] for _ in range(3)]

    def saves(task: int) -> None:
        ident = f"acc-relayed-{task}"
        for amount in amounts[task]:
            try:
                account = runtime.load(Account, ident)
            except AggregateNotFoundError:
                account = Account(ident)
            account.deposit(amount)
            ack("aggtry", id=ident, version=account.version, amount=amount)
            [md] = runtime.save(account)
            ack.saved(account, md, amount)

    threads = [threading.Thread(target=saves, args=(task,)) for task in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    relayed = log.relay.relayed if log.relay is not None else 0
    relay.terminate()
    relay.wait(60)
    if relayed < size:
        raise RuntimeError(f"the relay wrote {relayed} of {size * 6} saves")


async def _async_saves(log: LogStore, ack: Acks, size: int, rng: random.Random) -> None:
    async with app.open_async(log) as runtime:

        async def saves(task: int) -> None:
            ident = f"acc-async-{task}"
            account = Account(ident)  # loaded once: the tasks' saves meet in the lanes
            for _ in range(size):
                amount = rng.randrange(1, 100)
                account.deposit(amount)
                ack("aggtry", id=ident, version=account.version, amount=amount)
                [md] = await runtime.save(account)
                ack.saved(account, md, amount)

        await asyncio.gather(*(saves(task) for task in range(4)))


def main(argv: list[str]) -> int:
    data, acks, size, seed = Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3])
    run(data, acks, size, seed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
