"""The producer pool lends a producer to one append at a time and loses no wake-up.

Eight threads share two producers (real confluent-kafka producers; nothing is sent, so no
broker is needed), each taking and giving one back 300 times. Checked against a model of
who holds what: no producer is ever held twice at once, never more than two are made, and
every thread finishes (a lost wake-up would leave one waiting forever: bounded by a join
timeout).
"""

from __future__ import annotations

import threading
import time

from eventlane.log.kafka.producers import ProducerPool


def test_eight_threads_share_two_producers_without_overlap_or_lost_wakeups() -> None:
    pool = ProducerPool({"bootstrap.servers": "127.0.0.1:9", "log_level": 0}, size=2)
    holders: dict[int, int] = {}  # id(producer) -> thread index: the model
    lock = threading.Lock()
    overlaps: list[str] = []
    done = [0] * 8

    def work(me: int) -> None:
        for _ in range(300):
            producer = pool.acquire()
            with lock:
                if id(producer) in holders:
                    overlaps.append(f"{me} got a producer {holders[id(producer)]} holds")
                holders[id(producer)] = me
            time.sleep(0)  # let another thread run while this one holds it
            with lock:
                del holders[id(producer)]
            pool.release(producer)
            done[me] += 1

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    try:
        assert done == [300] * 8, f"threads stuck waiting for a producer: {done}"
        assert not overlaps
        assert len(pool._all) <= 2
    finally:
        pool.close()
