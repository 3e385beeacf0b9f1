"""Several stores appending to one partition's keys, against a list model (Hypothesis).

Each :class:`LogStore` here has its own key index object, SQLite connection and lock
descriptors, as a process has (flocks of two descriptors exclude each other as two processes'
do): the machine interleaves, step by step, conditional appends (right and stale), plain
keyed appends, the flusher's write of held rows, an emptied index file, retention followed
by a rebuild (which numbers every key again from the low-water mark) and reads, across
three stores. An appender reads the records the others appended since its last look from
the log into its cache and its held rows (*Shared tail* in
:mod:`eventlane.log.embedded.key_index`); a wrong count there is a lost update or a
misnumbered version, which the model sees at once.

Model: the log as a list of keys, one per offset, and its low-water mark. After every step:
every store's ``key_head`` of every key is the model's last offset of it, and every store's
view of a key (its rows, held ones included) lists the model's offsets of it from the
low-water mark, numbered 1, 2, 3...; at
the end, the index file verifies against the log, and no store ever found it contradicting
the log (an update that contradicts it is logged and the file emptied: never here).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from eventlane.errors import ConcurrencyError
from eventlane.log import Expect, LogStore

STORES = 3
KEYS = [b"k0", b"k1", b"k2", b"k3", b"k4"]
T0 = 1_700_000_000_000

stores = st.integers(0, STORES - 1)
keys = st.sampled_from(KEYS)


class SharedTail(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="eventlane-shared-tail-"))
        # a store with its own clock never hands appends to a relay process: all direct
        self.stores = [LogStore(self.tmp, clock=lambda: T0) for _ in range(STORES)]
        self.log: list[bytes] = []  # the model: the key at each offset
        self.lwm = 0  # retention removed the offsets below it

    @initialize()
    def create(self) -> None:
        self.stores[0].create_topic("t", 1, {"flush_policy": "always"})

    def offsets(self, key: bytes) -> list[int]:
        """The key's offsets the log keeps, numbered 1, 2, 3... by the index (from the
        low-water mark: the machine's retention always comes with a rebuild)."""
        return [o for o, k in enumerate(self.log) if k == key and o >= self.lwm]

    def last(self, key: bytes) -> int | None:
        offsets = self.offsets(key)
        return offsets[-1] if offsets else None

    @rule(i=stores, key=keys, stale=st.integers(0, 3))
    def conditional(self, i: int, key: bytes, stale: int) -> None:
        """``stale`` > 0: expect an earlier record of the key (or none), when it has one."""
        offsets = self.offsets(key)
        expected = self.last(key)
        if stale and offsets:
            earlier = offsets[: max(0, len(offsets) - stale)]
            expected = earlier[-1] if earlier else None
        record = (key, b"v", (), None)
        try:
            got = self.stores[i].append("t", 0, [record], expect=Expect(key, expected), atomic=True)
        except ConcurrencyError as exc:
            assert expected != self.last(key), f"store {i} refused {key!r} at {expected}"
            assert exc.actual == self.last(key)
            return
        assert expected == self.last(key), f"store {i} took {key!r} after {expected}: lost"
        assert got.base_offset == len(self.log)
        self.log.append(key)

    @rule(i=stores, key=keys)
    def plain(self, i: int, key: bytes) -> None:
        got = self.stores[i].append("t", 0, [(key, b"p", (), None)])
        assert got.base_offset == len(self.log)
        self.log.append(key)

    @rule(i=stores)
    def flusher(self, i: int) -> None:
        """What the flusher thread does FLUSH_AFTER_S after a store held its first row."""
        self.stores[i].keys.index("t", 0).flush_held()

    @rule(i=stores)
    def emptied(self, i: int) -> None:
        """The file emptied (as ``eventlane verify --repair`` or a damaged file would)."""
        self.stores[i].keys.index("t", 0).reset("emptied by the test")

    @rule(i=stores, by=st.integers(1, 6))
    def retention_and_rebuild(self, i: int, by: int) -> None:
        """Retention moves the low-water mark, then a rebuild numbers every key's records
        again from there: another numbering than the one the other stores cached."""
        self.lwm = min(len(self.log), self.lwm + by)
        self.stores[i].delete_records("t", 0, self.lwm)
        self.stores[i].keys.index("t", 0).rebuild()  # rebuild_keys may skip one (no appends)

    @invariant()
    def heads_and_views_are_the_models(self) -> None:
        if not self.log:
            return
        for i, store in enumerate(self.stores):
            index = store.keys.index("t", 0)
            for key in KEYS:
                offsets = self.offsets(key)
                assert store.key_head("t", 0, key) == self.last(key), (i, key)
                assert index.view(key).offsets == offsets, (i, key)
                if len(offsets) > 1:  # the numbering: versions 2, 3, ... of the key
                    assert index.view(key, after_seq=1).offsets == offsets[1:], (i, key)

    def teardown(self) -> None:
        try:
            for store in self.stores:
                store.keys.index("t", 0).flush_held()
            reports = self.stores[0].check_keys(["t"])
            assert all(not r.problems for r in reports), reports
        finally:
            for store in self.stores:
                store.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


