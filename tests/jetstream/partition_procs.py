"""Child processes of the partition tests: ``python partition_procs.py ROLE '<json>'``, run in
the client namespace (tests/jetstream/ns_hosts.py). Arguments: ``url``, ``namespace``, ``topic``
plus the role's own. Every line on stdout is data for the test:

``setup``    creates ``topic`` with ``partitions`` partitions and moves stream leaders until
             partition 0's leader leads no other partition; prints one JSON line
             ``{"leaders": [node of partition p, ...]}``.
``leaders``  prints the same JSON line (no changes), once every partition has a leader.
``write``    one thread per partition appends records ``<tag>:<p>:<i>`` under the key
             ``<tag>-<p>``, every other one conditional on the key's head (``Expect``), until
             the file ``stop`` exists or ``seconds`` pass; one more thread per partition
             reads it (offsets, then the records from where it got to). Lines:
             ``A <p> <offset> <value> <t0> <t1>``   acknowledged (sent at t0, acked at t1)
             ``E <p> <value> <t0> <t1> <class> <indeterminate> <message>``  a failed append
             ``R <p> <t> <class> <message>``        a failed read (eventlane error)
             ``H <p> <before> <after>``             a reader saw its high-water mark go back
             ``X <p> <module.class> <message>``     an error that is not eventlane's
             ``D``                                   done
``execute``  one thread per aggregate ``c0``..``c<n>`` runs ``Runtime.execute`` of
             ``Counter.increment`` tagged ``<tag>:<agg>:<i>`` until ``stop``/``seconds``:
             ``A <agg> <i> <t0> <t1>`` done; ``E <agg> <i> <t0> <t1> <class> <indeterminate>
             <message>`` failed; ``X`` as above.
``readback`` prints ``{"p": [[offset, value], ...], ...}``: every record of every partition.
``counters`` prints ``{"<agg>": [writer tag of each stored event, in order], ...}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

from store_domain import Counter, make_app, raw_streams

from eventlane.errors import FrameworkError
from eventlane.log.jetstream import mapping
from eventlane.log.jetstream.log import Expect, JetStreamLog
from eventlane.observability import configure_logging

_print = threading.Lock()


def out(line: str) -> None:
    with _print:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _leaders(log: JetStreamLog, topic: str, count: int) -> list[str | None]:
    return [log.placement(topic, p)[1] for p in range(count)]


def setup(log: JetStreamLog, args: dict[str, Any]) -> None:
    topic, count = str(args["topic"]), int(args["partitions"])
    log.create_topic(topic, count)
    for _ in range(40):
        leaders = _leaders(log, topic, count)
        if None not in leaders and leaders[0] not in leaders[1:]:
            break
        for p in range(1, count):  # move the others off partition 0's leader
            if leaders[p] is None or leaders[p] == leaders[0]:
                stream = mapping.stream_name(log.namespace, topic, p)
                api = f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"
                log.run(log.nc.request(api, b"", timeout=5))
        time.sleep(0.5)
    out(json.dumps({"leaders": _leaders(log, topic, count)}))


def leaders(log: JetStreamLog, args: dict[str, Any]) -> None:
    """The leaders, once every partition has one (after a heal, an election may still run)."""
    for _ in range(100):
        found = _leaders(log, str(args["topic"]), int(args["partitions"]))
        if None not in found:
            break
        time.sleep(0.2)
    out(json.dumps({"leaders": found}))


def _guard(p: int, body: Any) -> Any:
    """Run ``body``; an error that is not eventlane's is printed as ``X`` and re-raised."""
    try:
        return body()
    except FrameworkError:
        raise
    except BaseException as exc:
        out(f"X {p} {type(exc).__module__}.{type(exc).__qualname__} {str(exc)[:160]!r}")
        raise


def _writer(log: JetStreamLog, topic: str, p: int, tag: str, stop: Path, until: float) -> None:
    key = f"{tag}-{p}".encode()
    head: int | None = None
    known = False
    i = 0
    while not stop.exists() and time.monotonic() < until:
        if not known:
            try:
                head, known = _guard(p, lambda: log.key_head(topic, p, key)), True
            except FrameworkError:
                time.sleep(0.2)
                continue
        value = f"{tag}:{p}:{i}"
        i += 1
        conditional = i % 2 == 0
        t0 = time.time()
        try:
            res = _guard(
                p,
                lambda v=value, c=conditional: log.append(
                    topic,
                    p,
                    [(key, v.encode(), (), None)],
                    expect=Expect(key, head) if c else None,
                ),
            )
        except FrameworkError as exc:
            message = str(exc).replace("\n", " ")[:200]
            out(
                f"E {p} {value} {t0:.3f} {time.time():.3f} {type(exc).__name__}"
                f" {int(exc.indeterminate)} {message!r}"
            )
            known = False  # the key's head is unknown now: ask again
            continue
        head = res.base_offset
        out(f"A {p} {res.base_offset} {value} {t0:.3f} {time.time():.3f}")


