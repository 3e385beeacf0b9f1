"""The log against a plain-list model: a Hypothesis stateful test (brief section 3).

The machine drives a real :class:`LogStore` on a temporary directory with a fake clock, tiny
segments and a tiny index interval, through appends (single and batch; keyed, keyless,
tombstones, headers, explicit and out-of-order CreateTime, LogAppendTime), rolls, clock
moves, retention, compaction, reopen, and simulated crashes (a torn or garbage tail written
past the end of the active segment, with or without the ``state`` file). A model of the same
log is kept in plain lists: segments of batches of records, with byte sizes computed from the
documented format (``eventlane/log/embedded/batch.py``), so the model knows where segments roll and
what size retention sees, without calling engine code.

After every step: ``lwm <= hwm <= leo`` and all three equal the model's; the segments on disk
are the model's (bases, and sizes of closed segments); reading everything from the LWM (with
a cursor and a small ``max_bytes``) returns exactly the model's records; ``verify()`` is clean.

Also per-key state (``key_head``/``read_key`` and ``expect=`` appends, right and stale),
atomic appends and DeleteRecords. The default suite runs >= 1,000 steps; ``pytest -m soak``
runs ``EVENTLANE_SOAK_STEPS`` (default 100,000).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from eventlane.errors import ConcurrencyError, InvalidRecordError, OffsetOutOfRangeError
from eventlane.log import Expect, LogStore
from eventlane.log.embedded.batch import encode_batch  # only to forge a torn write's bytes
from eventlane.log.record import Record

T0 = 1_700_000_000_000
SEGMENT_BYTES = 360
INDEX_INTERVAL = 90
BATCH_HEADER = 43

TOPICS: dict[str, dict[str, object]] = {
    # delete policy, CreateTime, time and size retention, keyless records allowed
    "del": {"cleanup_policy": "delete", "retention_ms": 45_000, "retention_bytes": 700},
    # compaction with a min lag and a tombstone retention
    "cmp": {
        "cleanup_policy": "compact",
        "min_compaction_lag_ms": 10_000,
        "delete_retention_ms": 30_000,
        "retention_ms": -1,
    },
    # the log sets timestamps; both compaction and time retention
    "lat": {
        "cleanup_policy": "compact,delete",
        "timestamp_type": "LogAppendTime",
        "retention_ms": 70_000,
        "delete_retention_ms": 10_000,
    },
}
for _cfg in TOPICS.values():
    _cfg.update(segment_bytes=SEGMENT_BYTES, index_interval_bytes=INDEX_INTERVAL, segment_ms=10**15)


# ------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class MRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    @property
    def size(self) -> int:
        """Bytes of this record in a batch (format in eventlane/log/embedded/batch.py)."""
        n = 4 + 4 + 8 + 4 + (len(self.key) if self.key is not None else 0)
        n += 4 + (len(self.value) if self.value is not None else 0) + 4
        for name, value in self.headers:
            n += 4 + len(name.encode()) + 4 + (len(value) if value is not None else 0)
        return n


@dataclass
class MBatch:
    base_offset: int
    records: list[MRecord]

    @property
    def size(self) -> int:
        return BATCH_HEADER + sum(r.size for r in self.records)


@dataclass
class MSegment:
    base: int
    batches: list[MBatch] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(b.size for b in self.batches)

    @property
    def max_timestamp(self) -> int:
        return max((r.timestamp for b in self.batches for r in b.records), default=-1)

    def records(self) -> list[MRecord]:
        return [r for b in self.batches for r in b.records]


class ModelLog:
    """One partition as plain lists, following the documented rules of brief section 2."""

    def __init__(self, config: dict[str, object]) -> None:
        self.config = config
        self.segments = [MSegment(0)]
        self.lwm = 0
        self.leo = 0
        self.written: dict[bytes | None, set[int]] = {}
        """Every offset ever appended per key (what a key's head may name below the LWM)."""
        self.first_seen: list[tuple[int, int]] = []
        """(end offset, when a compaction pass first covered the offsets below it)."""

    @property
    def policy(self) -> str:
        return str(self.config["cleanup_policy"])

    @property
    def log_append_time(self) -> bool:
        return self.config.get("timestamp_type") == "LogAppendTime"

    def records(self) -> list[MRecord]:
        return [r for s in self.segments for r in s.records() if r.offset >= self.lwm]

    def roll(self) -> None:
        if self.segments[-1].size > 0:
            self.segments.append(MSegment(self.leo))

    def append(self, records: list[tuple[Any, ...]], now: int) -> tuple[int, int, list[int]]:
        stamped = [
            MRecord(self.leo + i, now if (self.log_append_time or ts is None) else ts, k, v, h)
            for i, (k, v, h, ts) in enumerate(records)
        ]
        batch = MBatch(self.leo, stamped)
        if self.segments[-1].size > 0 and self.segments[-1].size + batch.size > SEGMENT_BYTES:
            self.roll()
        self.segments[-1].batches.append(batch)
        for r in stamped:
            self.written.setdefault(r.key, set()).add(r.offset)
        base = self.leo
        self.leo += len(records)
        return base, self.leo - 1, [r.timestamp for r in stamped]

    def retention(self, now: int) -> None:
        if "delete" not in self.policy:
            return
        retention_ms = int(self.config.get("retention_ms", 7 * 86_400_000))  # type: ignore[call-overload]
        retention_bytes = int(self.config.get("retention_bytes", -1))  # type: ignore[call-overload]
        if retention_ms < 0 and retention_bytes < 0:
            return
        active = self.segments[-1]
        if retention_ms >= 0 and active.size > 0 and active.max_timestamp < now - retention_ms:
            self.roll()
        closed = self.segments[:-1]
        total = sum(s.size for s in self.segments)
        count = 0
        for seg in closed:
            # stateful timestamps are never in the future, so no mtime fallback applies
            expired = retention_ms >= 0 and seg.max_timestamp < now - retention_ms
            if not expired and retention_bytes >= 0:
                expired = total - seg.size >= retention_bytes
            if not expired:
                break
            total -= seg.size
            count += 1
        if count:
            self.segments = self.segments[count:]
            self.lwm = max(self.lwm, self.segments[0].base)

    def compact(self, now: int) -> None:
        if "compact" not in self.policy:
            return
        lag = int(self.config.get("min_compaction_lag_ms", 0))  # type: ignore[call-overload]
        delete_retention = int(self.config.get("delete_retention_ms", 86_400_000))  # type: ignore[call-overload]
        cleanable: list[MSegment] = []
        for seg in self.segments[:-1]:
            if lag > 0 and seg.max_timestamp > now - lag:
                break
            cleanable.append(seg)
        if not cleanable:
            return
        last: dict[bytes, int] = {}
        for seg in cleanable:
            for r in seg.records():
                assert r.key is not None
                last[r.key] = r.offset
        # Tombstones expire by the log's clock: delete_retention_ms after a pass first saw them.
        end = self.segments[len(cleanable)].base
        if not self.first_seen or self.first_seen[-1][0] < end:
            self.first_seen.append((end, now))
        horizon = max((e for e, at in self.first_seen if at + delete_retention <= now), default=-1)
        groups: list[list[MSegment]] = []
        size = 0
        for seg in cleanable:
            if groups and size + seg.size <= SEGMENT_BYTES:
                groups[-1].append(seg)
                size += seg.size
            else:
                groups.append([seg])
                size = seg.size
        cleaned: list[MSegment] = []
        for group in groups:
            out = MSegment(group[0].base)
            for seg in group:
                for batch in seg.batches:
                    kept = [
                        r
                        for r in batch.records
                        if last[r.key] == r.offset  # type: ignore[index]
                        and not (r.value is None and r.offset < horizon)
                    ]
                    if kept:
                        out.batches.append(MBatch(batch.base_offset, kept))
            cleaned.append(out)
        self.segments = cleaned + self.segments[len(cleanable) :]

    def delete_records(self, before: int) -> None:
        """Kafka's DeleteRecords: the LWM moves to ``before``; segments wholly below go."""
        if before <= self.lwm:
            return
        self.lwm = before
        bases = [s.base for s in self.segments[1:]]
        self.segments = [
            s for s, nxt in zip(self.segments, [*bases, None]) if nxt is None or nxt > before
        ]

    def key_records(self, key: bytes, after: int | None) -> list[MRecord]:
        return [r for r in self.records() if r.key == key and (after is None or r.offset > after)]

    def offset_for_time(self, target: int) -> int | None:
        for r in self.records():
            if r.timestamp >= target:
                return r.offset
        return None


# ------------------------------------------------------------------------------ strategies

KEYS = [b"a", b"b", b"c", b"", b"k" * 20, b"k" * 21]
keys = st.sampled_from(KEYS)
values = st.none() | st.binary(max_size=30)
header_lists = st.lists(
    st.tuples(st.sampled_from(["h", "trace-id", "ü"]), st.none() | st.binary(max_size=8)),
    max_size=2,
).map(tuple)
ts_deltas = st.none() | st.integers(min_value=0, max_value=100_000)
record_specs = st.tuples(st.none() | keys, values, header_lists, ts_deltas)


def as_tuple(r: Record) -> tuple[Any, ...]:
    return (r.offset, r.timestamp, r.key, r.value, r.headers)


def m_tuple(r: MRecord) -> tuple[Any, ...]:
    return (r.offset, r.timestamp, r.key, r.value, r.headers)


# ------------------------------------------------------------------------------ the machine


class LogMachine(RuleBasedStateMachine):
    """A LogStore and its model, stepped together; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="eventlane-stateful-"))
        self.steps = -1  # the invariants run once after the initialisation too
        self.now = T0
        self.store = LogStore(self.tmp, clock=lambda: self.now)
        self.models: dict[str, ModelLog] = {}
        # a tailing reader per topic: (next offset, cursor)
        self.tails: dict[str, tuple[int, Any]] = {}
        # torn bytes written past the active segment and not yet truncated by the engine
        self.dirty_tail: set[str] = set()

    @initialize()
    def create_topics(self) -> None:
        for name, cfg in TOPICS.items():
            self.store.create_topic(name, 1, cfg)
            self.models[name] = ModelLog(cfg)
            self.tails[name] = (0, None)

    def teardown(self) -> None:
        STEPS[0] += max(self.steps, 0)
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _partition_dir(self, topic: str) -> Path:
        return self.tmp / "topics" / topic / "0"

    # -------------------------------------------------------------------- appends
    @rule(
        topic=st.sampled_from(sorted(TOPICS)),
        specs=st.lists(record_specs, min_size=1, max_size=5),
        atomic=st.booleans(),
    )
    def append(self, topic: str, specs: list[tuple[Any, ...]], atomic: bool) -> None:
        self._append(topic, specs, atomic=atomic)

    @rule(
        topic=st.sampled_from(sorted(TOPICS)),
        key=st.sampled_from([k for k in KEYS if k]),
        value=values,
        stale=st.booleans(),
    )
    def conditional_append(self, topic: str, key: bytes, value: bytes | None, stale: bool) -> None:
        """``expect=`` against the model's head of the key: refused (nothing written) when
        the expected offset is not the head, appended when it is."""
        model = self.models[topic]
        records = model.key_records(key, None)
        head = records[-1].offset if records else None
        # (a key whose records all lie below the LWM has no head: None, see the port)
        if stale:
            wrong = (head - 1 if head else None) if head is not None else model.leo
            before = self.store.offsets(topic, 0)
            with pytest.raises(ConcurrencyError):
                self.store.append(topic, 0, [(key, value, (), None)], expect=Expect(key, wrong))
            assert self.store.offsets(topic, 0) == before
            return
        self._append(topic, [(key, value, (), None)], expect=Expect(key, head))

    @rule(
        topic=st.sampled_from(sorted(TOPICS)),
        calls=st.lists(st.lists(record_specs, min_size=1, max_size=3), min_size=2, max_size=8),
    )
    def append_several(self, topic: str, calls: list[list[tuple[Any, ...]]]) -> None:
        """Several appends in a row (single records and small batches): fills segments."""
        for specs in calls:
            self._append(topic, specs)

    def _append(
        self,
        topic: str,
        specs: list[tuple[Any, ...]],
        *,
        atomic: bool = False,
        expect: Expect | None = None,
    ) -> None:
        model = self.models[topic]
        records = []
        for key, value, headers, delta in specs:
            if key is None and "compact" in model.policy:
                key = b"z"  # noqa: PLW2901 - keyless records are refused there (own rule)
            records.append((key, value, headers, None if delta is None else self.now - delta))
        result = self.store.append(topic, 0, records, atomic=atomic, expect=expect)
        base, last, timestamps = model.append(records, self.now)
        assert (result.base_offset, result.last_offset) == (base, last)
        assert list(result.timestamps) == timestamps
        self.dirty_tail.discard(topic)

    @rule(
        topic=st.sampled_from(["cmp", "lat"]), specs=st.lists(record_specs, min_size=1, max_size=3)
    )
    def append_keyless_to_compacted(self, topic: str, specs: list[tuple[Any, ...]]) -> None:
        records = [(k, v, h, None) for k, v, h, _ in specs]
        records[-1] = (None, *records[-1][1:])
        before = self.store.offsets(topic, 0)
        with pytest.raises(InvalidRecordError):
            self.store.append(topic, 0, records)
        assert self.store.offsets(topic, 0) == before

    # -------------------------------------------------------------------- time and maintenance
    @rule(ms=st.sampled_from([1_000, 6_000, 12_000, 30_000]) | st.integers(0, 40_000))
    def advance_clock(self, ms: int) -> None:
        self.now += ms

    @rule(topic=st.sampled_from(sorted(TOPICS)))
    def roll(self, topic: str) -> None:
        self.store.partition(topic, 0).roll()
        self.models[topic].roll()
        self.dirty_tail.discard(topic)

    @rule(topic=st.sampled_from(sorted(TOPICS)))
    def retention(self, topic: str) -> None:
        self.store.cleanup(topic)
        model = self.models[topic]
        before = len(model.segments)
        model.retention(self.now)
        if len(model.segments) != before:
            self.dirty_tail.discard(topic)  # a roll took the lock and truncated

    @rule(topic=st.sampled_from(sorted(TOPICS)))
    def compaction(self, topic: str) -> None:
        self.store.compact(topic)
        self.models[topic].compact(self.now)

    @rule(topic=st.sampled_from(sorted(TOPICS)), data=st.data())
    def delete_records(self, topic: str, data: st.DataObject) -> None:
        model = self.models[topic]
        before = data.draw(st.integers(model.lwm - 2, model.leo + 2), label="before")
        if before < 0 or before > model.leo:
            with pytest.raises(OffsetOutOfRangeError):
                self.store.delete_records(topic, 0, before)
            return
        assert self.store.delete_records(topic, 0, before) == max(model.lwm, before)
        model.delete_records(before)

    # -------------------------------------------------------------------- restarts and crashes
    def _reopen(self, *, drop_state: frozenset[str] = frozenset()) -> None:
        self.store.close()
        for topic in drop_state:
            (self._partition_dir(topic) / "state").unlink()
        self.store = LogStore(self.tmp, clock=lambda: self.now)
        self.tails = {t: (off, None) for t, (off, _) in self.tails.items()}
        self.dirty_tail.clear()
        for topic in TOPICS:  # opening a partition recovers it / truncates a torn tail
            self.store.offsets(topic, 0)

    @rule()
    def reopen(self) -> None:
        self._reopen()

    @rule(
        topic=st.sampled_from(sorted(TOPICS)),
        kind=st.sampled_from(["partial", "garbage", "whole"]),
        then=st.sampled_from(["reopen", "drop_state", "carry_on"]),
        data=st.data(),
    )
    def torn_tail(self, topic: str, kind: str, then: str, data: st.DataObject) -> None:
        """A writer killed mid-append: bytes past the valid end that were never acknowledged."""
        if kind == "whole" and then == "drop_state":
            kind = "partial"  # a whole valid batch would rightly be recovered without a state
        model = self.models[topic]
        active = model.segments[-1]
        path = self._partition_dir(topic) / f"{active.base:020d}.log"
        assert path.stat().st_size >= active.size
        with path.open("r+b") as f:
            f.truncate(active.size)  # an earlier torn tail may still be there (carry_on)
        if kind == "garbage":
            torn = data.draw(st.binary(min_size=1, max_size=120), label="garbage")
        else:
            n = data.draw(st.integers(1, 4), label="records")
            raw = encode_batch(model.leo, [(b"a", b"x" * 30, (), self.now)] * n)
            cut = (
                len(raw)
                if kind == "whole"
                else data.draw(st.integers(1, len(raw) - 1), label="cut")
            )
            torn = raw[:cut]
        with path.open("ab") as f:
            f.write(torn)
        if then == "carry_on":
            self.dirty_tail.add(topic)
        else:
            self._reopen(drop_state=frozenset([topic]) if then == "drop_state" else frozenset())
            assert path.stat().st_size == active.size, "torn tail not truncated"

    # -------------------------------------------------------------------- reads
    @rule(
        topic=st.sampled_from(sorted(TOPICS)),
        data=st.data(),
        max_bytes=st.sampled_from([1, 60, 200, 1 << 20]),
    )
    def read_from(self, topic: str, data: st.DataObject, max_bytes: int) -> None:
        model = self.models[topic]
        offset = data.draw(st.integers(max(0, model.lwm - 3), model.leo + 3), label="offset")
        if offset < model.lwm or offset > model.leo:
            with pytest.raises(OffsetOutOfRangeError) as info:
                self.store.read(topic, 0, offset, max_bytes=max_bytes)
            assert info.value.offset == offset
            assert (info.value.lwm, info.value.leo) == (model.lwm, model.leo)
            return
        got, _ = self.store.read(topic, 0, offset, max_bytes=max_bytes)
        expected = [m_tuple(r) for r in model.records() if r.offset >= offset]
        assert [as_tuple(r) for r in got] == expected[: len(got)]
        assert bool(got) == bool(expected), "a read must return something when records exist"
        assert all(r.topic == topic and r.partition == 0 for r in got)
        assert all(r.timestamp_type == int(model.log_append_time) for r in got)

    @rule(topic=st.sampled_from(sorted(TOPICS)), max_bytes=st.sampled_from([1, 150, 1 << 20]))
    def tail_read(self, topic: str, max_bytes: int) -> None:
        """A reader that keeps its cursor across steps (layout changes included)."""
        model = self.models[topic]
        offset, cursor = self.tails[topic]
        if offset < model.lwm:
            with pytest.raises(OffsetOutOfRangeError):
                self.store.read(topic, 0, offset, max_bytes=max_bytes, cursor=cursor)
            self.tails[topic] = (model.lwm, None)
            return
        got, cursor = self.store.read(topic, 0, offset, max_bytes=max_bytes, cursor=cursor)
        expected = [m_tuple(r) for r in model.records() if r.offset >= offset]
        assert [as_tuple(r) for r in got] == expected[: len(got)]
        assert bool(got) == bool(expected)
        self.tails[topic] = (got[-1].offset + 1 if got else offset, cursor)

    @rule(
        topic=st.sampled_from(sorted(TOPICS)),
        key=st.sampled_from([k for k in KEYS if k]),
        data=st.data(),
    )
    def key_reads(self, topic: str, key: bytes, data: st.DataObject) -> None:
        model = self.models[topic]
        expected = model.key_records(key, None)
        head = self.store.key_head(topic, 0, key)
        # a key with no record at or above the LWM has no head (the port's key_head)
        assert head == (expected[-1].offset if expected else None)
        after = data.draw(st.none() | st.integers(-1, model.leo), label="after")
        got = self.store.read_key(topic, 0, key, after=after)
        want = [m_tuple(r) for r in model.key_records(key, after)]
        if "compact" not in model.policy:
            assert [as_tuple(r) for r in got] == want
            return
        # the port promises a compacted topic's key reads at least the key's last record
        assert want[-1:] == [as_tuple(r) for r in got][-1:]
        assert {as_tuple(r) for r in got} <= set(want)
        assert [r.offset for r in got] == sorted({r.offset for r in got})

    @rule(topic=st.sampled_from(sorted(TOPICS)), data=st.data())
    def offset_for_time(self, topic: str, data: st.DataObject) -> None:
        model = self.models[topic]
        stamps = [r.timestamp for r in model.records()] or [self.now]
        target = data.draw(
            st.sampled_from(stamps) | st.integers(min(stamps) - 5, max(stamps) + 5),
            label="target",
        )
        assert self.store.offset_for_time(topic, 0, target) == model.offset_for_time(target)

    # -------------------------------------------------------------------- invariants
    @invariant()
    def count_step(self) -> None:
        self.steps += 1

    @invariant()
    def marks_match_model(self) -> None:
        if not self.models:
            return
        for topic, model in self.models.items():
            lwm, hwm, leo = self.store.offsets(topic, 0)
            assert lwm <= hwm <= leo
            assert (lwm, hwm, leo) == (model.lwm, model.leo, model.leo)

    @invariant()
    def segments_match_model(self) -> None:
        for topic, model in self.models.items():
            directory = self._partition_dir(topic)
            on_disk = sorted(p.name for p in directory.glob("*.log"))
            # a segment wholly below the LWM (DeleteRecords moved it past a segment that
            # was active then) may go at any later maintenance or recovery
            model.segments = [
                seg
                for seg, nxt in zip(model.segments, [*model.segments[1:], None], strict=True)
                if nxt is None or nxt.base > model.lwm or f"{seg.base:020d}.log" in on_disk
            ]
            assert on_disk == [f"{s.base:020d}.log" for s in model.segments]
            for seg in model.segments[:-1]:
                assert (directory / f"{seg.base:020d}.log").stat().st_size == seg.size
            if topic not in self.dirty_tail:
                active = model.segments[-1]
                assert (directory / f"{active.base:020d}.log").stat().st_size == active.size

    @invariant()
    def reading_everything_equals_model(self) -> None:
        for topic, model in self.models.items():
            offset, cursor, got = model.lwm, None, []
            while True:
                records, cursor = self.store.read(topic, 0, offset, max_bytes=100, cursor=cursor)
                if not records:
                    break
                assert records[0].offset >= offset
                got.extend(records)
                offset = records[-1].offset + 1
            offsets = [r.offset for r in got]
            assert offsets == sorted(set(offsets)), "offsets must strictly increase"
            assert [as_tuple(r) for r in got] == [m_tuple(r) for r in model.records()]

    @invariant()
    def verify_is_clean(self) -> None:
        if self.models:
            assert self.store.verify() == []


STEPS = [0]
"""Rules run by every machine so far (counted after each step, by the invariant below)."""


def run_machines(examples: int, steps: int) -> int:
    """Run ``examples`` machines of up to ``steps`` steps; the number of steps they ran."""
    before = STEPS[0]
    run_state_machine_as_test(
        LogMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            # the explain phase traces every line of the engine: minutes per failure
            phases=[p for p in Phase if p is not Phase.explain],
        ),
    )
    return STEPS[0] - before


def test_log_against_a_list_model() -> None:
    """The default run: at least 1,000 generated steps (the seconds are printed)."""
    started, steps = time.monotonic(), 0
    for _ in range(4):  # Hypothesis draws each machine's length: 24 x 60 is a maximum, not a count
        steps += run_machines(24, 60)
        if steps >= 1000:
            break
    print(f"log model: {steps} steps in {time.monotonic() - started:.1f} s")
    assert steps >= 1000


@pytest.mark.soak
@pytest.mark.timeout(0)  # bounded by its step count; progress is printed per round
def test_log_against_a_list_model_soak() -> None:
    """``EVENTLANE_SOAK_STEPS`` (default 100,000) steps, in rounds of 25 machines."""
    target = int(os.environ.get("EVENTLANE_SOAK_STEPS", "100000"))
    started, steps, machines = time.monotonic(), 0, 0
    while steps < target:
        steps += run_machines(25, 80)
        machines += 25
        print(
            f"log model soak: {steps} steps, {machines} machines, "
            f"{time.monotonic() - started:.0f} s",
            flush=True,
        )
    assert steps >= target
