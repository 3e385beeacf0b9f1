"""Several OS processes appending to and tailing one topic at once (issue 2, multi-process line).

Three producer processes append 20,000 keyed records each to one 6-partition topic (batches
of 1 to a few hundred records, single ``send`` calls, bursts of futures sharing a group
commit, and direct appends to an explicit partition) while two reader processes tail it with
the free consumer, sleeping in ``poll(timeout)`` until appends by the other processes wake
them. The readers are told the total and stop when they have seen it.

Afterwards every reader must have read every record exactly once; offsets strictly increase
per partition with no gap; each producer's records keep their send order within a partition;
both readers and the producers' acknowledgements agree on where every record is; keyed
records sit where Kafka's partitioner puts them; ``verify`` is clean.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from eventlane.log import LogStore
from eventlane.log.partitioner import partition_for_key

_spec = importlib.util.spec_from_file_location(
    "eventlane_log_procs", Path(__file__).with_name("procs.py")
)
assert _spec is not None and _spec.loader is not None
procs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = procs
_spec.loader.exec_module(procs)

TOPIC = "mp"
PARTITIONS = 6
PRODUCERS = 3
READERS = 2
PER_PRODUCER = 20_000
TOTAL = PRODUCERS * PER_PRODUCER
POLL_TIMEOUT_S = 30.0
"""Long on purpose: a reader that is not woken by appends would sit out whole timeouts."""
DEADLINE_S = 400.0


@pytest.mark.timeout(600)
def test_three_producers_two_tailing_readers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = tmp_path / "out"
    with LogStore(data) as store:
        store.create_topic(TOPIC, PARTITIONS)

    readers = [
        procs.Child(
            "tail",
            {
                "data": str(data),
                "topic": TOPIC,
                "total": TOTAL,
                "timeout": DEADLINE_S,
                "poll_timeout": POLL_TIMEOUT_S,
            },
            out,
            f"reader{n}",
        )
        for n in range(READERS)
    ]
    producers: list[procs.Child] = []
    try:
        for reader in readers:
            reader.wait_for_line("R")  # assigned and polling before anything is appended
        go = tmp_path / "go"
        producers = [
            procs.Child(
                "produce",
                {
                    "data": str(data),
                    "topic": TOPIC,
                    "tag": f"p{n}",
                    "seed": 1000 + n,
                    "count": PER_PRODUCER,
                    "go": str(go),
                    "big": False,
                    "max_batch": 200,
                    "singles": 0.2,
                },
                out,
                f"producer{n}",
            )
            for n in range(PRODUCERS)
        ]
        for producer in producers:
            producer.wait_for_line("R")
        started = time.monotonic()
        go.touch()  # all three start appending at once
        for producer in producers:
            rc = producer.wait(DEADLINE_S)
            assert rc == 0, f"{producer.name} exited {rc}: {producer.stderr_tail()}"
        produced_s = time.monotonic() - started
        for reader in readers:
            rc = reader.wait(DEADLINE_S)
            assert rc == 0, f"{reader.name} exited {rc}: {reader.stderr_tail()}"
        caught_up_s = time.monotonic() - started - produced_s
    finally:
        for child in [*readers, *producers]:
            child.kill()

    # The producers' acknowledgements: where each record landed.
    acked: dict[str, tuple[int, int]] = {}
    for producer in producers:
        lines = producer.lines()
        assert lines[-1] == "D"
        for p, o, ident in procs.acked(lines):
            assert ident not in acked, f"{ident} acknowledged twice"
            acked[ident] = (p, o)
    expected = {f"p{n}:{seq}" for n in range(PRODUCERS) for seq in range(PER_PRODUCER)}
    assert set(acked) == expected

    views = []
    for reader in readers:
        lines = reader.lines()
        done = lines[-1].split()
        assert done[0] == "D" and int(done[1]) == TOTAL, lines[-1]
        empty_polls = int(done[2])
        assert empty_polls == 0, (
            f"{reader.name}: {empty_polls} polls of {POLL_TIMEOUT_S} s returned nothing: "
            "appends by other processes did not wake it"
        )
        seen = list(procs.acked(lines))
        assert len(seen) == TOTAL
        idents = [ident for _, _, ident in seen]
        assert len(set(idents)) == TOTAL, "a record was read twice"
        assert set(idents) == expected, "a record was never read"
        by_partition: dict[int, list[int]] = defaultdict(list)
        last_seq: dict[tuple[str, int], int] = {}
        for p, o, ident in seen:
            by_partition[p].append(o)
            tag, seq = ident.split(":")
            assert int(seq) > last_seq.get((tag, p), -1), (
                f"{reader.name}: {ident} read after seq {last_seq[(tag, p)]} in partition {p}"
            )
            last_seq[(tag, p)] = int(seq)
        for p, offsets in by_partition.items():
            assert offsets == list(range(len(offsets))), (
                f"{reader.name}: partition {p} offsets not strictly increasing without gaps"
            )
        view = {ident: (p, o) for p, o, ident in seen}
        assert view == acked, "a reader saw a record elsewhere than where it was acknowledged"
        views.append(view)
    assert views[0] == views[1]
    # Both readers woke on appends from other processes and caught up promptly (the poll
    # timeout is 30 s: a reader sleeping through appends would be that late).
    assert caught_up_s < POLL_TIMEOUT_S / 2, f"readers caught up {caught_up_s:.1f} s late"

    with LogStore(data) as store:
        assert store.verify(TOPIC) == []
        hwms = []
        for p in range(PARTITIONS):
            lwm, hwm, leo = store.offsets(TOPIC, p)
            assert lwm == 0 and hwm == leo
            hwms.append(hwm)
            records = procs.read_all(store, TOPIC, p, 0, hwm)
            assert [r.offset for r in records] == list(range(hwm))
            for r in records:
                assert acked[procs.payload_id(r.value)] == (p, r.offset)
                if r.key is not None and r.key.startswith(b"k"):  # sent via the partitioner
                    assert partition_for_key(r.key, PARTITIONS) == p
        assert sum(hwms) == TOTAL
        assert all(hwms), "some partition got no record"
    # The producers really ran at once: their records interleave within the partitions.
    switches = 0
    for p in range(PARTITIONS):
        tags = [
            ident.split(":")[0]
            for ident, (q, _) in sorted(acked.items(), key=lambda item: item[1])
            if q == p
        ]
        switches += sum(1 for a, b in itertools.pairwise(tags) if a != b)
    assert switches >= 10 * PARTITIONS, f"only {switches} producer switches: no concurrency"
    print(
        f"\n3 producers x {PER_PRODUCER} records in {produced_s:.1f} s; readers caught up "
        f"{caught_up_s * 1000:.0f} ms after the last producer exited; per partition {hwms}; "
        f"{switches} producer switches within partitions"
    )