def test_stores_sharing_a_partitions_keys_match_the_model(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        run_state_machine_as_test(
            SharedTail,
            settings=settings(
                max_examples=120,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    contradictions = [r.getMessage() for r in caplog.records if "contradicts" in str(r.__dict__)]
    assert not contradictions, contradictions


def test_a_rebuild_after_retention_is_the_numbering_every_store_goes_on_from(
    tmp_path: Path,
) -> None:
    """A rebuild numbers each key's records again from the low-water mark: once retention
    removed some, that is another numbering than the one a store's cache holds. A store
    whose view the rebuilt file ends inside must not go on numbering from its cache (seen
    as 'indexed as #11, the log has #10' in a run of tests/log/test_lock_pauses.py)."""
    a, b = LogStore(tmp_path, clock=lambda: T0), LogStore(tmp_path, clock=lambda: T0)
    try:
        a.create_topic("t", 1, {"flush_policy": "always"})

        def conditional(store: LogStore) -> None:
            head = store.key_head("t", 0, b"k")
            store.append("t", 0, [(b"k", b"v", (), None)], expect=Expect(b"k", head))

        for _ in range(3):
            conditional(a)  # a's cache: k #1-#3 at offsets 0-2
        conditional(b)  # #4 at 3
        conditional(a)  # a reads b's record into its cache and holds its row: #5 at 4
        a.delete_records("t", 0, 2)  # offsets 0 and 1 go
        b.rebuild_keys("t", 0)  # the file: k #1-#3 at offsets 2-4, ending where a's view does
        conditional(a)  # offset 5: #4 in the file's numbering
        conditional(b)  # offset 6: #5
        for store in (a, b):
            store.keys.index("t", 0).flush_held()
            assert [r.offset for r in store.read_key("t", 0, b"k")] == [2, 3, 4, 5, 6]
        reports = a.check_keys(["t"])
        assert all(not r.problems for r in reports), reports
        assert b.keys.index("t", 0).view(b"k", after_seq=3).offsets == [5, 6]
        assert a.keys.index("t", 0).view(b"k", after_seq=3).offsets == [5, 6]
    finally:
        a.close()
        b.close()


def test_held_rows_are_not_read_over_a_file_emptied_and_built_again(tmp_path: Path) -> None:
    """A store holding rows reads them over the file only while the file is the one they
    go on from: after a rebuild and an emptying, the file can end where it ended before
    (next_offset 0) and still be another file (the machine's shrunk example)."""
    a, b = LogStore(tmp_path, clock=lambda: T0), LogStore(tmp_path, clock=lambda: T0)

    def look() -> None:  # as the machine's invariant does after every step
        for store in (a, b):
            store.key_head("t", 0, b"k")
            store.keys.index("t", 0).view(b"k")

    try:
        a.create_topic("t", 1, {"flush_policy": "always"})
        a.append("t", 0, [(b"k", b"v", (), None)], expect=Expect(b"k", None))  # offset 0
        look()
        a.keys.index("t", 0).reset("emptied by the test")
        look()
        b.append("t", 0, [(b"k", b"p", (), None)])  # offset 1
        look()
        b.append("t", 0, [(b"k", b"v", (), None)], expect=Expect(b"k", 1))  # 2: b holds rows
        look()
        a.delete_records("t", 0, 1)
        a.keys.index("t", 0).rebuild()  # k #1, #2 at offsets 1, 2
        look()
        a.keys.index("t", 0).reset("emptied by the test")  # next_offset 0 again
        for store in (a, b):
            index = store.keys.index("t", 0)
            assert index.view(b"k").offsets == [1, 2]
            assert index.view(b"k", after_seq=1).offsets == [2]
    finally:
        a.close()
        b.close()
