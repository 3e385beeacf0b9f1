"""A read that continues where the last one stopped, at the end of a partition, while other
producers append: every record is returned once, in order, none skipped.

The defect this guards (found by the Kafka event store's races): a fetch that returned the
partition-EOF event *and then* new records in one ``consume`` put those records aside for
the next read, while the current read went on consuming past them, so the next read dropped
them as already passed: a record skipped by ``read`` (a load that found version 6 after 3)."""

from __future__ import annotations

import random
import threading
import time

from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog


def test_tailing_reads_skip_nothing_while_others_append(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    writers = [KafkaLog(kafka_cluster.bootstrap, namespace=namespace) for _ in range(3)]
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as reader:
        reader.create_topic("tail", 1)
        each = 60
        total = each * len(writers)

        def produce(log: KafkaLog) -> None:
            for _ in range(each):
                log.append("tail", 0, [(b"k", b"x", (), None)])
                time.sleep(0.005)

        threads = [threading.Thread(target=produce, args=(w,)) for w in writers]
        for thread in threads:
            thread.start()
        seen: list[int] = []
        offset, cursor = 0, None
        deadline = time.monotonic() + 120
        try:
            while len(seen) < total and time.monotonic() < deadline:
                hwm = reader.offsets("tail", 0).hwm
                records, cursor = reader.read("tail", 0, offset, cursor=cursor, upto=hwm)
                for r in records:
                    assert r.offset == offset, f"read from {offset} returned {r.offset}"
                    seen.append(r.offset)
                    offset += 1
        finally:
            for thread in threads:
                thread.join(120)
            for w in writers:
                w.close()
        assert seen == list(range(total))


def test_reads_of_any_window_and_size_return_the_model_s_records(
    kafka_cluster: LocalKafkaCluster, namespace: str
) -> None:
    """Seeded reads from random offsets with random ``upto`` and ``max_bytes``, continuing
    or jumping, against the records appended (the model): each read returns a gap-free run
    from its offset, at least one record when any lies below its bound, none at or past
    ``upto``, and stops once the values it took reach ``max_bytes``. (The read takes each
    consumed batch by bisection: the cuts inside a batch are what this exercises.)"""
    rng = random.Random(3301)
    with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as log:
        log.create_topic("win", 1)
        model: list[bytes] = []
        while len(model) < 1_200:
            batch = [
                bytes([65 + len(model) % 26]) * rng.choice((0, 1, 50, 700))
                for _ in range(rng.randint(1, 200))
            ]
            log.append("win", 0, [(b"k", v, (), None) for v in batch])
            model += batch
        offset, cursor = 0, None
        for _ in range(120):
            if rng.random() < 0.3:  # jump elsewhere: the reader assigns again
                offset, cursor = rng.randrange(len(model)), None
            upto = rng.choice((None, offset + rng.randint(0, 900)))
            max_bytes = rng.choice((1, 400, 20_000, 1 << 20))
            records, cursor = log.read(
                "win", 0, offset, max_bytes=max_bytes, cursor=cursor, upto=upto
            )
            end = len(model) if upto is None else min(upto, len(model))
            got = [r.offset for r in records]
            assert got == list(range(offset, offset + len(got))), (offset, upto, max_bytes)
            assert (len(got) > 0) == (offset < end), (offset, upto, max_bytes)
            assert offset + len(got) <= end
            assert [r.value for r in records] == model[offset : offset + len(got)]
            sizes = [len(v) for v in model[offset : offset + len(got)]]
            # stopped by max_bytes only once the records before the last held less than it
            assert len(got) <= 1 or sum(sizes[:-1]) < max_bytes, (offset, upto, max_bytes)
            offset = offset + len(got) if offset + len(got) < len(model) else 0