def _reader(log: JetStreamLog, topic: str, p: int, stop: Path, until: float) -> None:
    hwm, offset = 0, 0
    while not stop.exists() and time.monotonic() < until:
        try:
            now = _guard(p, lambda: log.offsets(topic, p)).hwm
            if now < hwm:
                out(f"H {p} {hwm} {now}")
            hwm = max(hwm, now)
            if offset < now:
                records, _ = _guard(p, lambda: log.read(topic, p, offset))
                if records:
                    offset = records[-1].offset + 1
        except FrameworkError as exc:
            out(f"R {p} {time.time():.3f} {type(exc).__name__} {str(exc)[:160]!r}")
        time.sleep(0.05)


def write(log: JetStreamLog, args: dict[str, Any]) -> None:
    topic, tag, count = str(args["topic"]), str(args["tag"]), int(args["partitions"])
    stop, until = Path(str(args["stop"])), time.monotonic() + float(args["seconds"])
    threads = [
        threading.Thread(target=_writer, args=(log, topic, p, tag, stop, until))
        for p in range(count)
    ] + [threading.Thread(target=_reader, args=(log, topic, p, stop, until)) for p in range(count)]
    out("R")
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out("D")


def _commands(app: Any, agg: str, tag: str, stop: Path, until: float) -> None:
    i = 0
    while not stop.exists() and time.monotonic() < until:
        i += 1
        writer = f"{tag}:{agg}:{i}"
        t0 = time.time()
        try:
            _guard(
                -1,
                lambda w=writer: app.execute(
                    Counter, agg, lambda c: c.increment(1, w), create=True
                ),
            )
        except FrameworkError as exc:
            message = str(exc).replace("\n", " ")[:200]
            out(
                f"E {agg} {i} {t0:.3f} {time.time():.3f} {type(exc).__name__}"
                f" {int(exc.indeterminate)} {message!r}"
            )
            time.sleep(0.1)
            continue
        out(f"A {agg} {i} {t0:.3f} {time.time():.3f}")


def execute(log: JetStreamLog, args: dict[str, Any]) -> None:
    tag, count = str(args["tag"]), int(args["aggregates"])
    stop, until = Path(str(args["stop"])), time.monotonic() + float(args["seconds"])
    with make_app(log, partitions=int(args["partitions"])) as app:  # type: ignore[arg-type]
        threads = [
            threading.Thread(target=_commands, args=(app, f"c{n}", tag, stop, until))
            for n in range(count)
        ]
        out("R")
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    out("D")


def counters(log: JetStreamLog, args: dict[str, Any]) -> None:
    topic = Counter.topic
    streams = raw_streams(log, topic) if log.topic_exists(topic) else {}  # type: ignore[arg-type]
    out(json.dumps({agg: [e["data"]["writer"] for e in events] for agg, events in streams.items()}))


def readback(log: JetStreamLog, args: dict[str, Any]) -> None:
    """Every record of every partition, read up to its high-water mark; an empty answer
    below it (which the port forbids) is noted under ``"short"`` and asked again."""
    topic, count = str(args["topic"]), int(args["partitions"])
    found: dict[str, Any] = {}
    short: list[tuple[int, int, int]] = []
    stale: list[tuple[int, int, int]] = []
    acked = {int(p): int(n) for p, n in dict(args.get("acked", {})).items()}
    deadline = time.monotonic() + 30  # for all partitions together
    for p in range(count):
        rows: list[tuple[int, str]] = []
        first = hwm = log.offsets(topic, p).hwm
        # The highest of several looks (marks are monotone per reader). A fresh reader may
        # be answered by a replica still catching up after the heal (as a Kafka consumer
        # fetching from a follower may): wait, bounded, until the mark covers the highest
        # acknowledged offset. What is not readable after that is lost, and the test says so.
        for look in range(1000):
            time.sleep(0.3)
            hwm = log.offsets(topic, p).hwm
            if look >= 2 and (hwm >= acked.get(p, 0) or time.monotonic() > deadline):
                break
        if hwm != first:
            stale.append((p, first, hwm))
        offset = 0
        empty = 0
        while offset < hwm and empty < 50:
            batch = log.read(topic, p, offset)[0]
            if not batch:
                short.append((p, offset, hwm))
                empty += 1
                time.sleep(0.1)
                continue
            rows.extend((r.offset, (r.value or b"").decode()) for r in batch)
            offset = batch[-1].offset + 1
        found[str(p)] = rows
    found["short"] = short
    found["stale"] = stale
    out(json.dumps(found))


if __name__ == "__main__":
    configure_logging()  # on stderr: stdout carries data
    role, raw = sys.argv[1], json.loads(sys.argv[2])
    with JetStreamLog.from_url(
        str(raw["url"]), namespace=str(raw["namespace"]), retry_s=float(raw.get("retry_s", 30))
    ) as js:
        roles = {"setup": setup, "leaders": leaders, "write": write, "readback": readback}
        roles |= {"execute": execute, "counters": counters}
        roles[role](js, raw)
