"""Child processes and crash harnesses for the multi-process and ``kill -9`` tests of the log.

Run a child as a script (the tests and ``benchmarks/soak_crash.py`` start it with
``subprocess``)::

    python tests/log/procs.py ROLE '<json arguments>'

Roles (each writes its protocol lines to stdout, one ``flush`` per acknowledged append, and
its structured logs to stderr):

``produce``  appends payload records to a topic with a mix of APIs (``Producer.send_batch`` with
             batch sizes from 1 to thousands, single ``send(...).result()``, bursts of
             ``send`` futures sharing one group commit, and direct ``LogStore.append`` to an
             explicit partition). After each call returns it prints ``A <partition> <offset>
             <id>`` for every record of it: those are the *acknowledged* (durable) records.
             Prints ``R`` once ready, ``D`` when it has produced ``count`` records (forever
             if no count). ``go``: wait for that file before producing; ``plan``: append
             batches of these sizes to partition 0 instead, with no threads.
``tail``     a free consumer assigned every partition, polling with a timeout (it sleeps on
             the log's futex and wakes on appends from other processes); prints ``S
             <partition> <offset> <id>`` per record seen, ``D <records> <empty polls>
             <seconds>`` once it has seen ``total`` records.
``compact``  opens the partitions, prints ``C``, runs ``LogStore.compact(topic)``, prints ``D
             <seconds> <storage calls> <storage calls from the commit phase on>``.
``cleanup``  the same with ``LogStore.cleanup(topic)`` (retention).

Every role but ``tail`` takes ``crash_at`` / ``crash_on`` (and the maintenance roles
``crash_after_phase``): the process kills itself with SIGKILL at that storage call (see
:func:`crash_at_storage_call`).

Payload format (the value of every record a ``produce`` child writes)::

    b"<tag>:<seq>|<n>|" + FILLER[seq % 251 : seq % 251 + n]

``<tag>:<seq>`` is the payload id: ``tag`` names one producer process and ``seq`` counts its
records from 0 in send order. The filler is derived from ``seq``, so a record whose bytes
changed anywhere is caught by :func:`parse_value` even if its CRC were right.

The harnesses (:class:`ProducerCrashLoop`, :class:`CompactionCrashLoop`,
:class:`RetentionCrashLoop`) run whole ``kill -9`` cycles and count anomalies in
:class:`CrashFigures` instead of asserting, so the soak script can print figures; the tests
assert the anomaly counts are zero.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from eventlane.consumer.free import Consumer
from eventlane.errors import OffsetOutOfRangeError
from eventlane.log import LogStore, Producer, ProducerRecord, TopicPartition
from eventlane.log.embedded import state as state_module
from eventlane.log.embedded.segment import list_segment_bases
from eventlane.log.partitioner import partition_for_key
from eventlane.observability import configure_logging

PROCS = Path(__file__).resolve()
FILLER = bytes(range(251)) * 1200  # >= 300 KiB of a pattern that never aligns with itself
JOURNAL_NAME = "cleaner-journal"
READY_TIMEOUT_S = 120.0
"""How long a child may take to start (a noisy 2-core machine can be very slow)."""


# ---------------------------------------------------------------------------- payloads
def make_value(tag: str, seq: int, pad: int) -> bytes:
    start = seq % 251
    return b"%s:%d|%d|" % (tag.encode(), seq, pad) + FILLER[start : start + pad]


def parse_value(value: bytes | None) -> tuple[str, int]:
    """``(tag, seq)`` of a payload value; ``ValueError`` if any byte of it is wrong."""
    if value is None:
        raise ValueError("payload value is null")
    ident, pad_text, rest = value.split(b"|", 2)
    tag, seq_text = ident.rsplit(b":", 1)
    seq, pad = int(seq_text), int(pad_text)
    start = seq % 251
    if len(rest) != pad or rest != FILLER[start : start + pad]:
        raise ValueError(f"payload {ident!r} has a damaged filler")
    return tag.decode(), seq


def payload_id(value: bytes | None) -> str:
    tag, seq = parse_value(value)
    return f"{tag}:{seq}"


# ---------------------------------------------------------------------------- children
STORAGE_CALLS = ("fsync", "fdatasync", "ftruncate", "replace", "rename", "unlink")
WRITE_CALLS = ("pwrite", "pwritev", "write")
"""The ``os`` functions counted by :func:`crash_at_storage_call` (with state writes)."""


class _CallCounter:
    calls = 0
    phase_start = -1
    """``calls`` when the action's commit phase began (see :func:`_child_maintenance`)."""


def _path_name(target: Any) -> str:
    """The file name behind a path or an open file descriptor."""
    if isinstance(target, int):
        try:
            target = os.readlink(f"/proc/self/fd/{target}")
        except OSError:
            return ""
    return Path(str(target)).name


def crash_at_storage_call(n: int | None, crash_on: str | None = None) -> _CallCounter:
    """Count this process's storage calls from now on; if ``n`` is given, SIGKILL the
    process at the ``n``-th one (SQLite's crash-at-N technique: together with random-time
    kills, every step of an append, roll, compaction swap or retention gets killed at).

    The kill comes before the call is made, except for writes and shared-state updates,
    where it lands *inside* the call: a random prefix of the bytes reaches the file (a torn
    write), or the seqlock is left odd with the fields half written (as a kill in the middle
    of the ``memcpy`` would). ``crash_on="CALL:NAME"`` kills instead before the first
    ``os.CALL`` on a file named ``NAME`` (by path or open descriptor), e.g.
    ``unlink:cleaner-journal``."""
    counter = _CallCounter()

    def tick() -> bool:
        counter.calls += 1
        return counter.calls == n

    def wrap(name: str) -> None:
        original = getattr(os, name)

        def hooked(*a: Any, **kw: Any) -> Any:
            if tick() or (a and f"{name}:{_path_name(a[0])}" == crash_on):
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*a, **kw)

        setattr(os, name, hooked)

    for name in STORAGE_CALLS:
        wrap(name)
    pwrite, write = os.pwrite, os.write
    rng = random.Random(n)

    def wrap_write(name: str) -> None:
        original = getattr(os, name)

        def hooked(fd: int, data: Any, *rest: Any) -> Any:
            if tick():  # a torn write: some prefix of the bytes reaches the file
                raw = b"".join(data) if name == "pwritev" else bytes(data)
                cut = raw[: rng.randrange(len(raw) + 1)]
                if name == "write":
                    write(fd, cut)
                else:
                    pwrite(fd, cut, rest[0])
                os.kill(os.getpid(), signal.SIGKILL)
            return original(fd, data, *rest)

        setattr(os, name, hooked)

    for name in WRITE_CALLS:
        wrap_write(name)
    original_write = state_module.PartitionState.write

    def state_write(self: Any, snapshot: Any) -> None:
        if tick():
            m = self._m
            (seq,) = state_module._SEQ.unpack_from(m, 0)
            state_module._SEQ.pack_into(m, 0, (seq + 1) | 1)
            packed = state_module._FIELDS.pack(*snapshot)
            half = len(packed) // 2
            m[state_module._FIELDS_AT : state_module._FIELDS_AT + half] = packed[:half]
            os.kill(os.getpid(), signal.SIGKILL)
        original_write(self, snapshot)

    state_module.PartitionState.write = state_write  # type: ignore[method-assign]
    return counter


