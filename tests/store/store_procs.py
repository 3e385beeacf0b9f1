"""Child processes for the multi-process and ``kill -9`` tests of the event store.

Run as a script (the tests start it with ``subprocess``)::

    python tests/store/store_procs.py ROLE '<json arguments>'

Each role prints protocol lines on stdout (flushed per line) and its logs on stderr:

``execute``  ``Runtime.execute`` of ``Counter.increment`` (``cls``: ``Counter`` or
             ``SnapCounter``) on one aggregate, ``count``
             times, with retry on conflict. Prints ``R`` when ready, then waits for a line
             on stdin (so two children start together), then ``D <attempts> <t0> <t1>``:
             how many times the command ran (> count means conflicts were retried) and the
             wall-clock interval of the loop. ``metrics``: with the instruments on
             (prometheus_client's multiprocess mode, its directory in the environment).
``race``     no retry. Per round: loads the counter and prints ``L <version>``, waits for
             ``GO`` on stdin, saves ``batch`` events (tagged with ``writer``) and prints
             ``W <version>`` (won) or ``C <expected> <actual>`` (ConcurrencyError). ``Q``
             on stdin ends it.
``atomic``   saves batches of ``Tick`` events (sizes ``min_size..max_size``) on random
             ``Batcher`` aggregates until killed; prints ``S <aggregate> <save> <size>
             <version>`` after each save returns (acknowledged). Save numbers continue from
             what is stored, so successive children never reuse one.
``die_before_index``  saves one event on ``aggregate``, but its key-index update is
             replaced by ``SIGKILL`` of itself: the process dies between its append and its
             index update, as a crash would leave it.
``hold_then_die``  ``count`` commands on ``aggregate`` (the key index holds their rows back
             in memory, its flusher thread told to wait an hour), prints ``H``, then ``SIGKILL`` of itself: the held rows die with it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from typing import Any

from store_domain import Batcher, Counter, SnapCounter, make_app

from eventlane.errors import AggregateNotFoundError, ConcurrencyError
from eventlane.log.embedded import key_index
from eventlane.log.embedded.key_index import KeyIndex
from eventlane.observability import configure_logging


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def role_execute(args: dict[str, Any]) -> None:
    if args.get("metrics"):  # counts into PROMETHEUS_MULTIPROC_DIR (eventlane.metrics)
        from eventlane.metrics import enable  # noqa: PLC0415

        enable()
    with make_app(args["data"], partitions=args.get("partitions", 2)) as app:
        attempts = 0

        def command(counter: Counter) -> None:
            nonlocal attempts
            attempts += 1
            counter.increment(1, args["writer"])

        cls = SnapCounter if args.get("cls") == "SnapCounter" else Counter
        app.load(cls, args["aggregate"])  # warm: open the partition and its key index
        emit("R")
        sys.stdin.readline()
        t0 = time.time()
        for _ in range(args["count"]):
            app.execute(cls, args["aggregate"], command, attempts=1000)
        emit(f"D {attempts} {t0} {time.time()}")


def role_race(args: dict[str, Any]) -> None:
    with make_app(args["data"], partitions=args.get("partitions", 2)) as app:
        while True:
            counter = app.load(Counter, args["aggregate"])
            emit(f"L {counter.version}")
            if sys.stdin.readline().strip() != "GO":
                return
            for _ in range(args["batch"]):
                counter.increment(1, args["writer"])
            try:
                app.save(counter)
            except ConcurrencyError as exc:
                emit(f"C {exc.expected} {exc.actual}")
            else:
                emit(f"W {counter.version}")


def role_atomic(args: dict[str, Any]) -> None:
    rng = random.Random(args["seed"])
    with make_app(args["data"], partitions=args.get("partitions", 2)) as app:
        ids = [f"batcher-{i}" for i in range(args["aggregates"])]
        saves: dict[str, int] = {}
        for aggregate_id in ids:
            try:
                saves[aggregate_id] = app.load(Batcher, aggregate_id).saves
            except AggregateNotFoundError:
                saves[aggregate_id] = 0
        emit("R")
        while True:
            aggregate_id = rng.choice(ids)
            try:
                batcher = app.load(Batcher, aggregate_id)
            except AggregateNotFoundError:
                batcher = Batcher(aggregate_id)
            save = batcher.saves + 1
            size = rng.randint(args["min_size"], args["max_size"])
            batcher.record_save(save, size)
            app.save(batcher)
            emit(f"S {aggregate_id} {save} {size} {batcher.version}")


def role_die_before_index(args: dict[str, Any]) -> None:
    def die(*_: object, **__: object) -> bool:
        os.kill(os.getpid(), signal.SIGKILL)
        return False  # pragma: no cover

    with make_app(args["data"], partitions=args.get("partitions", 2)) as app:
        try:
            counter = app.load(Counter, args["aggregate"])
        except AggregateNotFoundError:
            counter = Counter(args["aggregate"])
        counter.increment(args.get("by", 1), "dying")
        KeyIndex.add_appended = die  # type: ignore[method-assign]
        app.save(counter)
        emit("survived")  # never reached


def role_hold_then_die(args: dict[str, Any]) -> None:
    key_index.FLUSH_AFTER_S = 3600.0  # nothing written behind the test's back
    app = make_app(args["data"], partitions=args.get("partitions", 2))
    for _ in range(args["count"]):
        app.execute(Counter, args["aggregate"], lambda c: c.increment(1, "dying"), create=True)
    emit("H")
    os.kill(os.getpid(), signal.SIGKILL)


ROLES = {
    "execute": role_execute,
    "race": role_race,
    "atomic": role_atomic,
    "die_before_index": role_die_before_index,
    "hold_then_die": role_hold_then_die,
}

if __name__ == "__main__":
    configure_logging("warning")  # logs on stderr; stdout carries only the protocol
    ROLES[sys.argv[1]](json.loads(sys.argv[2]))
