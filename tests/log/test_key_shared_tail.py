"""Several stores appending to one partition's keys, against a list model (Hypothesis).

Each :class:`LogStore` here has its own key index object, SQLite connection and lock
descriptors, as a process has (flocks of two descriptors exclude each other as two processes'
do): the machine interleaves, step by step, conditional appends (right and stale), plain
keyed appends, the flusher's write of held rows, an emptied index file and reads, across
three stores. An appender reads the records the others appended since its last look from
the log into its cache and its held rows (*Shared tail* in
:mod:`framework.log.embedded.key_index`); a wrong count there is a lost update or a
misnumbered version, which the model sees at once.

Model: the log as a list of keys, one per offset. After every step: every store's
``key_head`` of every key is the model's last offset of it, and every store's view of a key
(its rows, held ones included) lists the model's offsets of it, numbered 1, 2, 3...; at
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

from framework.errors import ConcurrencyError
from framework.log import Expect, LogStore

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

    @initialize()
    def create(self) -> None:
        self.stores[0].create_topic("t", 1, {"flush_policy": "always"})

    def last(self, key: bytes) -> int | None:
        offsets = [o for o, k in enumerate(self.log) if k == key]
        return offsets[-1] if offsets else None

    @rule(i=stores, key=keys, stale=st.integers(0, 3))
    def conditional(self, i: int, key: bytes, stale: int) -> None:
        """``stale`` > 0: expect an earlier record of the key (or none), when it has one."""
        offsets = [o for o, k in enumerate(self.log) if k == key]
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

    @invariant()
    def heads_and_views_are_the_models(self) -> None:
        if not self.log:
            return
        for i, store in enumerate(self.stores):
            index = store.keys.index("t", 0)
            for key in KEYS:
                offsets = [o for o, k in enumerate(self.log) if k == key]
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
                max_examples=40,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    contradictions = [r.getMessage() for r in caplog.records if "contradicts" in str(r.__dict__)]
    assert not contradictions, contradictions