def _quiet_logs() -> None:
    """Structured logs (info and up, so recoveries are on record) go to stderr: stdout
    carries the protocol lines."""
    configure_logging(level="info", json=False)


def _emit(out: IO[bytes], lines: list[str]) -> None:
    out.write("".join(lines).encode())
    out.flush()


def _batch_size(rng: random.Random, cap: int) -> int:
    roll = rng.random()
    if roll < 0.15:
        n = 1
    elif roll < 0.50:
        n = rng.randint(2, 20)
    elif roll < 0.85:
        n = rng.randint(20, 400)
    else:
        n = rng.randint(400, 3000)
    return min(n, cap)


def _pad(rng: random.Random, big: bool) -> int:
    if big:
        return rng.randint(20_000, 250_000)  # large records: long writes, multi-batch appends
    return rng.randint(0, 200)


def child_produce(args: dict[str, Any]) -> None:
    """See the module docstring (role ``produce``)."""
    _quiet_logs()
    rng = random.Random(args["seed"])
    tag: str = args["tag"]
    topic: str = args["topic"]
    count: int | None = args.get("count")
    keys: int = args.get("keys", 1000)
    big: bool = args.get("big", True)
    singles: float = args.get("singles", 0.15)
    cap: int = args.get("max_batch", 1 << 30)
    out = sys.stdout.buffer
    store = LogStore(args["data"])
    producer = Producer(store)
    partitions = store.partition_count(topic)
    go = args.get("go")
    _emit(out, ["R\n"])
    if args.get("crash_at") or args.get("crash_on"):
        crash_at_storage_call(args.get("crash_at"), args.get("crash_on"))
    if go:
        while not Path(go).exists():
            time.sleep(0.002)
    seq = 0

    def record(prefix: bytes, large: bool = False) -> ProducerRecord:
        nonlocal seq
        key = b"%s%05d" % (prefix, rng.randrange(keys))
        value = make_value(tag, seq, _pad(rng, large))
        seq += 1
        return ProducerRecord(key, value)

    def batch_of(prefix: bytes, n: int) -> list[ProducerRecord]:
        # One batch in twenty carries a large record somewhere in it.
        large_at = rng.randrange(n) if big and rng.random() < 0.05 else -1
        return [record(prefix, i == large_at) for i in range(n)]

    for n in args.get("plan") or ():  # scripted: direct appends to partition 0, in order
        first = seq
        result = store.append(topic, 0, [record(b"d") for _ in range(n)])
        _emit(out, [f"A 0 {result.base_offset + i} {tag}:{first + i}\n" for i in range(n)])
    if args.get("plan"):
        count = 0
    while count is None or seq < count:
        left = None if count is None else count - seq
        mode = rng.random()
        if mode < singles * 0.5:  # one send, one fsync
            r = record(b"k")
            meta = producer.send(topic, r.value, key=r.key).result()
            _emit(out, [f"A {meta.partition} {meta.offset} {tag}:{seq - 1}\n"])
        elif mode < singles:  # a burst of futures sharing a group commit
            n = rng.randint(2, 30) if left is None else min(rng.randint(2, 30), left)
            first = seq
            futures = [
                producer.send(topic, r.value, key=r.key) for r in (record(b"k") for _ in range(n))
            ]
            lines = []
            for i, fut in enumerate(futures):
                meta = fut.result()
                lines.append(f"A {meta.partition} {meta.offset} {tag}:{first + i}\n")
            _emit(out, lines)
        elif mode < singles + 0.15:  # explicit partition, straight to the log
            n = _batch_size(rng, cap) if left is None else min(_batch_size(rng, cap), left)
            p = rng.randrange(partitions)
            first = seq
            batch = batch_of(b"d", n)
            result = store.append(topic, p, batch)
            _emit(out, [f"A {p} {result.base_offset + i} {tag}:{first + i}\n" for i in range(n)])
        else:  # keyed batch through the producer's partitioner
            n = _batch_size(rng, cap) if left is None else min(_batch_size(rng, cap), left)
            first = seq
            batch = batch_of(b"k", n)
            metas = producer.send_batch(topic, batch)
            for r, meta in zip(batch, metas, strict=True):
                assert meta.partition == partition_for_key(r.key or b"", partitions)
            _emit(
                out,
                [f"A {m.partition} {m.offset} {tag}:{first + i}\n" for i, m in enumerate(metas)],
            )
    producer.close()
    store.close()
    _emit(out, ["D\n"])


def child_tail(args: dict[str, Any]) -> None:
    """See the module docstring (role ``tail``)."""
    _quiet_logs()
    out = sys.stdout.buffer
    store = LogStore(args["data"])
    topic: str = args["topic"]
    total: int = args.get("total", 0)
    deadline = time.monotonic() + args.get("timeout", 1e9)
    consumer = Consumer(
        store, auto_offset_reset="earliest", max_poll_records=args.get("max_records", 500)
    )
    consumer.assign([TopicPartition(topic, p) for p in range(store.partition_count(topic))])
    _emit(out, ["R\n"])
    seen = 0
    empty = 0
    started = time.monotonic()
    while (total == 0 or seen < total) and time.monotonic() < deadline:
        records = consumer.poll(timeout=args.get("poll_timeout", 5.0))
        if not records:
            empty += 1
            continue
        seen += len(records)
        _emit(out, [f"S {r.partition} {r.offset} {payload_id(r.value)}\n" for r in records])
    _emit(out, [f"D {seen} {empty} {time.monotonic() - started:.3f}\n"])
    store.close()


def _child_maintenance(args: dict[str, Any], action: str) -> None:
    _quiet_logs()
    out = sys.stdout.buffer
    store = LogStore(args["data"])
    store.partition_count(args["topic"])
    for p in range(store.partition_count(args["topic"])):
        store.partition(args["topic"], p)  # open (and repair) before the clock starts
    if args.get("go"):  # opened: now wait for the word
        _emit(out, ["R\n"])
        while not Path(args["go"]).exists():
            time.sleep(0.002)
    _emit(out, ["C\n"])
    counter = crash_at_storage_call(args.get("crash_at"), args.get("crash_on"))
    # The commit phase starts with the first durable write of a decision: the compaction
    # journal, or retention's new log-start-offset. ``crash_after_phase`` kills at the n-th
    # storage call from there on (the renames, unlinks and state changes that follow).
    # The log's partition owns both decisions' writes: the swap journal (written by
    # ``eventlane.log.embedded.recovery``'s journal helper) and the new low-water mark.
    decision = JOURNAL_NAME if action == "compact" else "log-start-offset"
    module = importlib.import_module(
        "eventlane.log.embedded.recovery"
        if action == "compact"
        else "eventlane.log.embedded.partition"
    )
    original_write_atomic = module.write_atomic
    after_phase = args.get("crash_after_phase")

    def write_atomic(path: Path, data: bytes) -> None:
        if counter.phase_start < 0 and path.name == decision:
            counter.phase_start = counter.calls
            if after_phase:
                crash_at_storage_call(after_phase)  # nested counter: kills at its n-th call
        original_write_atomic(path, data)

    module.write_atomic = write_atomic
    started = time.perf_counter()
    getattr(store, action)(args["topic"])
    phase_calls = counter.calls - counter.phase_start if counter.phase_start >= 0 else 0
    _emit(out, [f"D {time.perf_counter() - started:.4f} {counter.calls} {phase_calls}\n"])
    store.close()


