"""Prometheus metrics: what happens (instruments) and where things stand (read at scrape).

Two kinds, both exported under ``eventlane_`` with Prometheus' naming (base units, counters
ending in ``_total``) and bounded labels (topic, partition, group, projector, API and error
names; never a key, an aggregate id or a member id):

* **Instruments** (:data:`M`), updated where things happen: appends (calls, records, bytes)
  and their latency in every engine, the embedded engine's fsyncs and group-commit sizes,
  conditional-append conflicts and command retries, records consumed, rebalances, events
  applied, handler latency and dead letters, JetStream publish latency and errors, the
  Kafka listener's requests by API and error code, their latency and bytes, its open
  connections and in-flight bytes. They are off until a process calls
  :func:`enable` (an entry point with ``--metrics-port``, or a worker of a supervisor that
  has one): off, an update is one attribute test (``if M.on:``), and ``prometheus_client``
  is never imported (its import costs more than a short command's whole run). On, a hot
  path's counts are plain numbers, added to the instruments by :func:`flush`
  (before a scrape, every second and at exit), not a prometheus_client call each.
* **State** (:class:`eventlane.app.metrics.StateCollector`), read from the log, the groups'
  shared state and the read models at every scrape, exactly what ``eventlane groups
  describe`` and ``eventlane project status`` report: per group and partition the committed
  offset, the high-water mark and the lag; per projection its position, lag, dead letters by
  status, whether its poison-rate breaker is open, the group's generation and live members.
  Nothing is counted on the hot path for these, and the figures cannot drift from the CLI's.

A supervisor's workers are separate processes: with ``--metrics-port`` the supervisor gives
them a directory (``PROMETHEUS_MULTIPROC_DIR``, prometheus_client's multiprocess mode) and
its one endpoint sums their instruments and adds the state it reads itself, so the endpoint
keeps answering, with the dead worker's counts kept (its log counts up to its last
flush, at most a second old: :func:`flush`), after a worker is killed.

Invariant: enabling is idempotent and per process; the metric names and label sets below are
the whole exported surface (docs/observability.md lists them and a test checks the
dashboard's queries against a real scrape).
"""

from __future__ import annotations

import atexit
import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from eventlane.errors import LogUnavailableError, OutcomeUnknownError

__all__ = [
    "M",
    "MULTIPROC_ENV",
    "Endpoint",
    "appended",
    "batch_applied",
    "enable",
    "flush",
    "fsynced",
    "publish_failed",
    "serve",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's multiprocess directory, set by a supervisor for its workers."""

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
_RECORDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384, 65536)
_N_SECONDS, _N_RECORDS = len(_SECONDS) + 1, len(_RECORDS) + 1  # buckets, +Inf included


class _Instruments:
    """The process's instruments; every attribute but ``on`` is set by :func:`enable`."""

    on = False
    appended: Any
    appended_bytes: Any
    append_seconds: Any
    fsync_seconds: Any
    fsync_records: Any
    conflicts: Any
    retries: Any
    consumed: Any
    rebalances: Any
    applied: Any
    handler_seconds: Any
    dead_letters: Any
    publish_seconds: Any
    publish_errors: Any
    kafka_requests: Any
    kafka_request_seconds: Any
    kafka_received_bytes: Any
    kafka_sent_bytes: Any
    kafka_connections: Any
    kafka_inflight_bytes: Any


M = _Instruments()
"""The instruments: ``if M.on: M.appended.labels(topic).inc(n)``."""

_lock = threading.Lock()


