"""Deliberately broken engines: the real embedded :class:`LogStore` with one promise of the
log port broken each, so that the suite can show the contract kit catches every one
(tests/log/test_contract_kit_proof.py). Also an honest engine with the core role only
(:class:`CoreOnly`, as a plain Kafka adapter), which must pass the core kit.

Each breaks its promise the way a plausible adapter would, not by refusing to work:

* :class:`CheckThenAppend`: ``expect`` checked, then the write done separately (a client of
  a store with no conditional write); the gap between is where another writer gets in.
* :class:`ThreadLockedExpect`: the same, under a lock of this process only: atomic across
  threads, not across processes.
* :class:`NoOpCompaction` / :class:`NoOpRetention`: maintenance reports and does nothing.
* :class:`ForgetsOnReopen`: nothing survives a close (an engine keeping its data in memory
  or in a temporary directory).
* :class:`SplitsAtomicBatches`: ``atomic=True`` checked for size, then written record by
  record.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from eventlane.errors import ConcurrencyError, RecordTooLargeError
from eventlane.log import Log, LogStore
from eventlane.log.embedded.partition import MAX_BATCH_BYTES
from eventlane.log.port import role_members
from eventlane.log.types import (
    AppendResult,
    CompactionReport,
    Expect,
    RecordTuple,
    RetentionReport,
)

GAP_S = 0.002
"""How long a broken engine is 'descheduled' between two steps that must be one."""


class _Call(NamedTuple):
    """One ``append`` call's arguments."""

    topic: str
    partition: int
    records: Sequence[RecordTuple]
    expect: Expect | None
    atomic: bool


class _Appender:
    """The port's ``append`` signature, written once: a broken engine overrides
    :meth:`_append` and delegates the honest part to :meth:`_plain`."""

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        expect: Expect | None = None,
        atomic: bool = False,
    ) -> AppendResult:
        return self._append(_Call(topic, partition, records, expect, atomic))

    def _append(self, call: _Call) -> AppendResult:
        return self._plain(call)

    def _plain(self, call: _Call) -> AppendResult:
        raise NotImplementedError


class _BrokenStore(_Appender, LogStore):
    """A real :class:`LogStore` whose appends go through :meth:`_append`."""

    def _plain(self, call: _Call) -> AppendResult:
        topic, partition, records, expect, atomic = call
        return LogStore.append(self, topic, partition, records, expect=expect, atomic=atomic)


class CheckThenAppend(_BrokenStore):
    def _append(self, call: _Call) -> AppendResult:
        if call.expect is None:
            return self._plain(call)
        return self._check_then_append(call)

    def _check_then_append(self, call: _Call) -> AppendResult:
        topic, partition, _, expect, _ = call
        assert expect is not None
        head = self.key_head(topic, partition, expect.key)
        if head != expect.last_offset:
            raise ConcurrencyError(
                "key moved",
                expected=expect.last_offset,
                actual=head,
                unit="offset",
                topic=topic,
                partition=partition,
            )
        time.sleep(GAP_S)  # descheduled between the check and the write
        return self._plain(call._replace(expect=None))


class ThreadLockedExpect(CheckThenAppend):
    _expect_lock = threading.Lock()

    def _check_then_append(self, call: _Call) -> AppendResult:
        with self._expect_lock:
            return super()._check_then_append(call)


class NoOpCompaction(LogStore):
    def compact(self, topic: str, *, progress: Any = None) -> list[CompactionReport]:
        return [
            CompactionReport(topic, p, 1, 1, 0, 0, 0, 0, 0.0)
            for p in range(self.partition_count(topic))
        ]


class NoOpRetention(LogStore):
    def cleanup(self, topic: str, *, progress: Any = None) -> list[RetentionReport]:
        return [
            RetentionReport(topic, p, 0, 0, 0, 0, 0, 0.0)
            for p in range(self.partition_count(topic))
        ]


class ForgetsOnReopen(LogStore):
    def __init__(self, path: Path, **kwargs: Any) -> None:
        shutil.rmtree(path, ignore_errors=True)  # whatever a previous instance stored
        super().__init__(path, **kwargs)


class SplitsAtomicBatches(_BrokenStore):
    def _append(self, call: _Call) -> AppendResult:
        topic, partition, records, expect, atomic = call
        if not atomic or len(records) < 2 or expect is not None:
            return self._plain(call)
        if sum(len(k or b"") + len(v or b"") for k, v, _, _ in records) > MAX_BATCH_BYTES:
            raise RecordTooLargeError("too large for one batch", topic=topic, partition=partition)
        results = []
        for record in records:
            results.append(self._plain(call._replace(records=[record], atomic=False)))
            time.sleep(GAP_S / 4)
        return AppendResult(
            results[0].base_offset,
            results[-1].last_offset,
            [ts for r in results for ts in r.timestamps],
        )


class CoreOnly:
    """An honest engine with the core role only (as a plain Kafka adapter has): every
    method of :class:`~eventlane.log.port.Log` forwarded to a real LogStore, and nothing
    else (no per-key reads, no conditional appends, no maintenance, no fencing)."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        self._inner = LogStore(path, **kwargs)

    @property
    def local(self) -> Any:
        return self._inner.local

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[RecordTuple],
        *,
        atomic: bool = False,
    ) -> AppendResult:
        return self._inner.append(topic, partition, records, atomic=atomic)


def _forward(name: str) -> Any:
    return lambda self, *a, **k: getattr(self._inner, name)(*a, **k)


for _name in role_members(Log):
    if _name not in vars(CoreOnly):
        setattr(CoreOnly, _name, _forward(_name))
