"""Recovering a crash state with eventlane, and checking it against the acknowledgements.

The expectations come only from the workload's acknowledgement log up to the crash point
(:mod:`tests.powerloss.workload`), never from eventlane's own bookkeeping:

* **records**: every acknowledged record is at its acknowledged offset with its value, except
  below a low-water mark that a retention pass begun before the crash could have set, and,
  on the compacted topic once a compaction has begun, records superseded by a later
  acknowledged record of the same key. Every record present is one the workload attempted
  (no invented or torn record is served), at most once, in increasing offsets, and at its
  acknowledged offset if it was acknowledged (an offset is never reused);
* **event store**: each aggregate loads at least at its acknowledged version, and its state
  is the fold of exactly the events it loads (amounts from the workload's log);
* **read model** (read with plain ``sqlite3``): each position is at least the acknowledged
  one and at most the recovered log end, and each balance is the fold of the recovered
  ``accounts`` records below the positions;
* **consumer group**: each committed offset is at least the acknowledged commit and at most
  the recovered log end;
* ``verify`` finds nothing, and opening everything raises nothing.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eventlane.consumer.offsets import OffsetStore
from eventlane.log import LogStore, Record, TopicPartition
from eventlane.projection import open_readmodel
from tests.powerloss import workload as w


@dataclass
class Expectations:
    """What the acknowledgement log up to a crash point promises."""

    attempted: set[str] = field(default_factory=set)
    acked: dict[tuple[str, int], dict[int, tuple[str, str | None]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    max_lwm: dict[tuple[str, int], int] = field(default_factory=dict)
    compaction_begun: set[str] = field(default_factory=set)
    versions: dict[str, int] = field(default_factory=dict)
    amounts: dict[tuple[str, int], int] = field(default_factory=dict)
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    commits: dict[tuple[str, int], int] = field(default_factory=dict)
    states: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))


def expectations(acks: list[str], all_acks: list[str]) -> Expectations:
    """Expectations from the acknowledgements before the crash (``acks``, a prefix of
    ``all_acks``: the whole run's, used only for the bound a running pass could reach)."""
    exp = Expectations()
    docs = [orjson.loads(a) for a in acks]
    later = [orjson.loads(a) for a in all_acks[len(acks) :]]
    for i, d in enumerate(docs):
        k = d["k"]
        if k == "try":
            exp.attempted.add(d["v"])
        elif k == "rec":
            exp.acked[(d["t"], d["p"])][d["o"]] = (d["v"], d["key"])
        elif k == "compact" and d["phase"] == "begin":
            exp.compaction_begun.add(d["t"])
        elif k == "retain" and d["phase"] == "begin":
            # the pass may have reached the lwm it reported at its end (maybe after the crash)
            for e in docs[i + 1 :] + later:
                if e["k"] == "retain" and e["phase"] == "end":
                    key = (e["t"], e["p"])
                    exp.max_lwm[key] = max(exp.max_lwm.get(key, 0), e["lwm"])
                elif e["k"] != "retain":
                    break
        elif k == "aggtry":
            exp.amounts[(d["id"], d["version"])] = d["amount"]
        elif k == "agg":
            exp.versions[d["id"]] = max(exp.versions.get(d["id"], 0), d["version"])
        elif k == "rm":
            exp.positions[(d["t"], d["p"])] = d["pos"]
        elif k == "commit":
            exp.commits[(d["t"], d["p"])] = d["o"]
        elif k == "state":
            exp.states[d["path"]].append(bytes.fromhex(d["hex"]))
    return exp


def _read_all(log: LogStore, topic: str, partition: int) -> list[Record]:
    out: list[Record] = []
    offset = log.offsets(topic, partition).lwm
    while True:
        batch, _ = log.read(topic, partition, offset)
        if not batch:
            return out
        out.extend(batch)
        offset = batch[-1].offset + 1


def check(data: Path, exp: Expectations) -> list[str]:
    """Recover ``data`` with eventlane and return every violation found (empty: fine)."""
    problems: list[str] = []
    log = LogStore(data)
    try:
        problems += _check_log(log, exp)
        problems += _check_app(log, exp)
        problems += [f"verify: {p}" for p in log.verify()]
    finally:
        log.close()
    return problems


def _check_log(log: LogStore, exp: Expectations) -> list[str]:
    problems: list[str] = []
    topics = set(log.list_topics())
    seen: set[str] = set()
    for (topic, p), acked in sorted(exp.acked.items()):
        if topic not in topics:
            problems.append(f"{topic}: topic lost with {len(acked)} acknowledged records")
            continue
        records = _read_all(log, topic, p)
        lwm = log.offsets(topic, p).lwm
        allowed_lwm = exp.max_lwm.get((topic, p), 0)
        if lwm > allowed_lwm and any(o < lwm for o in acked):
            problems.append(f"{topic}-{p}: low-water mark {lwm} > {allowed_lwm} (retention)")
        present = {r.offset: r for r in records}
        latest_of_key: dict[str | None, int] = {}
        for o, (_, key) in acked.items():
            if key is not None:
                latest_of_key[key] = max(latest_of_key.get(key, -1), o)
        compacted = topic in exp.compaction_begun
        for o, (value, key) in sorted(acked.items()):
            if o < lwm:
                continue
            r = present.get(o)
            if r is None:
                if compacted and key is not None and latest_of_key[key] > o:
                    continue
                problems.append(f"{topic}-{p}: acknowledged offset {o} ({value[:12]}) lost")
            elif r.value is None or r.value.decode(errors="replace") != value:
                problems.append(
                    f"{topic}-{p}: offset {o} holds {r.value!r:.30}, acked {value[:12]}"
                )
        last = -1
        acked_values = {v: o for o, (v, _) in acked.items()}
        for r in records:
            v = r.value.decode(errors="replace") if r.value is not None else "<null>"
            if r.offset <= last:
                problems.append(f"{topic}-{p}: offsets not increasing at {r.offset}")
            last = r.offset
            if v not in exp.attempted:
                problems.append(
                    f"{topic}-{p}: offset {r.offset} holds a record never acknowledged"
                    f" nor attempted before the crash: {v[:30]!r}"
                )
            if v in seen:
                problems.append(f"{topic}-{p}: value {v[:12]} appears twice")
            seen.add(v)
            if v in acked_values and acked_values[v] != r.offset:
                problems.append(
                    f"{topic}-{p}: {v[:12]} acked at {acked_values[v]}, found at {r.offset}"
                )
    return problems


def _check_app(log: LogStore, exp: Expectations) -> list[str]:
    problems: list[str] = []
    topics = set(log.list_topics())
    if not exp.versions and not exp.positions:
        return problems
    if w.ACCOUNTS not in topics:
        return [f"{w.ACCOUNTS}: topic lost with acknowledged saves"]
    runtime = w.app.open(log, create_topics=False)
    try:
        for ident, version in sorted(exp.versions.items()):
            account = runtime.load(w.Account, ident)
            if account.version < version:
                problems.append(
                    f"aggregate {ident}: loads at v{account.version} < acked v{version}"
                )
            want = sum(exp.amounts.get((ident, v), 0) for v in range(1, account.version + 1))
            if account.balance != want:
                problems.append(f"aggregate {ident}: balance {account.balance} != {want}")
        ends = {p: log.offsets(w.ACCOUNTS, p).hwm for p in range(log.partition_count(w.ACCOUNTS))}
        problems += _check_readmodel(runtime, log, exp, ends)
        offsets = OffsetStore(log)
        for (topic, p), acked in sorted(exp.commits.items()):
            entry = offsets.committed(w.BALANCES, TopicPartition(topic, p))
            got = -1 if entry is None else entry.offset
            if got < acked:
                problems.append(f"group commit {topic}-{p}: {got} < acknowledged {acked}")
            if got > ends[p]:
                problems.append(f"group commit {topic}-{p}: {got} beyond the log end {ends[p]}")
    finally:
        runtime.close()
    return problems


def _check_readmodel(
    runtime: Any, log: LogStore, exp: Expectations, ends: dict[int, int]
) -> list[str]:
    problems: list[str] = []
    path = runtime.readmodel_path(w.BALANCES)
    if not path.exists():
        return [f"read model lost with positions {exp.positions}"] if exp.positions else []
    readmodel = open_readmodel(runtime, w.BALANCES)  # eventlane's own open (recovery)
    readmodel.close()
    conn = sqlite3.connect(path)
    try:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            return [f"read model integrity_check: {integrity}"]
        positions = {
            (t, p): o
            for t, p, o in conn.execute(
                "SELECT topic, partition, next_offset FROM _eventlane_positions"
            )
        }
        balances = (
            dict(conn.execute("SELECT id, total FROM balances").fetchall())
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name='balances'").fetchone()
            else {}
        )
    finally:
        conn.close()
    for key, acked in sorted(exp.positions.items()):
        if positions.get(key, 0) < acked:
            problems.append(f"read model position {key}: {positions.get(key)} < acked {acked}")
    want: dict[str, int] = defaultdict(int)
    for (topic, p), pos in positions.items():
        if pos > ends.get(p, 0):
            problems.append(f"read model position {topic}-{p}: {pos} beyond the log end {ends[p]}")
            continue
        for r in _read_all(log, topic, p):
            if r.offset >= pos or r.value is None:
                continue
            doc = orjson.loads(r.value)
            ident = doc["aggregate_id"] if "aggregate_id" in doc else r.key.decode()  # type: ignore[union-attr]
            want[ident] += exp.amounts.get((ident, doc["aggregate_version"]), 0)
    if {k: v for k, v in want.items() if v} != {k: v for k, v in balances.items() if v}:
        problems.append(f"read model balances {balances} != fold of the log {dict(want)}")
    return problems
