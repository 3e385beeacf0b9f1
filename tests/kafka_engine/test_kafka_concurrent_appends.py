"""Appends of concurrent callers on one :class:`KafkaLog` are in flight together, each on a
producer of its own (:mod:`eventlane.log.kafka.producers`), and still keep the append's
guarantees: every append's records are one run of contiguous offsets in its partition,
acknowledged as such, nothing lost or doubled.

Seeded: 8 threads x 12 appends of 1-40 records (atomic or not) to 3 partitions; the model
is what each thread was told (its AppendResults) and what it sent; the partitions are read
back whole."""

from __future__ import annotations

import random
import threading
from collections import Counter

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.types import AppendResult

THREADS, APPENDS, PARTITIONS = 8, 12, 3


def test_concurrent_appends_keep_each_append_contiguous(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    sent: list[tuple[int, list[bytes], AppendResult]] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("many", PARTITIONS)

        def caller(n: int) -> None:
            rng = random.Random(3300 + n)
            try:
                for i in range(APPENDS):
                    partition = rng.randrange(PARTITIONS)
                    values = [b"%d-%d-%d" % (n, i, j) for j in range(rng.randint(1, 40))]
                    result = log.append(
                        "many",
                        partition,
                        [(b"k%d" % n, v, (), None) for v in values],
                        atomic=rng.random() < 0.5,
                    )
                    with lock:
                        sent.append((partition, values, result))
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not failures, failures
        assert len(sent) == THREADS * APPENDS
        stored: dict[int, dict[int, bytes]] = {}
        for p in range(PARTITIONS):
            offset, rows = 0, {}
            end = log.offsets("many", p).hwm
            while offset < end:
                records, _ = log.read("many", p, offset)
                rows.update({r.offset: r.value or b"" for r in records})
                offset = records[-1].offset + 1
            stored[p] = rows
    for partition, values, result in sent:
        assert result.last_offset - result.base_offset == len(values) - 1  # contiguous
        got = [stored[partition][o] for o in range(result.base_offset, result.last_offset + 1)]
        assert got == values
    every = Counter(v for rows in stored.values() for v in rows.values())
    assert sum(every.values()) == sum(len(v) for _, v, _ in sent)
    assert set(every.values()) == {1}