def enable() -> None:
    """Create the instruments in this process (idempotent). In a worker of a supervisor that
    exports metrics (``PROMETHEUS_MULTIPROC_DIR`` set) they are written to its directory."""
    with _lock:
        if M.on:
            return
        from prometheus_client import (  # noqa: PLC0415 - see the docstring
            REGISTRY,
            Counter,
            Gauge,
            Histogram,
        )

        REGISTRY.register(_FlushFirst())
        M.appended = Counter(
            "eventlane_log_appended_records_total", "Records appended to the log.", ["topic"]
        )
        M.appended_bytes = Counter(
            "eventlane_log_appended_bytes_total",
            "Bytes appended, as the engine frames them (embedded: record batches written to"
            " the segments; JetStream: message payloads; Kafka: records as batched).",
            ["topic"],
        )
        M.append_seconds = Histogram(
            "eventlane_log_append_seconds",
            "Latency of one append call that stored its records (durable when it returns);"
            " its count is the number of such calls.",
            ["topic"],
            buckets=_SECONDS,
        )
        M.fsync_seconds = Histogram(
            "eventlane_log_fsync_seconds",
            "Latency of one fsync of a partition's active segment (embedded engine).",
            ["topic"],
            buckets=_SECONDS,
        )
        M.fsync_records = Histogram(
            "eventlane_log_fsync_records",
            "Records one fsync made durable and published: the group-commit size (embedded"
            " engine; an fsync whose records another process published first counts none).",
            ["topic"],
            buckets=_RECORDS,
        )
        M.conflicts = Counter(
            "eventlane_store_append_conflicts_total",
            "Conditional appends refused because the stream had moved on.",
            ["topic"],
        )
        M.retries = Counter(
            "eventlane_store_command_retries_total",
            "Command attempts repeated, by reason (conflict, unavailable, unknown).",
            ["topic", "reason"],
        )
        M.consumed = Counter(
            "eventlane_consumer_records_total", "Records returned by polls.", ["group", "topic"]
        )
        M.rebalances = Counter(
            "eventlane_consumer_rebalances_total",
            "Assignments received by group members (one per member per generation).",
            ["group"],
        )
        M.applied = Counter(
            "eventlane_projection_events_applied_total",
            "Events applied to a read model by its handlers.",
            ["projector"],
        )
        M.handler_seconds = Histogram(
            "eventlane_projection_batch_seconds",
            "Time to apply one batch (handlers, dead letters and positions, one transaction).",
            ["projector"],
            buckets=_SECONDS,
        )
        M.dead_letters = Counter(
            "eventlane_projection_dead_letters_total",
            "Events dead-lettered by a projector's workers.",
            ["projector"],
        )
        M.publish_seconds = Histogram(
            "eventlane_jetstream_publish_seconds",
            "Latency of a JetStream publish until acknowledged.",
            buckets=_SECONDS,
        )
        M.publish_errors = Counter(
            "eventlane_jetstream_publish_errors_total",
            "JetStream publishes that failed, by outcome (refused, unavailable, unknown).",
            ["outcome"],
        )
        M.kafka_requests = Counter(
            "eventlane_kafka_requests_total",
            "Requests served by the Kafka listener (acks=0 produces and malformed frames"
            " included), by API and error code name (NONE, or the response's first error).",
            ["api", "error"],
        )
        M.kafka_request_seconds = Histogram(
            "eventlane_kafka_request_seconds",
            "Time from a Kafka request's last byte received to its response written.",
            ["api"],
            buckets=_SECONDS,
        )
        M.kafka_received_bytes = Counter(
            "eventlane_kafka_received_bytes_total",
            "Bytes of Kafka requests received (frames, size prefix included).",
            ["api"],
        )
        M.kafka_sent_bytes = Counter(
            "eventlane_kafka_sent_bytes_total",
            "Bytes of Kafka responses sent (frames, size prefix included).",
            ["api"],
        )
        M.kafka_connections = Gauge(
            "eventlane_kafka_connections",
            "Open connections to the Kafka listener.",
            multiprocess_mode="livesum",
        )
        M.kafka_inflight_bytes = Gauge(
            "eventlane_kafka_inflight_bytes",
            "Bytes of Kafka requests being received or served (and their decompressed"
            " records), bounded by queued.max.request.bytes.",
            multiprocess_mode="livesum",
        )
        M.on = True
        atexit.register(flush)
        threading.Thread(
            target=_flush_every, args=(1.0,), name="eventlane-metrics-flush", daemon=True
        ).start()


