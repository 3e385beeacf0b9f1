"""Child processes of the PostgreSQL failover test: ``python pg_failover_procs.py ROLE '<json>'``,
run in a client namespace (tests/jetstream/ns_hosts.py). Arguments: ``url`` (the cluster),
``namespace``, ``local`` (a local directory), ``readmodels`` (the PostgreSQL URL) plus the
role's own. One JSON line on
stdout:

``produce``  appends ``count`` deposits/withdrawals of the bank app (tests/projection/
             bankapp.py) to ``accounts`` (created with the app's partitions if missing), in
             batches of ``batch``; prints ``{"appended": N}``.
``owners``   ``{"<pid>": ["accounts/<p>", ...]}``: the group ``balances``'s members and what
             each owns, from the cluster's group state.
``wait``     polls ``owners`` or the positions until a condition holds (see :func:`wait`).
``check``    the oracle and the read model: ``fold`` (balance and event count per account
             from the raw JSON values), ``events`` (every record's coordinates), ``hwm`` per
             partition; from PostgreSQL: ``balances``, ``markers`` (the ``applied`` rows, one
             per applied event), ``positions``, ``dead_letters``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import orjson
import psycopg

from eventlane.codec import Envelope
from eventlane.consumer.coordination import coordination_for
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.local import LocalDir
from eventlane.log.partitioner import partition_for_key
from tests.projection import bankapp


def produce(log: JetStreamLog, args: dict[str, Any]) -> dict[str, Any]:
    with bankapp.app.open(log) as runtime:
        topic = runtime.names.topic("accounts")
        partitions = log.partition_count(topic)
        start, count = int(args["start"]), int(args["count"])
        batches: dict[int, list[Any]] = {}
        for i in range(start, start + count):
            aid = f"acc-{i % 40}"
            version = i // 40 + 1  # each account's versions run on across calls
            event = bankapp.Withdrawn(i % 7) if i % 5 == 4 else bankapp.Deposited(i % 100 + 1)
            key, value, headers = runtime.codec.encode(Envelope(event, aid, version))
            batches.setdefault(partition_for_key(key, partitions), []).append(
                (key, value, tuple(headers), None)
            )
        for p, records in sorted(batches.items()):
            for at in range(0, len(records), int(args.get("batch", 50))):
                log.append(topic, p, records[at : at + int(args.get("batch", 50))])
    return {"appended": count}


def owners(log: JetStreamLog, args: dict[str, Any]) -> dict[str, Any]:
    groups = coordination_for(log)
    group = bankapp.app.names.group("balances")
    if not groups.has_state(group):
        return {}
    coord = groups.coordinator(group)
    try:
        state = coord.current()
        alive = set(coord.alive(state))
        return {
            str(m.pid): sorted(f"{tp.topic}/{tp.partition}" for tp in m.owned)
            for m in state.members.values()
            if m.member_id in alive
        }
    finally:
        coord.close()


def check(log: JetStreamLog, args: dict[str, Any]) -> dict[str, Any]:
    topic = bankapp.app.names.topic("accounts")
    fold: dict[str, list[int]] = {}
    events: list[list[Any]] = []
    hwm: dict[str, int] = {}
    for p in range(log.partition_count(topic)):
        marks = log.offsets(topic, p)
        hwm[str(p)] = marks.hwm
        offset = marks.lwm
        while offset < marks.hwm:
            records, _ = log.read(topic, p, offset)
            for r in records:
                events.append([r.topic, r.partition, r.offset])
                doc = orjson.loads(r.value or b"null")
                amount = doc["data"]["amount"] * (-1 if doc["type"] == "Withdrawn" else 1)
                total, n = fold.get(doc["aggregate_id"], [0, 0])
                fold[doc["aggregate_id"]] = [total + amount, n + 1]
            offset = records[-1].offset + 1
    with psycopg.connect(args["readmodels"], autocommit=True) as db:
        db.execute("SET search_path TO balances")
        balances = {r[0]: [int(r[1]), int(r[2])] for r in db.execute("SELECT * FROM balances")}
        markers = [list(r) for r in db.execute('SELECT topic, partition, "offset" FROM applied')]
        positions = {
            str(p): int(o)
            for _t, p, o in db.execute(
                "SELECT topic, partition, next_offset FROM _eventlane_positions"
            )
        }
        letters = db.execute("SELECT count(*) FROM _eventlane_dead_letters").fetchone()[0]
    return {
        "fold": fold,
        "events": events,
        "hwm": hwm,
        "balances": balances,
        "markers": markers,
        "positions": positions,
        "dead_letters": int(letters),
    }


def wait(log: JetStreamLog, args: dict[str, Any]) -> dict[str, Any]:
    """Poll until ``until`` holds (``owners``: the set of live members owning partitions is
    exactly ``pids``; ``caught_up``: every position at its high-water mark) or ``timeout``
    seconds pass; prints ``{"ok": bool, "seconds": s, "last": ...}``."""
    t0 = time.monotonic()
    while True:
        if args["until"] == "owners":
            last: Any = owners(log, args)
            ok = {pid for pid, owned in last.items() if owned} == set(args["pids"])
            ok = ok and len(last) == len(args["pids"])
        else:
            doc = check(log, args)
            last = {"positions": doc["positions"], "hwm": doc["hwm"]}
            ok = all(doc["positions"].get(p, -1) >= h for p, h in doc["hwm"].items())
        seconds = time.monotonic() - t0
        if ok or seconds > float(args["timeout"]):
            return {"ok": ok, "seconds": seconds, "last": last}
        time.sleep(0.3)


def main() -> None:
    role, args = sys.argv[1], json.loads(sys.argv[2])
    local = LocalDir.at(Path(args["local"]))
    with JetStreamLog.from_url(args["url"], namespace=args["namespace"], local=local) as log:
        result = {"produce": produce, "owners": owners, "check": check, "wait": wait}[role](
            log, args
        )
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