ROLES = {
    "produce": child_produce,
    "tail": child_tail,
    "compact": lambda a: _child_maintenance(a, "compact"),
    "cleanup": lambda a: _child_maintenance(a, "cleanup"),
}


# ---------------------------------------------------------------------------- parent side
class Child:
    """A child process whose stdout goes to a file (never a pipe: a full pipe would stall
    the child in ``write`` and every kill would land there)."""

    def __init__(self, role: str, args: dict[str, Any], out_dir: Path, name: str) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.out_path = out_dir / f"{name}.out"
        self.err_path = out_dir / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(PROCS), role, json.dumps(args)],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        self._read_at = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self) -> list[str]:
        """Every complete line written so far (a line cut by a kill is ignored)."""
        data = self.out_path.read_bytes()
        end = data.rfind(b"\n") + 1
        return data[:end].decode().splitlines()

    def new_lines(self) -> list[str]:
        """Complete lines written since the last call."""
        with open(self.out_path, "rb") as f:
            f.seek(self._read_at)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._read_at += end
        return data[:end].decode().splitlines()

    def wait_for_line(self, first: str, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until a line starting with ``first`` is written (or fail if the child died)."""
        deadline = time.monotonic() + timeout
        while True:
            if any(line.startswith(first) for line in self.lines()):
                return
            if self.proc.poll() is not None:
                if any(line.startswith(first) for line in self.lines()):
                    return
                raise RuntimeError(
                    f"child {self.name} exited with {self.proc.returncode} "
                    f"before {first!r}: {self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"child {self.name} did not write {first!r} in {timeout} s")
            time.sleep(0.002)

    def kill(self) -> int:
        """SIGKILL (if still running) and reap; returns the exit status."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def remove_files(self) -> None:
        """Delete the output files (a long soak would fill the disk with them)."""
        for path in (self.out_path, self.err_path):
            path.unlink(missing_ok=True)

    def stderr_tail(self, limit: int = 3000) -> str:
        try:
            return self.err_path.read_bytes()[-limit:].decode(errors="replace")
        except FileNotFoundError:
            return ""


def acked(lines: list[str]) -> Iterator[tuple[int, int, str]]:
    """``(partition, offset, id)`` of the ``A``/``S`` lines of a child's output."""
    for line in lines:
        if line.startswith(("A ", "S ")):
            _, p, o, ident = line.split(" ")
            yield int(p), int(o), ident


def drop_state_files(data: Path, topic: str) -> None:
    """Simulate a reboot: the shared ``state`` of every partition is a cache that a reboot
    loses (it is never fsynced), so the next opener must rebuild it from the segment files.
    Only valid while no process has the topic open."""
    for state in (data / "topics" / topic).glob("*/state"):
        state.unlink()


def stats_ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"n={len(values)} median={statistics.median(values):.1f} ms p99={p99:.1f} ms "
        f"max={ordered[-1]:.1f} ms"
    )


@dataclass
class CrashFigures:
    """Counts of what the crash loops did and of every anomaly they found."""

    cycles: int = 0
    kills: int = 0
    crash_at_kills: int = 0
    double_kills: int = 0
    clean_exits: int = 0
    reboots: int = 0
    acked: int = 0
    records_in_log: int = 0
    reader_seen: int = 0
    reader_kills: int = 0
    lost: int = 0
    misplaced: int = 0
    reordered: int = 0
    duplicated: int = 0
    corrupt: int = 0
    vanished: int = 0
    wrong_content: int = 0
    child_errors: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    """Where the maintenance kills landed, judged from the files they left."""
    recovery_ms: list[float] = field(default_factory=list)
    reboot_recovery_ms: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    ANOMALIES = (
        "lost",
        "misplaced",
        "reordered",
        "duplicated",
        "corrupt",
        "vanished",
        "wrong_content",
        "child_errors",
    )

    def anomaly(self, kind: str, message: str, n: int = 1) -> None:
        setattr(self, kind, getattr(self, kind) + n)
        if len(self.problems) < 30:
            self.problems.append(f"{kind}: {message}")

    @property
    def anomalies(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.ANOMALIES}

    def clean(self) -> bool:
        return not any(self.anomalies.values())

    def summary(self) -> str:
        producers = bool(self.acked or self.reader_seen)
        head = (
            f"cycles={self.cycles} kills={self.kills} (at a chosen storage call: "
            f"{self.crash_at_kills}"
            + (f", two producers at once: {self.double_kills}" if producers else "")
            + f") clean_exits={self.clean_exits} reboots_simulated={self.reboots}"
        )
        records = f"records_in_log={self.records_in_log}"
        if producers:
            records = (
                f"acked_records={self.acked} {records} reader_seen={self.reader_seen} "
                f"reader_kills={self.reader_kills}"
            )
        return "\n".join(
            [
                head,
                records,
                "anomalies: " + " ".join(f"{k}={v}" for k, v in self.anomalies.items()),
                *(f"killed while {phase}: {n}" for phase, n in sorted(self.phases.items())),
                f"recovery (lock-holder repair, open + first lock of every partition): "
                f"{stats_ms(self.recovery_ms)}",
                f"recovery (after a simulated reboot, full scan from the recovery point): "
                f"{stats_ms(self.reboot_recovery_ms)}",
                *self.problems,
            ]
        )


def _open_and_time(data: Path, topic: str) -> tuple[Any, float]:
    """Open a fresh ``LogStore`` and every partition (which repairs what a kill left)."""
    started = time.perf_counter()
    store = LogStore(data)
    for p in range(store.partition_count(topic)):
        store.partition(topic, p)
    return store, (time.perf_counter() - started) * 1000


def read_all(store: Any, topic: str, partition: int, start: int, end: int) -> list[Any]:
    """Every record of ``[start, end)`` of one partition, read sequentially with a cursor."""
    out: list[Any] = []
    cursor = None
    offset = start
    while offset < end:
        records, cursor = store.read(topic, partition, offset, cursor=cursor, upto=end)
        if not records:
            break
        out.extend(records)
        offset = records[-1].offset + 1
    return out


