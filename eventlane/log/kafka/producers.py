"""The producers of one :class:`~eventlane.log.kafka.log.KafkaLog`: one append in flight on
each, appends of concurrent callers in flight together.

An append holds a producer from its first ``produce`` to the end of its flush, and nothing
else is queued on that producer meanwhile: its records leave as the batches the append
made (``linger.ms`` outlasts an append; its own flush sends them), which is what makes an
atomic append one Kafka batch. Concurrent callers take different producers (at most
``size``, made when first needed; a caller finding all of them busy waits for one), so
their appends, to one partition or to several, are in flight at once instead of one
after another. Each producer is idempotent: its retries neither lose nor duplicate its
records. Records of different producers reach a partition in the order its leader gets
them, an order concurrent callers never had anyway; one caller's appends stay in order
(each returns once acknowledged).

Invariant: a producer is held by at most one append at a time; one whose idempotence
state broke (a fatal error) is never handed out again.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from confluent_kafka import Producer

__all__ = ["ProducerPool"]


class ProducerPool:
    """Producers made from one configuration, lent one append at a time (module docstring)."""

    def __init__(self, config: dict[str, Any], size: int = 8) -> None:
        self._config = config
        self._size = size
        self._cond = threading.Condition()
        self._free: list[Producer] = [Producer(config)]
        self._all: list[Producer] = list(self._free)
        self._broken: set[int] = set()  # id() of producers not to lend again
        self._waiting = 0  # callers in acquire()'s wait, counted under the lock

    def acquire(self) -> Producer:
        """A producer no other append holds (a new one while fewer than ``size`` exist).

        A free one is taken without the lock (``list.pop`` is atomic); a caller that must
        wait counts itself before it looks again under the lock, and :meth:`release` puts
        the producer back before it reads that count, so no wake-up is lost."""
        with contextlib.suppress(IndexError):
            return self._free.pop()
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    if self._free:
                        return self._free.pop()
                    if len(self._all) < self._size:
                        producer = Producer(self._config)
                        self._all.append(producer)
                        return producer
                    self._cond.wait()
            finally:
                self._waiting -= 1

    def release(self, producer: Producer) -> None:
        """Give ``producer`` back (dropped if it broke while held)."""
        if id(producer) in self._broken:  # only its holder (this caller) marks it
            with self._cond:
                self._broken.discard(id(producer))
                self._all.remove(producer)
                self._cond.notify()  # a waiter may make a new one
            return
        self._free.append(producer)
        if self._waiting:
            with self._cond:
                self._cond.notify()

    def broke(self, producer: Producer) -> None:
        """``producer`` hit a fatal error: its holder's release drops it (a new one is made
        when needed)."""
        with self._cond:
            self._broken.add(id(producer))

    def close(self) -> None:
        """Close every producer with nothing left undelivered after a flush (one with
        records still undelivered is left as it is: closing it would wait without bound)."""
        with self._cond:
            producers = list(self._all)
        for producer in producers:
            if producer.flush(5.0) == 0:
                producer.close()
