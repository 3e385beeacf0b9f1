"""Consumer-group member processes for the multi-process tests, and readers of their logs.

Run a member as a script (the tests start it with ``subprocess``)::

    python tests/consumer/group_members.py '<json arguments>'

The member joins ``group`` on ``topic`` with a :class:`GroupConsumer` and loops::

    records = poll()
    commit == "before":  commit(next offsets)  -> {"ev": "commit", ...}
                         {"ev": "processing"}; sleep(delay); {"ev": "records", ...}
    commit == "after":   {"ev": "records", ...}; {"ev": "processing"}; sleep(delay)
                         commit(next offsets)  -> {"ev": "commit", ...}

so a ``kill -9`` while it sleeps ("processing") lands after the commit in at-most-once mode
(the batch is skipped) and before it in at-least-once mode (the batch is redelivered).
SIGTERM makes it ``close()`` the consumer (a graceful leave) and exit. With ``projector``
(a SQLite file), "after" mode also applies each batch to a read model whose positions are in
the same transaction (:class:`Projector`), seeks to those positions when assigned, and logs
``{"ev": "applied", "recs", ...}`` before it commits; with ``catch_up`` it also commits the
read model's positions when assigned and, when idle, those of partitions whose last commit
was refused (a rebalance), as a projector worker does: otherwise a batch applied under a
refused commit would never be committed to the group.

Every event is one JSON line written with a single ``write`` (so a ``kill -9`` never leaves a
half line) to the member's event file. Times are ``time.monotonic()``: CLOCK_MONOTONIC is one
clock for all processes of a Linux machine, so the test process can compare them with its
own. Events::

    {"ev": "start", "pid", "t"}
    {"ev": "assigned" | "revoked" | "lost", "tps": [partition], "t", "gen", "member"}
    {"ev": "records", "recs": [[partition, offset]], "t", "gen", "member"}
    {"ev": "processing", "t"}
    {"ev": "commit", "ok": bool, "t0", "t", "gen", "member", "offsets": {partition: offset},
     "error": message or null}
    {"ev": "closed", "t"}
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventlane.consumer.group import GroupConsumer
from eventlane.consumer.offsets import OffsetStore
from eventlane.errors import CommitFailedError, ConsumerError
from eventlane.log import LogStore, ProducerRecord, TopicPartition
from eventlane.observability import configure_logging

MEMBERS = Path(__file__).resolve()
ROOT = MEMBERS.parents[2]


# ---------------------------------------------------------------------------- child side
def _open(args: dict[str, Any]) -> tuple[Any, Any]:
    """The member's log and group coordination: the embedded log in ``data``, or a cluster
    (``log_url``, ``namespace``): JetStream (tests/jetstream) or Kafka (tests/kafka_engine,
    whose members are Kafka's own: ``GroupConsumer`` on a Kafka log)."""
    if "log_url" not in args:
        return LogStore(args["data"]), None
    if args["log_url"].startswith("kafka://"):
        from eventlane.log.kafka.log import KafkaLog  # noqa: PLC0415

        return KafkaLog.from_url(f"{args['log_url']}?namespace={args['namespace']}"), None
    from eventlane.consumer.jetstream import JetStreamCoordination  # noqa: PLC0415
    from eventlane.log.jetstream.log import JetStreamLog  # noqa: PLC0415

    log = JetStreamLog.from_url(args["log_url"], namespace=args["namespace"])
    return log, JetStreamCoordination(log)


def _run_member(args: dict[str, Any]) -> None:
    configure_logging(level="info")  # on stderr, kept in <name>.stderr for failures
    fd = os.open(args["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(**event: Any) -> None:
        event.setdefault("t", time.monotonic())
        os.write(fd, (json.dumps(event) + "\n").encode())

    stopping = False

    def on_term(_signo: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    store, coordination = _open(args)
    consumer: GroupConsumer

    project = projector(args["projector"]) if "projector" in args else None

    def listener(kind: str) -> Any:
        def callback(tps: list[TopicPartition]) -> None:
            if project is not None and kind == "assigned":
                for tp in tps:  # the read model's position, not the group's commit
                    consumer.seek(tp, project.position(tp.partition))
                if args.get("catch_up"):  # the group's offset catches up with it
                    consumer.commit({tp: project.position(tp.partition) for tp in tps})
            emit(
                ev=kind,
                tps=[tp.partition for tp in tps],
                gen=consumer.generation,
                member=consumer.member_id,
            )

        return callback

    consumer = GroupConsumer(
        store,
        coordination=coordination,
        group_id=args["group"],
        topics=[args["topic"]],
        group_instance_id=args.get("instance_id"),
        client_id=args.get("client_id", "eventlane"),
        session_timeout_ms=args.get("session_timeout_ms", 3000),
        heartbeat_interval_ms=args.get("heartbeat_interval_ms", 300),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        assignor=args.get("assignor", "cooperative-sticky"),
        on_assigned=listener("assigned"),
        on_revoked=listener("revoked"),
        on_lost=listener("lost"),
    )
    emit(ev="start", pid=os.getpid())
    mode = args.get("commit", "after")
    delay = float(args.get("delay", 0.0))
    max_records = int(args.get("max_records", 50))

    refused: set[TopicPartition] = set()  # catch_up: partitions whose commit was refused

    def commit(records: list[Any]) -> None:
        offsets: dict[TopicPartition, int] = {}
        for r in records:
            offsets[TopicPartition(r.topic, r.partition)] = r.offset + 1
        commit_offsets(offsets)

    def commit_offsets(offsets: dict[TopicPartition, int]) -> None:
        gen, member = consumer.generation, consumer.member_id
        t0 = time.monotonic()
        try:
            consumer.commit(offsets)
            refused.difference_update(offsets)
            emit(
                ev="commit",
                ok=True,
                t0=t0,
                gen=gen,
                member=member,
                error=None,
                offsets={tp.partition: o for tp, o in offsets.items()},
            )
        except CommitFailedError as exc:
            refused.update(offsets)
            emit(
                ev="commit",
                ok=False,
                t0=t0,
                gen=gen,
                member=member,
                error=str(exc),
                offsets={tp.partition: o for tp, o in offsets.items()},
            )

    try:
        while not stopping:
            records = consumer.poll(0.1, max_records=max_records)
            if not records:
                owned = refused & consumer.assignment()
                if project is not None and args.get("catch_up") and owned:
                    # as a worker does: commit again what the read model applied
                    commit_offsets({tp: project.position(tp.partition) for tp in owned})
                continue
            gen, member = consumer.generation, consumer.member_id
            recs = [[r.partition, r.offset] for r in records]
            if mode == "before":
                commit(records)
                emit(ev="processing")
                time.sleep(delay)
                emit(ev="records", recs=recs, gen=gen, member=member)
            else:
                emit(ev="records", recs=recs, gen=gen, member=member)
                emit(ev="processing")
                time.sleep(delay)
                if project is not None:
                    applied = project.apply(records, member)
                    emit(ev="applied", recs=applied, gen=gen, member=member)
                commit(records)
    except ConsumerError as exc:
        emit(ev="error", error=str(exc))
        raise
    consumer.close()
    emit(ev="closed")
    store.close()


class Projector:
    """A read model in SQLite whose positions live in the same file: each batch of a
    partition is applied in one transaction that also moves the partition's position, and
    only from that position on (compare-and-set), so a redelivered batch or a zombie's batch
    applies nothing twice. ``applied`` has (partition, offset) as its primary key: a second
    application would raise and kill the member."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS positions (p INTEGER PRIMARY KEY, next INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS applied (p INTEGER, o INTEGER, member TEXT,"
        " PRIMARY KEY (p, o))",
    )

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, timeout=120, isolation_level=None)
        for statement in self.SCHEMA:
            self.db.execute(statement)

    def position(self, p: int) -> int:
        row = self.db.execute("SELECT next FROM positions WHERE p = ?", (p,)).fetchone()
        return int(row[0]) if row else 0

    def apply(self, records: list[Any], member: str | None) -> list[list[int]]:
        applied: list[list[int]] = []
        self.db.execute("BEGIN IMMEDIATE")
        try:
            ordered = sorted(records, key=lambda r: (r.partition, r.offset))
            for p, group in itertools.groupby(ordered, key=lambda r: r.partition):
                batch = list(group)
                position = self.position(p)
                if not batch[0].offset <= position <= batch[-1].offset + 1:
                    continue  # behind (a zombie) or a gap: apply nothing
                fresh = [r.offset for r in batch if r.offset >= position]
                self.db.executemany(
                    "INSERT INTO applied VALUES (?, ?, ?)", [(p, o, member) for o in fresh]
                )
                if fresh:
                    self.db.execute(
                        "INSERT OR REPLACE INTO positions VALUES (?, ?)", (p, fresh[-1] + 1)
                    )
                applied.extend([p, o] for o in fresh)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return applied


def projector(path: str) -> Projector:
    return Projector(path)


# ---------------------------------------------------------------------------- test side
@dataclass
class Member:
    """A running member process and its event file."""

    name: str
    proc: subprocess.Popen[bytes]
    events_path: Path
    stderr_path: Path
    _offset: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> list[dict[str, Any]]:
        """All events so far (new complete lines are appended to :attr:`events`)."""
        with contextlib.suppress(FileNotFoundError), open(self.events_path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
            end = data.rfind(b"\n") + 1
            self._offset += end
            for line in data[:end].splitlines():
                self.events.append(json.loads(line))
        return self.events

    def owned(self) -> set[int]:
        """Partitions owned as of the last event read."""
        owned: set[int] = set()
        for ev in self.read():
            if ev["ev"] == "assigned":
                owned |= set(ev["tps"])
            elif ev["ev"] in ("revoked", "lost"):
                owned -= set(ev["tps"])
        return owned

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [ev for ev in self.read() if ev["ev"] == kind]

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def signal(self, signo: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signo)

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop (SIGTERM → close()), then SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_member(name: str, tmp: Path, *, env: dict[str, str] | None = None, **args: Any) -> Member:
    """Start a member process; ``env``: extra environment (e.g. ``EVENTLANE_PAUSES``)."""
    events = tmp / f"{name}.events"
    stderr = tmp / f"{name}.stderr"
    args = {"events": str(events), **args}
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(MEMBERS), json.dumps(args)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=ROOT,
        )
    return Member(name, proc, events, stderr)


def wait_for(condition: Any, timeout: float, what: str, members: list[Member] = ()) -> float:
    """Poll ``condition()`` every 20 ms until true; returns the time it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() > deadline:
            details = "\n".join(
                f"--- {m.name} (rc={m.proc.poll()}) owned={sorted(m.owned())}\n{m.stderr()}"
                for m in members
            )
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{details}")
        for m in members:
            if m.proc.poll() not in (None, 0, -9, -15):
                raise AssertionError(f"member {m.name} died rc={m.proc.returncode}:\n{m.stderr()}")
        time.sleep(0.02)


TOPIC = "events"
GROUP = "workers"
START_S = 60.0  # a member process may take long to start on a loaded machine


def members_fixture() -> Iterator[list[Member]]:
    """The member processes a test starts; stopped (gracefully, else killed) at its end.
    (A cluster test module makes it its ``members`` fixture: ``pytest.fixture(name=...)``.)"""
    group: list[Member] = []
    yield group
    for m in group:
        m.stop()


def counts(group: list[Member]) -> list[int]:
    """How many partitions each member owns, sorted."""
    return sorted(len(m.owned()) for m in group)


def union(group: list[Member]) -> set[int]:
    """Every partition some member of ``group`` owns."""
    return set().union(*(m.owned() for m in group))


class OffsetWatch:
    """Samples a group's committed offsets (``read()``: partition -> committed entry) every
    50 ms in a thread and records any that went backwards: an independent oracle. A sample
    that fails (a cluster electing a leader) is skipped."""

    def __init__(self, read: Any) -> None:
        self.read = read
        self.backwards: list[tuple[int, int, int]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from eventlane.errors import FrameworkError  # noqa: PLC0415

        last: dict[int, int] = {}
        while not self._stop.wait(0.05):
            try:
                offsets = self.read()
            except FrameworkError:
                continue
            for tp, entry in offsets.items():
                if entry.offset < last.get(tp.partition, 0):
                    self.backwards.append((tp.partition, last[tp.partition], entry.offset))
                last[tp.partition] = max(last.get(tp.partition, 0), entry.offset)
            self.samples += 1

    def __enter__(self) -> OffsetWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def produce(store: LogStore, n: int, partitions: int, start: int = 0) -> None:
    records = [ProducerRecord(None, f"r{i}".encode()) for i in range(start, start + n)]
    for p in range(partitions):
        store.append(TOPIC, p, [tuple(r) for r in records[p::partitions]])  # type: ignore[misc]


class Feeder:
    """Appends a few records to every partition every 20 ms until stopped."""

    def __init__(self, store: LogStore, partitions: int) -> None:
        self.store, self.partitions = store, partitions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(0.02):
            produce(self.store, 2 * self.partitions, self.partitions, i)
            i += 2 * self.partitions

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def hwms(store: LogStore, partitions: int) -> dict[int, int]:
    return {p: store.offsets(TOPIC, p).hwm for p in range(partitions)}


def all_committed(store: LogStore, partitions: int) -> bool:
    offsets = OffsetStore(store)
    marks = hwms(store, partitions)
    return all(
        (entry := offsets.committed(GROUP, TopicPartition(TOPIC, p))) is not None
        and entry.offset == marks[p]
        for p in range(partitions)
    )


def ownership_intervals(
    members: list[Member], end: float
) -> dict[int, list[tuple[float, float, str]]]:
    """Per partition, every ``(start, stop, member)`` interval of ownership from the logs;
    an interval still open ends at ``end``.

    An interval ended by ``revoked`` stops when the member gave the partition up (the
    callback runs before the release). One ended by ``lost`` (the member was evicted, as
    Kafka's coordinator evicts a member silent past its session) stops at the start of the
    member's last *accepted* commit for that partition: the coordinator took the partition
    away at some moment the member cannot see, and what must never happen is a commit of a
    zombie accepted after another member was given the partition. Its refused commits and
    the time until it noticed are not ownership."""
    out: dict[int, list[tuple[float, float, str]]] = {}
    for m in members:
        open_since: dict[int, float] = {}
        events = m.read()
        for ev in events:
            if ev["ev"] == "assigned":
                for p in ev["tps"]:
                    assert p not in open_since, f"{m.name} assigned {p} twice"
                    open_since[p] = ev["t"]
            elif ev["ev"] == "revoked":
                for p in ev["tps"]:
                    out.setdefault(p, []).append((open_since.pop(p), ev["t"], m.name))
            elif ev["ev"] == "lost":
                for p in ev["tps"]:
                    since = open_since.pop(p)
                    accepted = [
                        c["t0"]
                        for c in events
                        if c["ev"] == "commit"
                        and c["ok"]
                        and str(p) in {str(k) for k in c["offsets"]}
                        and since <= c["t0"] <= ev["t"]
                    ]
                    label = f"{m.name} (lost in generation {ev.get('gen')}: last accepted commit)"
                    out.setdefault(p, []).append((since, max(accepted, default=since), label))
        for p, since in open_since.items():
            out.setdefault(p, []).append((since, end, m.name))
    return out


def overlaps(intervals: dict[int, list[tuple[float, float, str]]]) -> list[str]:
    """Every pair of intervals of one partition that overlap in time (should be none)."""
    found = []
    for p, spans in intervals.items():
        ordered = sorted(spans)
        for (s1, e1, m1), (s2, e2, m2) in itertools.pairwise(ordered):
            if s2 < e1:
                found.append(
                    f"partition {p}: {m1} [{s1:.4f}, {e1:.4f}] overlaps {m2} [{s2:.4f}, {e2:.4f}]"
                )
    return found


def processed(members: list[Member]) -> list[tuple[int, int]]:
    """Every (partition, offset) any member logged as processed (with repeats)."""
    return [(p, o) for m in members for ev in m.of("records") for p, o in ev["recs"]]


if __name__ == "__main__":
    _run_member(json.loads(sys.argv[1]))