# ---------------------------------------------------------------------------- producer crashes
class ProducerCrashLoop:
    """``kill -9`` of producer processes mid-append, cycle after cycle, with a tailing reader.

    Each cycle starts one producer child (two at once every ``double_every``-th cycle) and
    SIGKILLs it: alternately after a random 0..``max_delay`` s once it is ready, or at a
    random storage call of its own (:func:`crash_at_storage_call`), so kills land mid-write,
    mid-fsync, mid-roll and inside the shared-state seqlock. Every ``reboot_every``-th cycle
    simulates a reboot (every process killed, the reader included, and the partitions'
    shared state dropped) so the full recovery scan runs too. Then a fresh ``LogStore`` is
    opened (timed: that is the recovery) and checked:

    * ``verify`` finds no bad batch; ``hwm == leo``; the HWM never went below what was
      checked before;
    * every record's value is intact and its payload id appears once in the whole topic
      (*duplicated*), offsets strictly increase, and each producer's records keep their send
      order within a partition (*reordered*); keyed records sit where Kafka's partitioner
      puts them (*misplaced*);
    * every acknowledged record is in the log exactly at its acknowledged partition and
      offset (*lost* / *misplaced*);
    * every record the tailing reader saw below the HWM is still there, at the same offset
      (*vanished*).

    The next cycle's producer appends after this recovery. Every ``full_check_every`` cycles
    and at the end, the whole topic is re-read from offset 0 and every acknowledgement ever
    made is checked again. A new topic is started every ``topic_cycles`` cycles so that a
    long soak does not re-read an ever-growing log.
    """

    def __init__(
        self,
        root: Path,
        *,
        seed: int,
        partitions: int = 3,
        segment_bytes: int = 256 * 1024,
        max_delay: float = 0.35,
        double_every: int = 5,
        reboot_every: int = 4,
        topic_cycles: int = 50,
        full_check_every: int = 10,
        big: bool = True,
        max_crash_call: int = 400,
        with_reader: bool = True,
        keep_files: bool = True,
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.out_dir = root / "out"
        self.rng = random.Random(seed)
        self.partitions = partitions
        self.segment_bytes = segment_bytes
        self.max_delay = max_delay
        self.double_every = double_every
        self.reboot_every = reboot_every
        self.topic_cycles = topic_cycles
        self.full_check_every = full_check_every
        self.big = big
        self.max_crash_call = max_crash_call
        self.with_reader = with_reader
        self.keep_files = keep_files
        self.figures = CrashFigures()
        self.topic_no = 0
        self.topic = ""
        self.reader: Child | None = None
        self.reader_no = 0
        self._new_topic()

    # -- topic and reader lifecycle
    def _new_topic(self) -> None:
        self._stop_reader()
        self.topic_no += 1
        previous, self.topic = self.topic, f"crash-{self.topic_no}"
        with LogStore(self.data) as store:
            if previous and not self.keep_files:
                store.delete_topic(previous)  # checked in full already: free the disk
            store.create_topic(
                self.topic,
                self.partitions,
                {"segment_bytes": self.segment_bytes, "retention_ms": -1},
            )
        self._reset_model()
        self.acks: dict[str, tuple[int, int]] = {}
        self.topic_cycle = 0
        self._start_reader()

    def _reset_model(self) -> None:
        self.log_ids: dict[str, tuple[int, int]] = {}
        self.checked = [0] * self.partitions
        self.last_offset = [-1] * self.partitions
        self.last_seq: dict[tuple[str, int], int] = {}
        self.reader_views: dict[str, tuple[int, int]] = {}

    def _start_reader(self) -> None:
        if not self.with_reader:
            return
        self.reader_no += 1
        self.reader = Child(
            "tail",
            {"data": str(self.data), "topic": self.topic, "poll_timeout": 1.0},
            self.out_dir,
            f"reader-{self.reader_no}",
        )
        self.reader.wait_for_line("R")

    def _stop_reader(self) -> None:
        if self.reader is not None:
            self._check_reader_alive()
            self.reader.kill()
            self._reader_lines()
            if not self.keep_files:
                self.reader.remove_files()
            self.reader = None
            self.figures.reader_kills += 1

    def _check_reader_alive(self) -> None:
        assert self.reader is not None
        if self.reader.proc.poll() is not None and self.reader.proc.returncode != -9:
            self.figures.anomaly(
                "child_errors",
                f"reader exited {self.reader.proc.returncode}: {self.reader.stderr_tail()}",
            )

    def _reader_lines(self) -> None:
        assert self.reader is not None
        for p, o, ident in acked(self.reader.new_lines()):
            self.figures.reader_seen += 1
            prior = self.reader_views.setdefault(ident, (p, o))
            if prior != (p, o):
                self.figures.anomaly("vanished", f"reader saw {ident} at {(p, o)} and {prior}")

    # -- cycles
    def run(self, cycles: int, progress: Any = None) -> CrashFigures:
        try:
            for i in range(cycles):
                if self.topic_cycle >= self.topic_cycles:
                    self._full_check()
                    self._new_topic()
                self.cycle()
                if self.topic_cycle % self.full_check_every == 0:
                    self._full_check()
                if progress is not None:
                    progress(i + 1, self.figures)
            self._final_clean_run()
            self._full_check()
        finally:
            if self.reader is not None:
                self.reader.kill()
        return self.figures

    def _spawn_producer(
        self, name: str, count: int | None = None, crash_at: int | None = None
    ) -> Child:
        return Child(
            "produce",
            {
                "data": str(self.data),
                "topic": self.topic,
                "tag": name,
                "seed": self.rng.randrange(1 << 30),
                "count": count,
                "big": self.big,
                "crash_at": crash_at,
            },
            self.out_dir,
            name,
        )

    def cycle(self) -> None:
        """One cycle: start the producer(s), kill, recover, check (see the class docstring)."""
        fig = self.figures
        fig.cycles += 1
        self.topic_cycle += 1
        base = f"t{self.topic_no}c{fig.cycles}"
        two = fig.cycles % self.double_every == 0
        plans = [
            self.rng.randint(1, self.max_crash_call) if (fig.cycles + n) % 2 else None
            for n in range(2 if two else 1)
        ]
        children = [
            self._spawn_producer(base + "ab"[n], crash_at=plan) for n, plan in enumerate(plans)
        ]
        try:
            for child in children:
                child.wait_for_line("R")
            if None in plans:
                time.sleep(self.rng.uniform(0.0, self.max_delay))
            for n, (child, plan) in enumerate(zip(children, plans, strict=True)):
                if plan is None:
                    if n:
                        time.sleep(self.rng.uniform(0.0, 0.05))
                    rc = child.kill()
                else:
                    rc = child.wait(READY_TIMEOUT_S)
                if rc == -signal.SIGKILL:
                    fig.kills += 1
                    if plan is not None:
                        fig.crash_at_kills += 1
                elif rc == 0:
                    fig.clean_exits += 1
                else:
                    fig.anomaly("child_errors", f"{child.name} exited {rc}: {child.stderr_tail()}")
        finally:  # never leave a producer running (it would fill the disk)
            for child in children:
                child.kill()
        if two:
            fig.double_kills += 1
        self._recover_and_check(children, fig.cycles % self.reboot_every == 0)

    def sweep(self, calls: range, plan: list[int]) -> CrashFigures:
        """Kill a scripted producer at each storage call of ``calls`` in turn (SQLite's
        crash-at-N loop), recovering and checking after each, alternating plain reopens and
        simulated reboots, then appending once more from this process. Each ``n`` gets a
        fresh topic and the producer appends batches of ``plan`` sizes to partition 0 with
        no threads, so call ``n`` is the same step of the same append every time: with
        segments small enough to roll every few appends, every step of an append and of a
        roll is killed at once."""
        fig = self.figures
        try:
            for n in calls:
                self._new_topic()
                fig.cycles += 1
                child = Child(
                    "produce",
                    {
                        "data": str(self.data),
                        "topic": self.topic,
                        "tag": f"t{self.topic_no}n{n}",
                        "seed": n,
                        "crash_at": n,
                        "plan": plan,
                        "big": False,
                    },
                    self.out_dir,
                    f"sweep-{n}",
                )
                child.wait_for_line("R")
                rc = child.wait(READY_TIMEOUT_S)
                if rc == -signal.SIGKILL:
                    fig.kills += 1
                    fig.crash_at_kills += 1
                elif rc == 0:
                    fig.clean_exits += 1
                else:
                    fig.anomaly("child_errors", f"{child.name} exited {rc}: {child.stderr_tail()}")
                self._recover_and_check([child], reboot=n % 2 == 0)
                self._append_after_recovery(f"t{self.topic_no}post")
                self._full_check()
        finally:
            if self.reader is not None:
                self.reader.kill()
        return fig

    def _append_after_recovery(self, tag: str) -> None:
        """Append from this process after a recovery and check the records landed."""
        with LogStore(self.data) as store:
            result = store.append(
                self.topic, 0, [(b"d%05d" % i, make_value(tag, i, 10), (), None) for i in range(3)]
            )
            for i in range(3):
                self.acks[f"{tag}:{i}"] = (0, result.base_offset + i)
                self.figures.acked += 1
            self._check_new(store)
            for i in range(3):
                self._check_ack(f"{tag}:{i}", 0, result.base_offset + i)

    def _recover_and_check(self, children: list[Child], reboot: bool) -> None:
        """After the kill: maybe simulate a reboot, reopen (timed), check everything."""
        fig = self.figures
        if reboot:
            self._stop_reader()
            drop_state_files(self.data, self.topic)
            fig.reboots += 1
        store, elapsed = _open_and_time(self.data, self.topic)
        (fig.reboot_recovery_ms if reboot else fig.recovery_ms).append(elapsed)
        try:
            self._check_new(store)
            for child in children:
                for p, o, ident in acked(child.lines()):
                    fig.acked += 1
                    self.acks[ident] = (p, o)
                    self._check_ack(ident, p, o)
            if self.reader is not None:
                self._reader_lines()
            self._check_reader_views()
        finally:
            store.close()
        if not self.keep_files:
            for child in children:
                child.remove_files()
        if self.reader is not None and self.reader.proc.poll() is not None:
            self._stop_reader()  # it died by itself: that is an anomaly (recorded there)
        if self.reader is None:
            self._start_reader()

    def _final_clean_run(self) -> None:
        """One last producer that runs to completion: appends still work after all kills."""
        child = self._spawn_producer(f"t{self.topic_no}final", count=2000)
        rc = child.wait(300)
        if rc != 0:
            self.figures.anomaly(
                "child_errors", f"final producer exited {rc}: {child.stderr_tail()}"
            )
        store, _ = _open_and_time(self.data, self.topic)
        try:
            self._check_new(store)
            for p, o, ident in acked(child.lines()):
                self.figures.acked += 1
                self.acks[ident] = (p, o)
                self._check_ack(ident, p, o)
        finally:
            store.close()

    # -- checks
    def _check_ack(self, ident: str, p: int, o: int) -> None:
        where = self.log_ids.get(ident)
        if where is None:
            self.figures.anomaly("lost", f"acked {ident} at {(p, o)} is not in the log")
        elif where != (p, o):
            self.figures.anomaly("misplaced", f"acked {ident} at {(p, o)} found at {where}")

    def _check_reader_views(self) -> None:
        for ident, (p, o) in list(self.reader_views.items()):
            where = self.log_ids.get(ident)
            if where != (p, o):
                self.figures.anomaly(
                    "vanished", f"reader saw {ident} at {(p, o)}; the log now has it at {where}"
                )
        # Everything the reader saw is now below the checked HWM; forget it (bounded memory).
        self.reader_views.clear()

    def _check_new(self, store: Any) -> None:
        """Check the records appended since the last check (see the class docstring)."""
        fig = self.figures
        for problem in store.verify(self.topic):
            fig.anomaly("corrupt", f"verify: {problem}")
        for p in range(self.partitions):
            lwm, hwm, leo = store.offsets(self.topic, p)
            if hwm != leo or lwm != 0:
                fig.anomaly("corrupt", f"p{p}: marks lwm={lwm} hwm={hwm} leo={leo}")
            if hwm < self.checked[p]:
                fig.anomaly(
                    "lost", f"p{p}: hwm {hwm} went below {self.checked[p]}", self.checked[p] - hwm
                )
                self.checked[p] = hwm  # the full check will recount what is gone
            try:
                records = read_all(store, self.topic, p, self.checked[p], hwm)
            except Exception as exc:
                fig.anomaly("corrupt", f"p{p}: read failed: {exc!r}")
                continue
            for r in records:
                fig.records_in_log += 1
                if r.offset <= self.last_offset[p]:
                    fig.anomaly("corrupt", f"p{p}: offset {r.offset} after {self.last_offset[p]}")
                self.last_offset[p] = r.offset
                try:
                    tag, seq = parse_value(r.value)
                except ValueError as exc:
                    fig.anomaly("wrong_content", f"p{p} offset {r.offset}: {exc}")
                    continue
                ident = f"{tag}:{seq}"
                if ident in self.log_ids:
                    fig.anomaly(
                        "duplicated", f"{ident} at {(p, r.offset)} and {self.log_ids[ident]}"
                    )
                    continue
                self.log_ids[ident] = (p, r.offset)
                prev = self.last_seq.get((tag, p), -1)
                if seq <= prev:
                    fig.anomaly("reordered", f"{tag}: seq {seq} after {prev} in p{p}")
                self.last_seq[(tag, p)] = seq
                if (
                    r.key is not None
                    and r.key.startswith(b"k")
                    and (partition_for_key(r.key, self.partitions) != p)
                ):
                    fig.anomaly("misplaced", f"key {r.key!r} in p{p}")
            if records and records[-1].offset != hwm - 1:
                fig.anomaly("lost", f"p{p}: last record {records[-1].offset}, hwm {hwm}")
            self.checked[p] = hwm

    def _full_check(self) -> None:
        """Re-read the whole topic from scratch and re-check every acknowledgement."""
        before = self.figures.records_in_log
        store, _ = _open_and_time(self.data, self.topic)
        try:
            self._reset_model()
            self._check_new(store)
            for ident, (p, o) in self.acks.items():
                self._check_ack(ident, p, o)
        finally:
            store.close()
        self.figures.records_in_log = before  # counted once, by the incremental checks


# ---------------------------------------------------------------------------- maintenance crashes
class _MaintenanceCrashLoop:
    """Shared machinery: a model of every record written, and a child killed mid-action."""

    action = ""

    def __init__(self, root: Path, *, seed: int, partitions: int = 2) -> None:
        self.root = root
        self.data = root / "data"
        self.out_dir = root / "out"
        self.rng = random.Random(seed)
        self.partitions = partitions
        self.figures = CrashFigures()
        self.written: list[dict[int, tuple[bytes | None, bytes | None]]] = [
            {} for _ in range(partitions)
        ]
        self.durations: list[float] = []
        self.calls: list[int] = []
        self.phase_calls: list[int] = []
        self.scheduled = 0
        self.early = 0
        self.completed = 0
        self.topic = ""

    def _append(
        self, store: Any, p: int, records: list[tuple[bytes | None, bytes | None, int | None]]
    ) -> None:
        result = store.append(self.topic, p, [(k, v, (), ts) for k, v, ts in records])
        for i, (k, v, _) in enumerate(records):
            self.written[p][result.base_offset + i] = (k, v)

    def _delay(self) -> float:
        """A random moment of the action: anywhere in it, or (half the time) near its end,
        where the swap or the unlinks happen."""
        est = statistics.median(self.durations[-5:]) if self.durations else 0.2
        if self.rng.random() < 0.5:
            return self.rng.uniform(0.0, est)
        return est * self.rng.uniform(0.6, 1.0)

    SCHEDULE = ("early", "timed", "early", "at", "early", "phase", "complete")
    """What each cycle after the first two (which run to completion, timing the action)
    does: ``early`` kills at one of the first storage calls of the commit phase, in the
    order of :attr:`EARLY`; ``phase`` at a random call of the commit phase; ``at`` at a
    random call of the whole action; ``timed`` after a random delay; ``complete`` lets it
    finish (which keeps the timings current and the log from growing without bound)."""

    EARLY = (4, 5, 2, 6, 3, 7, 1, 8)
    """Calls of the commit phase, most telling first. It starts with a durable write of the
    decision (``write_atomic``: 1 fsync of the temporary file, 2 rename, 3 fsync of the
    directory), then 4 is the first shared-state update (compaction: the layout made odd;
    retention: the new LWM published), 5 and on the renames or unlinks."""

    def _kill_during_action(self, name: str) -> None:
        """Run the action in a child and SIGKILL it per :attr:`SCHEDULE`."""
        fig = self.figures
        kind = "complete"
        if len(self.durations) >= 2:
            kind = self.SCHEDULE[self.scheduled % len(self.SCHEDULE)]
            self.scheduled += 1
        crash_at = crash_after_phase = None
        if kind == "at":
            crash_at = self.rng.randint(1, max(1, self.calls[-1]))
        elif kind == "early":
            crash_after_phase = self.EARLY[self.early % len(self.EARLY)]
            self.early += 1
        elif kind == "phase":
            crash_after_phase = self.rng.randint(1, max(1, self.phase_calls[-1] + 2))
        calibrating = kind == "complete"
        child = Child(
            self.action,
            {
                "data": str(self.data),
                "topic": self.topic,
                "crash_at": crash_at,
                "crash_after_phase": crash_after_phase,
            },
            self.out_dir,
            name,
        )
        child.wait_for_line("C")
        if calibrating or crash_at is not None or crash_after_phase is not None:
            rc = child.wait(READY_TIMEOUT_S)
        else:
            time.sleep(self._delay())
            rc = child.kill()
        done = [line for line in child.lines() if line.startswith("D ")]
        if done:
            _, secs, calls, phase_calls = done[0].split()
            self.durations.append(float(secs))
            self.calls.append(int(calls))
            self.phase_calls.append(int(phase_calls))
            self.completed += 1
        if rc == -signal.SIGKILL:
            fig.kills += 1
            if crash_at is not None or crash_after_phase is not None:
                fig.crash_at_kills += 1
            phase = self._phase_after_kill()
            fig.phases[phase] = fig.phases.get(phase, 0) + 1
        elif rc == 0:
            fig.clean_exits += 1
        else:
            fig.anomaly("child_errors", f"{name} exited {rc}: {child.stderr_tail()}")

    def _layouts(self) -> list[int]:
        """The ``layout`` field of each partition's shared state, read straight from the
        file (odd: a segment change was under way when the process died)."""
        out = []
        for p in range(self.partitions):
            raw = (self.data / "topics" / self.topic / str(p) / "state").read_bytes()
            out.append(int.from_bytes(raw[48:56], "little", signed=True))
        return out

    def _torn(self) -> bool:
        """Whether a partition's state seqlock was left odd (killed inside a state write)."""
        return any(
            int.from_bytes(
                (self.data / "topics" / self.topic / str(p) / "state").read_bytes()[:4], "little"
            )
            & 1
            for p in range(self.partitions)
        )

    def _phase_after_kill(self) -> str:
        raise NotImplementedError

    def _reopen(self, how: str | None = None) -> tuple[Any, bool]:
        """Reopen after the kill in one of three ways: read first, append first, or after a
        simulated reboot; returns the store and whether records were appended."""
        fig = self.figures
        how = how or ("read", "append", "reboot")[fig.cycles % 3]
        if how == "reboot":
            drop_state_files(self.data, self.topic)
            fig.reboots += 1
        started = time.perf_counter()
        store = LogStore(self.data)
        if how == "append":
            for p in range(self.partitions):
                self._append(store, p, self._fresh_records(5))
        else:
            for p in range(self.partitions):
                store.partition(self.topic, p)
        elapsed = (time.perf_counter() - started) * 1000
        (fig.reboot_recovery_ms if how == "reboot" else fig.recovery_ms).append(elapsed)
        return store, how == "append"

    def _fresh_records(self, n: int) -> list[tuple[bytes | None, bytes | None, int | None]]:
        raise NotImplementedError

    def _check_common(self, store: Any, p: int, lwm: int, hwm: int) -> list[Any] | None:
        """Read ``[lwm, hwm)`` and check every record is one that was written, at its
        offset; returns the records (``None`` if the read failed)."""
        fig = self.figures
        try:
            records = read_all(store, self.topic, p, lwm, hwm)
        except Exception as exc:
            fig.anomaly("corrupt", f"p{p}: read failed after the kill: {exc!r}")
            return None
        last = -1
        for r in records:
            if r.offset <= last:
                fig.anomaly("corrupt", f"p{p}: offset {r.offset} after {last}")
            last = r.offset
            if self.written[p].get(r.offset) != (r.key, r.value):
                fig.anomaly(
                    "wrong_content",
                    f"p{p}: offset {r.offset} holds {r.key!r} which was not written there",
                )
        fig.records_in_log += len(records)
        return records


class CompactionCrashLoop(_MaintenanceCrashLoop):
    """``kill -9`` of a process in the middle of ``LogStore.compact``, cycle after cycle.

    A compacted topic with small segments; each cycle appends a few thousand keyed records
    (some tombstones dated older than ``delete_retention_ms``), rolls, appends a few more to
    the active segment, starts a compacting child and kills it per
    :attr:`_MaintenanceCrashLoop.SCHEDULE` (at each early step of the journal and the swap
    in turn, at random storage calls, after random delays). After reopening (read first, append first, or after a simulated reboot) the log must be
    readable, ``verify`` clean, and equal to a compacted-or-uncompacted view of what was
    written: every record present is one that was written, at its original offset; the last
    record of every key is present (a tombstone may be gone, but then so is every older
    record of its key); nothing at or after the start of the active segment (outside the
    cleanable range) is lost.
    """

    action = "compact"

    def __init__(
        self,
        root: Path,
        *,
        seed: int,
        partitions: int = 2,
        keys: int = 800,
        per_cycle: int = 3000,
        segment_bytes: int = 16 * 1024,
    ) -> None:
        super().__init__(root, seed=seed, partitions=partitions)
        self.keys = keys
        self.per_cycle = per_cycle
        self.topic = "compacted"
        self.seq = 0
        with LogStore(self.data) as store:
            store.create_topic(
                self.topic,
                partitions,
                {
                    "cleanup_policy": "compact",
                    "segment_bytes": segment_bytes,
                    "min_compaction_lag_ms": 0,
                    "retention_ms": -1,
                },
            )

    def _phase_after_kill(self) -> str:
        dirs = [self.data / "topics" / self.topic / str(p) for p in range(self.partitions)]
        if self._torn():
            return "inside a state write (seqlock left odd)"
        if any(layout & 1 for layout in self._layouts()):
            return "mid-swap (layout odd)"
        if any((d / "cleaner-journal").exists() for d in dirs):
            return "journal written, layout even (before or after the swap)"
        if any(True for d in dirs for _ in d.glob("*.cleaned")):
            return "writing cleaned segments"
        return "scanning, or between partitions"

    def _fresh_records(self, n: int) -> list[tuple[bytes | None, bytes | None, int | None]]:
        now = int(time.time() * 1000)
        out: list[tuple[bytes | None, bytes | None, int | None]] = []
        for _ in range(n):
            key = b"key-%05d" % self.rng.randrange(self.keys)
            self.seq += 1
            if self.rng.random() < 0.05:
                out.append((key, None, now - 3 * 86_400_000))  # tombstone, past its retention
            else:
                out.append((key, make_value("c", self.seq, self.rng.randint(10, 150)), None))
        return out

    def run(self, cycles: int, progress: Any = None) -> CrashFigures:
        for i in range(cycles):
            marks, active = self._load_cycle()
            self.figures.cycles += 1
            self._kill_during_action(f"compact-{i}")
            store, _ = self._reopen()
            try:
                self._check(store, marks, active)
            finally:
                store.close()
            if progress is not None:
                progress(i + 1, self.figures)
        self._final_compaction()
        return self.figures

    def _load_cycle(self) -> tuple[list[Any], list[int]]:
        """Append a cycle's records, roll, append a few more; the marks and active bases."""
        with LogStore(self.data) as store:
            for p in range(self.partitions):
                left = self.per_cycle // self.partitions
                while left:
                    n = min(left, self.rng.randint(50, 400))
                    self._append(store, p, self._fresh_records(n))
                    left -= n
                store.partition(self.topic, p).roll()
                self._append(store, p, self._fresh_records(self.rng.randint(1, 50)))
            marks = [store.offsets(self.topic, p) for p in range(self.partitions)]
            active = [
                store.partition(self.topic, p).offsets().active_base for p in range(self.partitions)
            ]
        return marks, active

    FIRST_CLEANED = f"{0:020d}.log.cleaned"
    BACK_TO_BACK: tuple[dict[str, Any], ...] = (
        {"crash_on": f"unlink:{JOURNAL_NAME}", "reopen": "read"},
        {"crash_on": f"fsync:{FIRST_CLEANED}", "reopen": "reboot"},
    )
    """Two compactions killed in a row, then a simulated reboot: the first dies after its
    swap but before it removes its journal, the second while writing its first cleaned
    segment (with other groups: the old segments shrank). A recovery must not replay the
    first run's journal over the second run's files."""

    def run_sequence(self, steps: tuple[dict[str, Any], ...]) -> CrashFigures:
        """Compact once, then run ``steps`` in order: each (unless ``load`` is false) appends
        a cycle's records, runs a compacting child (killed per ``crash_on``, else it must
        complete) and, if ``reopen`` says how, reopens and checks the log."""
        fig = self.figures
        self._load_cycle()
        with LogStore(self.data) as store:  # compacted once: the old segments are small now
            store.compact(self.topic)
        marks: list[Any] = []
        active: list[int] = []
        for step in steps:
            if step.get("load", True):
                marks, active = self._load_cycle()
            fig.cycles += 1
            args = {"data": str(self.data), "topic": self.topic, "crash_on": step.get("crash_on")}
            child = Child(self.action, args, self.out_dir, f"sequence-{fig.cycles}")
            child.wait_for_line("C")
            rc = child.wait(READY_TIMEOUT_S)
            if rc != (-signal.SIGKILL if step.get("crash_on") else 0):
                fig.anomaly("child_errors", f"{child.name} exited {rc}: {child.stderr_tail()}")
            if rc == -signal.SIGKILL:
                fig.kills += 1
                phase = self._phase_after_kill()
                fig.phases[phase] = fig.phases.get(phase, 0) + 1
            else:
                fig.clean_exits += 1
            if step.get("reopen"):
                store, _ = self._reopen(how=step["reopen"])
                try:
                    self._check(store, marks, active)
                finally:
                    store.close()
        self._final_compaction()
        return fig

    def run_dead_swap_then_clean(self) -> CrashFigures:
        """A compaction dies halfway through its swap (a segment renamed, the ones it
        replaces still there, the layout odd) while another process that already had the
        partition open waits to compact it; that one then compacts before anything else
        touched the partition, and must finish the dead swap first, not trip over it."""
        fig = self.figures
        self._load_cycle()
        with LogStore(self.data) as store:  # compacted once: the old segments are small now
            store.compact(self.topic)
        marks, active = self._load_cycle()
        go = self.root / "go"
        waiting = Child(
            self.action,
            {"data": str(self.data), "topic": self.topic, "go": str(go)},
            self.out_dir,
            "waiting-cleaner",
        )
        waiting.wait_for_line("R")
        dying = Child(
            self.action,
            {
                "data": str(self.data),
                "topic": self.topic,
                "crash_on": f"replace:{0:020d}.timeindex.cleaned",
            },
            self.out_dir,
            "dying-cleaner",
        )
        fig.cycles += 2
        for child, want in ((dying, -signal.SIGKILL), (waiting, 0)):
            if child is waiting:
                phase = self._phase_after_kill()
                fig.phases[phase] = fig.phases.get(phase, 0) + 1
                go.touch()
            rc = child.wait(READY_TIMEOUT_S)
            if rc != want:
                fig.anomaly("child_errors", f"{child.name} exited {rc}: {child.stderr_tail()}")
        fig.kills += 1
        fig.clean_exits += 1
        store, _ = self._reopen(how="read")
        try:
            self._check(store, marks, active)
        finally:
            store.close()
        self._final_compaction()
        return fig

    def _check(self, store: Any, marks: list[Any], active: list[int]) -> None:
        fig = self.figures
        for problem in store.verify(self.topic):
            fig.anomaly("corrupt", f"verify: {problem}")
        for p in range(self.partitions):
            lwm, hwm, leo = store.offsets(self.topic, p)
            if hwm != leo or hwm < marks[p].hwm or lwm != marks[p].lwm:
                fig.anomaly("corrupt", f"p{p}: marks {lwm}/{hwm}/{leo} before {marks[p]}")
            records = self._check_common(store, p, lwm, hwm)
            if records is None:
                continue
            present = {r.offset for r in records}
            present_keys = {r.key for r in records}
            latest: dict[bytes | None, int] = {}
            for offset, (key, _) in sorted(self.written[p].items()):
                latest[key] = offset
            for key, offset in latest.items():
                if offset in present:
                    continue
                if self.written[p][offset][1] is not None:
                    fig.anomaly(
                        "lost", f"p{p}: the last record of {key!r} (offset {offset}) is gone"
                    )
                elif key in present_keys:
                    fig.anomaly(
                        "lost",
                        f"p{p}: tombstone of {key!r} gone but an older "
                        "record of the key survived (a resurrected key)",
                    )
            for offset in self.written[p]:
                if offset >= active[p] and offset not in present:
                    fig.anomaly(
                        "lost", f"p{p}: offset {offset} outside the cleanable range is gone"
                    )

    def _final_compaction(self) -> None:
        """An uninterrupted compaction after all the kills completes and compacts fully."""
        with LogStore(self.data) as store:
            for p in range(self.partitions):
                store.partition(self.topic, p).roll()
            active = [
                store.partition(self.topic, p).offsets().active_base for p in range(self.partitions)
            ]
            store.compact(self.topic)
            for problem in store.verify(self.topic):
                self.figures.anomaly("corrupt", f"verify after the final compaction: {problem}")
            for p in range(self.partitions):
                lwm, hwm, _ = store.offsets(self.topic, p)
                records = self._check_common(store, p, lwm, hwm) or []
                keys = [r.key for r in records if r.offset < active[p]]
                if len(keys) != len(set(keys)):
                    self.figures.anomaly(
                        "duplicated",
                        f"p{p}: a key kept twice in the cleaned range after a full compaction",
                    )
                latest = {}
                for offset, (key, _) in sorted(self.written[p].items()):
                    if offset < active[p]:
                        latest[key] = offset
                want = {o for o in latest.values() if self.written[p][o][1] is not None}
                have = {r.offset for r in records if r.offset < active[p]}
                if not want <= have or not have <= set(latest.values()):
                    self.figures.anomaly(
                        "wrong_content",
                        f"p{p}: fully compacted range has "
                        f"{len(have)} records, expected {len(want)}",
                    )


class RetentionCrashLoop(_MaintenanceCrashLoop):
    """``kill -9`` of a process in the middle of ``LogStore.cleanup`` (retention by size).

    Each cycle appends enough small segments that retention deletes dozens of them, then
    kills a cleaning child per :attr:`_MaintenanceCrashLoop.SCHEDULE`. After reopening: ``verify`` clean, the LWM is
    between the old one and the one retention was heading for, the HWM unchanged (or grown
    by our own appends), every record in ``[lwm, hwm)`` readable and the one written at that
    offset, reading below the LWM an out-of-range error, and appends continue.
    """

    action = "cleanup"

    def __init__(
        self,
        root: Path,
        *,
        seed: int,
        partitions: int = 2,
        segment_bytes: int = 8192,
        retention_bytes: int = 40_000,
        per_cycle_bytes: int = 200_000,
    ) -> None:
        super().__init__(root, seed=seed, partitions=partitions)
        self.topic = "retained"
        self.per_cycle_bytes = per_cycle_bytes
        self.retention_bytes = retention_bytes
        self.seq = 0
        with LogStore(self.data) as store:
            store.create_topic(
                self.topic,
                partitions,
                {
                    "cleanup_policy": "delete",
                    "segment_bytes": segment_bytes,
                    "retention_bytes": retention_bytes,
                    "retention_ms": -1,
                },
            )

    def _phase_after_kill(self) -> str:
        if self._torn():
            return "inside a state write (seqlock left odd)"
        for p in range(self.partitions):
            d = self.data / "topics" / self.topic / str(p)
            raw = (d / "state").read_bytes()
            lwm = int.from_bytes(raw[8:16], "little", signed=True)
            lso = d / "log-start-offset"
            if lso.exists() and int(lso.read_text()) > lwm:
                return "new LWM written, not yet published"
            bases = list_segment_bases(d)
            if len(bases) > 1 and bases[1] <= lwm:
                return "LWM published, segments being unlinked"
        return "planning, or between partitions"

    def _fresh_records(self, n: int) -> list[tuple[bytes | None, bytes | None, int | None]]:
        out: list[tuple[bytes | None, bytes | None, int | None]] = []
        for _ in range(n):
            self.seq += 1
            out.append(
                (b"r%d" % self.seq, make_value("r", self.seq, self.rng.randint(20, 200)), None)
            )
        return out

    def run(self, cycles: int, progress: Any = None) -> CrashFigures:
        fig = self.figures
        for i in range(cycles):
            with LogStore(self.data) as store:
                for p in range(self.partitions):
                    written = 0
                    while written < self.per_cycle_bytes:
                        records = self._fresh_records(self.rng.randint(10, 60))
                        self._append(store, p, records)
                        written += sum(len(v or b"") + 40 for _, v, _ in records)
                marks = [store.offsets(self.topic, p) for p in range(self.partitions)]
            fig.cycles += 1
            self._kill_during_action(f"cleanup-{i}")
            store, _ = self._reopen()
            try:
                for problem in store.verify(self.topic):
                    fig.anomaly("corrupt", f"verify: {problem}")
                for p in range(self.partitions):
                    lwm, hwm, leo = store.offsets(self.topic, p)
                    if hwm != leo or hwm < marks[p].hwm or lwm < marks[p].lwm or lwm > hwm:
                        fig.anomaly("corrupt", f"p{p}: marks {lwm}/{hwm}/{leo} before {marks[p]}")
                    records = self._check_common(store, p, lwm, hwm)
                    if records is not None and [r.offset for r in records] != list(range(lwm, hwm)):
                        fig.anomaly("lost", f"p{p}: records of [{lwm}, {hwm}) missing")
                    if lwm > 0:
                        try:
                            store.read(self.topic, p, lwm - 1)
                            fig.anomaly("corrupt", f"p{p}: read below the LWM succeeded")
                        except OffsetOutOfRangeError:
                            pass
                    for offset in [o for o in self.written[p] if o < lwm]:
                        del self.written[p][offset]  # gone by retention, as it should
            finally:
                store.close()
            if progress is not None:
                progress(i + 1, fig)
        self._final_cleanup()
        return fig

    def _final_cleanup(self) -> None:
        """An uninterrupted cleanup leaves no segment file below the LWM and the size bound."""
        with LogStore(self.data) as store:
            store.cleanup(self.topic)
            for problem in store.verify(self.topic):
                self.figures.anomaly("corrupt", f"verify after the final cleanup: {problem}")
            for p in range(self.partitions):
                lwm, hwm, _ = store.offsets(self.topic, p)
                segments = store.partition(self.topic, p).segments()
                if segments[0].base != lwm:
                    self.figures.anomaly(
                        "corrupt", f"p{p}: first segment {segments[0].base} is not the LWM {lwm}"
                    )
                self._check_common(store, p, lwm, hwm)


def main(argv: list[str]) -> None:
    role, raw = argv[1], argv[2]
    ROLES[role](json.loads(raw))


if __name__ == "__main__":
    main(sys.argv)