class Tally:
    """A topic's log instruments as plain numbers, added to the prometheus children by
    :func:`flush` (a Counter's ``inc`` and a Histogram's ``observe`` lock, check and loop
    on every call: 5-10 us an append, 25 % of a small one). Histogram buckets are per
    bucket (not cumulative), as prometheus_client keeps them.

    No lock on the hot path (taking one let a runtime's other threads in at every append:
    4-6 us of CPU an append, measured): an update (:func:`appended`, :func:`fsynced`) and
    the read-and-reset in :meth:`flush` are each a straight run of attribute and item
    operations on ints, floats and lists with no call in it, which CPython's GIL never
    interrupts (threads switch only at calls and backward jumps). A build without a GIL
    would need the lock back. ``lock`` orders flushes among themselves."""

    __slots__ = (
        "append_buckets",
        "append_sum",
        "children",
        "fsync_buckets",
        "fsync_sum",
        "group_buckets",
        "group_sum",
        "lock",
        "nbytes",
        "records",
    )

    def __init__(self, topic: str) -> None:
        self.lock = threading.Lock()
        self.children = (
            M.appended.labels(topic),
            M.appended_bytes.labels(topic),
            M.append_seconds.labels(topic),
            M.fsync_seconds.labels(topic),
            M.fsync_records.labels(topic),
        )
        self.records = self.nbytes = 0
        self.append_sum = self.fsync_sum = 0.0
        self.group_sum = 0
        self.append_buckets = [0] * _N_SECONDS
        self.fsync_buckets = [0] * _N_SECONDS
        self.group_buckets = [0] * _N_RECORDS

    def flush(self) -> None:
        with self.lock:
            empty_seconds, empty_records = [0] * _N_SECONDS, [0] * _N_RECORDS
            empty_seconds_2 = [0] * _N_SECONDS
            # one uninterrupted run from here (no call): see the class docstring
            records, nbytes, append_sum, fsync_sum, group_sum = (
                self.records,
                self.nbytes,
                self.append_sum,
                self.fsync_sum,
                self.group_sum,
            )
            buckets = (self.append_buckets, self.fsync_buckets, self.group_buckets)
            self.records = self.nbytes = self.group_sum = 0
            self.append_sum = self.fsync_sum = 0.0
            self.append_buckets = empty_seconds
            self.fsync_buckets = empty_seconds_2
            self.group_buckets = empty_records
        appended_, bytes_, append_seconds, fsync_seconds, fsync_records = self.children
        if records:
            appended_.inc(records)
        if nbytes:
            bytes_.inc(nbytes)
        for child, total, counts in (
            (append_seconds, append_sum, buckets[0]),
            (fsync_seconds, fsync_sum, buckets[1]),
            (fsync_records, group_sum, buckets[2]),
        ):
            if any(counts):
                child._sum.inc(total)  # prometheus_client's own values (as observe does)
                for i, n in enumerate(counts):
                    if n:
                        child._buckets[i].inc(n)


_tallies: dict[str, Tally] = {}
_tallies_lock = threading.Lock()


def _tally(topic: str) -> Tally:
    tally = _tallies.get(topic)
    if tally is None:
        with _tallies_lock:
            tally = _tallies.get(topic)
            if tally is None:
                tally = _tallies[topic] = Tally(topic)
    return tally


def appended(topic: str, records: int, nbytes: int, seconds: float) -> None:
    """Count one append call that stored ``records`` (metrics on)."""
    add_append(_tallies.get(topic) or _tally(topic), records, nbytes, seconds)


def tally(topic: str) -> Tally:
    """``topic``'s tally, for a hot path to keep (:func:`add_append`)."""
    return _tallies.get(topic) or _tally(topic)


