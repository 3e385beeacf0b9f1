"""A child process that runs every lock-taking path of the embedded engine, for the lock-order
test (``tests/log/test_lock_pauses.py``) and its soak.

    EVENTLANE_PAUSES=SEED,P,MAX_MS python tests/log/lock_paths.py '<json arguments>'

Arguments: ``data`` (the data directory, topics already made by the parent: ``t`` with two
partitions, ``c`` compacted, both with small segments), ``tag`` (names this process),
``seed``, ``ops`` (operations per thread), ``threads``.

Each thread draws ``ops`` operations from its own seeded generator: plain appends (with a
key the key index follows), conditional appends on a small shared key set (``expect``: the
group-commit path, conflicts with the other processes expected), ``read_key``,
``key_head``, ``offsets``, a key-index rebuild (its catch-up holds the index lock while it
reads the partition), segment rolls, compaction of ``c``, retention (``delete_records`` on
``t``), and consumer-group commits (a member's, fenced by a precondition, and an admin's
under the group lock). ``EVENTLANE_PAUSES`` makes it sleep at random inside their critical
sections (:mod:`eventlane._pauses`).

stdout, one flushed line each: ``P <thread> <n>`` after each operation (progress, for the
parent's stall detector), ``A <partition> <offset> <id>`` per acknowledged record of ``t``,
``D <thread>`` when a thread is done, ``E <thread> <error>`` on an unexpected error.
SIGUSR1 dumps every thread's stack to stderr (``faulthandler``), for a stalled process.
"""

from __future__ import annotations

import faulthandler
import json
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eventlane.consumer.coordinator import GroupCoordinator
from eventlane.consumer.offsets import OffsetAndMetadata, OffsetStore
from eventlane.errors import ConcurrencyError, PreconditionFailedError
from eventlane.log import Expect, LogStore, TopicPartition
from eventlane.observability import configure_logging, get_logger

KEYS = [b"k%d" % i for i in range(6)]
OPS = (
    ["append"] * 4
    + ["expect"] * 5
    + ["read_key"] * 3
    + ["key_head"] * 2
    + ["offsets"] * 2
    + ["rebuild"] * 3
    + ["roll", "compact", "retention", "commit", "admin_commit", "compacted"]
)

_out_lock = threading.Lock()


def emit(*lines: str) -> None:
    with _out_lock:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()


def run_thread(log: LogStore, offsets: OffsetStore, tag: str, n: int, seed: int, ops: int) -> None:
    rng = random.Random(f"{seed}/{tag}/{n}")
    seq = 0
    for i in range(ops):
        op = rng.choice(OPS)
        p = rng.randrange(2)
        key = rng.choice(KEYS)
        if op == "append":
            rid = f"{tag}.{n}.{seq}"
            seq += 1
            r = log.append("t", p, [(key, rid.encode(), (), None)])
            emit(f"A {p} {r.base_offset} {rid}")
        elif op == "expect":
            rid = f"{tag}.{n}.{seq}"
            seq += 1
            head = log.key_head("t", p, key)
            try:
                r = log.append("t", p, [(key, rid.encode(), (), None)], expect=Expect(key, head))
            except ConcurrencyError:
                pass
            else:
                emit(f"A {p} {r.base_offset} {rid}")
        elif op == "read_key":
            for record in log.read_key("t", p, key):
                assert record.key == key, (record.key, key)
        elif op == "key_head":
            log.key_head("t", p, key)
        elif op == "offsets":
            log.offsets("t", p)
        elif op == "rebuild":
            log.rebuild_keys("t", p)
        elif op == "roll":
            log.roll("t", p)
        elif op == "compacted":
            log.append("c", 0, [(key, b"%d" % i, (), None)])
        elif op == "compact":
            log.roll("c", 0)
            log.compact("c")
        elif op == "retention":
            marks = log.offsets("t", p)
            if marks.hwm - marks.lwm > 40:  # keep most of it: readers must find their keys
                log.delete_records("t", p, marks.lwm + 5)
        elif op == "commit":
            tp = TopicPartition("t", p)
            offsets.commit(
                "g", {tp: OffsetAndMetadata(i)}, generation=1, member_id=tag, precondition=None
            )
        elif op == "admin_commit":
            coord = GroupCoordinator(log, "g2", wake=log.wake)
            with coord.locked():  # the group lock, then the offsets' append lock
                tp = TopicPartition("t", p)
                try:
                    offsets.commit("g2", {tp: OffsetAndMetadata(i)}, generation=0, member_id=tag)
                except PreconditionFailedError:
                    pass
        emit(f"P {n} {i + 1}")


def main() -> None:
    args: dict[str, Any] = json.loads(sys.argv[1])
    configure_logging(level="error")
    # the first log call loads structlog (seconds on a loaded host): not under a lock, here
    get_logger("eventlane.test").debug("child ready")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    log = LogStore(args["data"])
    offsets = OffsetStore(log)
    tag = str(args["tag"])

    def thread(n: int) -> None:
        try:
            run_thread(log, offsets, tag, n, int(args["seed"]), int(args["ops"]))
        except BaseException as exc:
            emit(f"E {n} {type(exc).__name__}: {exc}")
            raise
        emit(f"D {n}")

    workers = [threading.Thread(target=thread, args=(n,)) for n in range(int(args["threads"]))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    log.close()


if __name__ == "__main__":
    main()
