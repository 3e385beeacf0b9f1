"""Conditional appends and key reads of concurrent callers on one :class:`KafkaLog`: the
key index catches partitions up at once (a lock per partition, scan readers of their own),
appends to different keys of a partition at once (a lock per key written), and still gives
every caller the same verdicts.

Seeded: 8 threads, two per key, four keys on two partitions; each thread 8 times reads its
key's head and appends with that expectation, retrying on ``ConcurrencyError``, while
reading another key. The model is what the callers were told: every acknowledged append,
by key. Read back through this log and through a fresh one (a new index, as another
process builds it): each key's records are exactly its acknowledged appends, in the order
of their offsets, and its head is the last of them."""

from __future__ import annotations

import random
import threading

from eventlane.errors import ConcurrencyError
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.types import Expect

KEYS, PER_KEY, APPENDS, PARTITIONS = 4, 2, 8, 2


def test_concurrent_conditional_appends_on_several_partitions(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    acked: dict[bytes, list[tuple[int, bytes]]] = {b"key%d" % k: [] for k in range(KEYS)}
    failures: list[BaseException] = []
    lock = threading.Lock()
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("agg", PARTITIONS)

        def caller(n: int) -> None:
            k = n % KEYS
            key, rng, p = b"key%d" % k, random.Random(3500 + n), n % PARTITIONS
            try:
                for i in range(APPENDS):
                    value = b"%d-%d" % (n, i)
                    while True:
                        head = log.key_head("agg", p, key)
                        try:
                            result = log.append(
                                "agg", p, [(key, value, (), None)], expect=Expect(key, head)
                            )
                            break
                        except ConcurrencyError:
                            continue
                    with lock:
                        acked[key].append((result.base_offset, value))
                    other = rng.randrange(KEYS)
                    log.read_key("agg", other % PARTITIONS, b"key%d" % other)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(KEYS * PER_KEY)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not failures, failures
        with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as fresh:
            for reader in (log, fresh):
                for k in range(KEYS):
                    key = b"key%d" % k
                    want = sorted(acked[key])
                    assert len(want) == PER_KEY * APPENDS
                    got = reader.read_key("agg", k % PARTITIONS, key)
                    assert [(r.offset, r.value) for r in got] == want
                    assert reader.key_head("agg", k % PARTITIONS, key) == want[-1][0]
