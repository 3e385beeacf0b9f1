"""Poison events at 1% of a stream, with real worker processes: exactly those land in the
dead-letter table and the ``balances.dlq`` topic, with the error and the raw bytes; the rest
are applied; no partition stalls; ``eventlane dlq retry`` after the code fix applies them."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
from projection_kit import (
    BOTH,
    ROOT,
    Producer,
    Workers,
    child_env,
    fold_accounts,
    hwms,
    integrity,
    positions,
    read_balances,
    read_markers,
    view,
    wait_caught_up,
)

from eventlane.consumer.free import Consumer
from eventlane.log import LogStore, TopicPartition
from eventlane.projection import dlq_topic

APP = "tests.projection.bankapp:app"
CLI = "from eventlane.cli import main; main(prog_name='eventlane')"


class StallWatch(threading.Thread):
    """Longest time any partition with lag kept the same position."""

    def __init__(self, data: Path) -> None:
        super().__init__(daemon=True)
        self.data = data
        self.stop = threading.Event()
        self.longest = 0.0

    def run(self) -> None:
        while not positions(self.data, "balances"):
            time.sleep(0.01)
        log = LogStore(self.data)
        since: dict[TopicPartition, tuple[int, float]] = {}
        with view(self.data, "balances") as reader:
            while not self.stop.is_set():
                now = time.monotonic()
                pos = reader.positions()
                for p in range(6):
                    tp = TopicPartition("accounts", p)
                    hwm = log.offsets("accounts", p).hwm
                    current = pos.get(tp, -1)
                    last = since.get(tp)
                    if current >= hwm or last is None or last[0] != current:
                        since[tp] = (current, now)
                    else:
                        self.longest = max(self.longest, now - last[1])
                time.sleep(0.02)
        log.close()


def cli(data: Path, *args: str, fixed: bool = False) -> subprocess.CompletedProcess[str]:
    env = child_env(EVENTLANE_LOG_LEVEL="warning")
    if fixed:
        env["BANKAPP_FIXED"] = "1"
    return subprocess.run(
        [sys.executable, "-c", CLI, *args, "--data", str(data)],
        env=env,
        cwd=str(ROOT),
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def dlq_records(data: Path) -> dict[bytes, tuple[bytes | None, dict[str, bytes | None]]]:
    log = LogStore(data)
    try:
        topic = dlq_topic("balances")
        consumer = Consumer(log, auto_offset_reset="earliest")
        consumer.assign([TopicPartition(topic, 0)])
        end = log.offsets(topic, 0).hwm
        out = {}
        seen = 0
        while seen < end:
            for r in consumer.poll(1.0):
                seen = r.offset + 1
                assert r.key is not None
                out[r.key] = (r.value, dict(r.headers))
        consumer.close()
        return out
    finally:
        log.close()


@BOTH
def test_poison_one_percent_dead_lettered_then_retried(
    engine: str, data: Path, workers: Workers, producer: Producer
) -> None:
    # PostgreSQL pays a round trip per statement (~2-3 ms each on a loaded 2-core machine):
    # 30 % of the events at three times the poison rate (about as many letters), and a stall
    # bound that allows for a few batches' worth of round trips.
    pg = engine == "postgresql"
    rng = random.Random(7)
    rate, scale, stall = (0.03, 0.3, 30.0) if pg else (0.01, 1.0, 5.0)
    poison = lambda i: rng.random() < rate  # noqa: E731
    producer.deposits(int(6_000 * scale), accounts=200, poison=poison)
    watch = StallWatch(data)
    watch.start()
    first = workers.start(session_timeout_ms=2000, max_poll_records=200)
    second = workers.start(session_timeout_ms=2000, max_poll_records=200)
    for _ in range(10):  # and more keeps coming while they work
        producer.deposits(int(400 * scale), accounts=200, poison=poison)
        time.sleep(0.1)
    wait_caught_up(data, "balances", timeout=300 if pg else 120)
    watch.stop.set()
    watch.join()
    assert watch.longest < stall, f"a partition stalled for {watch.longest:.1f} s"

    fold = fold_accounts(data)
    assert 50 <= len(fold.poison) <= 150
    assert read_balances(data) == fold.balances  # the rest applied
    assert set(read_markers(data)) == fold.events - fold.poison

    # Exactly the poison events are dead letters, with the error and the raw bytes...
    listed = cli(data, "dlq", "list", APP, "--projection", "balances", "--json")
    assert listed.returncode == 0, listed.stderr
    letters = orjson.loads(listed.stdout)
    assert {(d["topic"], d["partition"], d["offset"]) for d in letters} == fold.poison
    raw = {}
    log = LogStore(data)
    for topic, p, o in fold.poison:
        records, _ = log.read(topic, p, o, max_bytes=1)
        raw[(topic, p, o)] = next(r.value for r in records if r.offset == o)
    log.close()
    for d in letters:
        assert d["status"] == "dead" and "cannot apply poison deposit" in d["error"]
        assert d["value"].encode() == raw[(d["topic"], d["partition"], d["offset"])]
    # ... and copies of exactly those are on the <group>.dlq topic.
    copies = dlq_records(data)
    assert set(copies) == {f"{t}/{p}/{o}".encode() for t, p, o in fold.poison}
    for (t, p, o), value in raw.items():
        copy_value, headers = copies[f"{t}/{p}/{o}".encode()]
        assert copy_value == value
        assert b"cannot apply poison deposit" in (headers["dlq-error"] or b"")

    shown = cli(data, "dlq", "show", APP, str(letters[0]["id"]), "--projection", "balances")
    assert shown.returncode == 0, shown.stderr
    assert "cannot apply poison deposit" in shown.stdout and '"memo":"poison"' in shown.stdout

    # Retrying before the fix changes nothing; after it, every letter applies.
    again = cli(data, "dlq", "retry", APP, "--projection", "balances")
    assert again.returncode == 1
    assert f"succeeded: 0  failed: {len(fold.poison)}" in again.stdout
    done = cli(data, "dlq", "retry", APP, "--projection", "balances", fixed=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"succeeded: {len(fold.poison)}  failed: 0" in done.stdout

    full = fold_accounts(data, include_poison=True)
    assert read_balances(data) == full.balances
    markers = read_markers(data)
    assert len(markers) == len(set(markers)) and set(markers) == full.events
    with view(data, "balances") as reader:
        assert reader.dead_letter_counts() == {"retried": len(fold.poison)}
        assert reader.positions() == hwms(data, "accounts")  # retries never move positions
    assert workers.term(first) == 0 and workers.term(second) == 0
    assert integrity(data, "balances") == "ok"