def add_append(
    tally: Tally,
    records: int,
    nbytes: int,
    seconds: float,
    _bucket: Any = bisect_left,
    _bounds: tuple[float, ...] = _SECONDS,
) -> None:
    """:func:`appended` on a tally the caller keeps (an engine's partition): no lookup of
    the topic, the bucket search bound as a local (-17 % of the instruments' instructions
    an append, counted with callgrind)."""
    i = _bucket(_bounds, seconds)
    # one uninterrupted run (no call): see Tally
    tally.records += records
    tally.nbytes += nbytes
    tally.append_sum += seconds
    tally.append_buckets[i] += 1


def fsynced(topic: str, seconds: float | None, records: int) -> None:
    """Count one fsync (``seconds``; ``None``: counted already) that made ``records``
    durable and published them (metrics on)."""
    tally = _tallies.get(topic) or _tally(topic)
    if seconds is not None:
        i = bisect_left(_SECONDS, seconds)
        tally.fsync_sum += seconds  # each run of updates without a call: see Tally
        tally.fsync_buckets[i] += 1
    if records > 0:
        i = bisect_left(_RECORDS, records)
        tally.group_sum += records
        tally.group_buckets[i] += 1


def flush() -> None:
    """Add what the hot paths counted to the prometheus instruments: before each scrape of
    this process's registry, every second (a thread) and at exit, so a supervisor's
    endpoint lags its workers by a second at most (a worker killed loses that second)."""
    for tally in list(_tallies.values()):
        tally.flush()


class _FlushFirst:
    """Registered before the instruments: a scrape of the process's registry flushes first."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        flush()
        return []


def _flush_every(seconds: float) -> None:
    while True:
        time.sleep(seconds)
        flush()


def batch_applied(
    projector: str,
    group: str,
    topics: Iterable[str],
    applied: int,
    dead_lettered: int,
    seconds: float,
) -> None:
    """Count one projector batch (metrics on): its handlers' ``seconds``, the events
    ``applied`` and ``dead_lettered``, and each record consumed by ``group`` (``topics``:
    the batch's records' topics, one per record)."""
    M.handler_seconds.labels(projector).observe(seconds)
    M.applied.labels(projector).inc(applied)
    if dead_lettered:
        M.dead_letters.labels(projector).inc(dead_lettered)
    for topic, count in Counter(topics).items():
        M.consumed.labels(group, topic).inc(count)


def publish_failed(error: BaseException) -> None:
    """Count a JetStream publish that failed, by outcome (metrics on): ``unknown`` (it may
    be stored), ``unavailable`` (nothing written, retriable) or ``refused``."""
    if isinstance(error, OutcomeUnknownError):
        outcome = "unknown"
    elif isinstance(error, LogUnavailableError):
        outcome = "unavailable"
    else:
        outcome = "refused"
    M.publish_errors.labels(outcome).inc()


class Endpoint(NamedTuple):
    """A running ``/metrics`` endpoint: its port (the one chosen when asked for 0) and how
    to stop it."""

    port: int
    stop: Callable[[], None]


def serve(
    port: int,
    *,
    addr: str = "127.0.0.1",
    collectors: Iterable[Any] = (),
    multiproc_dir: str | None = None,
) -> Endpoint:
    """Serve ``/metrics`` on ``addr:port`` from a thread.

    The endpoint exports this process's instruments (enabled here) and ``collectors`` (e.g.
    a :class:`eventlane.app.metrics.StateCollector`); with ``multiproc_dir``, instead of this
    process's instruments, those of every process that wrote there (a supervisor's workers, started
    with ``PROMETHEUS_MULTIPROC_DIR`` set to it: prometheus_client's multiprocess mode).
    """
    from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415

    registry: Any
    if multiproc_dir is not None:
        from prometheus_client import multiprocess  # noqa: PLC0415

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiproc_dir)  # type: ignore[no-untyped-call]
    else:
        from prometheus_client import REGISTRY  # noqa: PLC0415

        registry = REGISTRY
        enable()
    for collector in collectors:
        registry.register(collector)
    server, thread = start_http_server(port, addr=addr, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        for collector in collectors:
            registry.unregister(collector)

    return Endpoint(int(server.server_address[1]), stop)
