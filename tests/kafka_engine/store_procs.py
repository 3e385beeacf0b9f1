"""Child processes of the Kafka event-store tests: ``python store_procs.py ROLE '<json>'``.

Arguments: ``bootstrap``, ``namespace`` plus the role's own. The application is
``store_domain.make_app`` on a :class:`KafkaLog` (``App.open`` of the log).

``execute``  ``Runtime.execute`` of ``Counter.increment`` on ``aggregate``, ``count`` times
             with retry, the event naming the command (``writer:i``); ``R`` when ready,
             waits for a line on stdin, prints ``A <version> <writer:i> <unix time>`` per
             acknowledged command, then ``D <attempts> <t0> <t1>``. An unknown outcome
             (``OutcomeUnknownError``) prints ``U <i>`` and is not retried.
``race``     no retry: per round loads the counter (``L <version>``), waits for ``GO``, saves
             ``batch`` events and prints ``W <version>`` or ``C <expected> <actual>``
             (ConcurrencyError); ``Q`` ends it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

from store_domain import Counter, make_app

from eventlane.app import Runtime
from eventlane.errors import ConcurrencyError, OutcomeUnknownError
from eventlane.log.kafka.log import KafkaLog


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _app(log: KafkaLog) -> Runtime:
    return make_app(log, partitions=2)


def execute(log: KafkaLog, args: dict[str, object]) -> None:
    with _app(log) as app:
        attempts = 0

        name = ""

        def command(counter: Counter) -> None:
            nonlocal attempts
            attempts += 1
            counter.increment(1, name)

        app.load(Counter, str(args["aggregate"]))
        out("R")
        sys.stdin.readline()
        t0 = time.time()
        for i in range(int(str(args["count"]))):
            name = f"{args['writer']}:{i}"
            try:
                got = app.execute(Counter, str(args["aggregate"]), command, attempts=1000)
            except OutcomeUnknownError:
                out(f"U {i}")
                continue
            out(f"A {got.version} {name} {time.time():.3f}")
        out(f"D {attempts} {t0} {time.time()}")


def race(log: KafkaLog, args: dict[str, object]) -> None:
    with _app(log) as app:
        while True:
            counter = app.load(Counter, str(args["aggregate"]))
            out(f"L {counter.version}")
            if sys.stdin.readline().strip() != "GO":
                return
            for _ in range(int(str(args["batch"]))):
                counter.increment(1, str(args["writer"]))
            try:
                app.save(counter)
            except ConcurrencyError as exc:
                out(f"C {exc.expected} {exc.actual}")
            else:
                out(f"W {counter.version}")


if __name__ == "__main__":
    role, raw = sys.argv[1], json.loads(sys.argv[2])
    with KafkaLog(str(raw["bootstrap"]), namespace=str(raw["namespace"]), timeout=20.0) as log:
        {"execute": execute, "race": race}[role](log, raw)
