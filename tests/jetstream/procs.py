"""Child processes of the JetStream tests: ``python tests/jetstream/procs.py ROLE '<json>'``.

Roles (arguments: ``url``, ``namespace``, ``topic``, ``tag`` plus the role's own):

``cas``      ``count`` conditional appends to key ``key`` of partition 0: read the key's head,
             append with ``Expect(key, head)``; on a conflict retry if ``retry`` else print
             ``L`` (lost) and stop. Prints ``A <offset> <tag>:<i>`` per acknowledged append.
             With ``go``, waits for that file before starting (both children start together).
``execute``  ``Runtime.execute`` of ``Counter.increment`` on ``aggregate``, ``count`` times
             with retry, on an app whose log is the cluster; ``R`` when ready, waits for a
             line on stdin, then ``D <attempts> <t0> <t1>``.
``race``     no retry: per round loads the counter (``L <version>``), waits for ``GO``, saves
             ``batch`` events and prints ``W <version>`` or ``C <expected> <actual>``
             (ConcurrencyError); ``Q`` ends it.
``produce``  appends single records ``<tag>:<i>`` to partition 0 until the file ``stop``
             exists or ``seconds`` pass, half of them conditional on the key's head
             (``Expect``). Prints ``A <offset> <tag>:<i> <unix time>`` per acknowledged append
             and ``E <unix time> <error>`` per failed one. These lines are the oracle of the
             failover test: an ``A`` line is an acknowledged record.
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

from store_domain import Counter, make_app

from eventlane.app import Runtime
from eventlane.errors import ConcurrencyError, FrameworkError
from eventlane.log.jetstream.log import Expect, JetStreamLog


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cas(log: JetStreamLog, args: dict[str, object]) -> None:
    topic, key, tag = str(args["topic"]), str(args["key"]).encode(), args["tag"]
    go = args.get("go")
    out("R")
    while go and not Path(str(go)).exists():
        time.sleep(0.005)
    for i in range(int(str(args["count"]))):
        while True:
            head = log.key_head(topic, 0, key)
            try:
                res = log.append(
                    topic, 0, [(key, f"{tag}:{i}".encode(), (), None)], expect=Expect(key, head)
                )
            except ConcurrencyError:
                if not args.get("retry"):
                    out("L")
                    return
                continue
            out(f"A {res.base_offset} {tag}:{i}")
            break
    out("D")


def produce(log: JetStreamLog, args: dict[str, object]) -> None:
    topic, tag = str(args["topic"]), args["tag"]
    stop = Path(str(args["stop"]))
    key = f"agg-{tag}".encode()
    deadline = time.monotonic() + float(str(args["seconds"]))
    head: int | None = log.key_head(topic, 0, key)
    out("R")
    i = 0
    while not stop.exists() and time.monotonic() < deadline:
        conditional = i % 2 == 0
        try:
            res = log.append(
                topic,
                0,
                [(key, f"{tag}:{i}".encode(), (), None)],
                expect=Expect(key, head) if conditional else None,
            )
        except FrameworkError as exc:
            out(f"E {time.time():.3f} {type(exc).__name__}: {str(exc)[:120]}")
            head = log.key_head(topic, 0, key)
            i += 1
            continue
        head = res.base_offset
        out(f"A {res.base_offset} {tag}:{i} {time.time():.3f}")
        i += 1
    out("D")


def _app(log: JetStreamLog) -> Runtime:
    return make_app(log, partitions=2)  # type: ignore[arg-type]


def execute(log: JetStreamLog, args: dict[str, object]) -> None:
    with _app(log) as app:
        attempts = 0

        def command(counter: Counter) -> None:
            nonlocal attempts
            attempts += 1
            counter.increment(1, str(args["writer"]))

        app.load(Counter, str(args["aggregate"]))
        out("R")
        sys.stdin.readline()
        t0 = time.time()
        for _ in range(int(str(args["count"]))):
            app.execute(Counter, str(args["aggregate"]), command, attempts=1000)
        out(f"D {attempts} {t0} {time.time()}")


def race(log: JetStreamLog, args: dict[str, object]) -> None:
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
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand (diagnosis)
    role, raw = sys.argv[1], json.loads(sys.argv[2])
    with JetStreamLog.from_url(
        str(raw["url"]), namespace=str(raw["namespace"]), retry_s=20.0
    ) as js:
        {"cas": cas, "produce": produce, "execute": execute, "race": race}[role](js, raw)
