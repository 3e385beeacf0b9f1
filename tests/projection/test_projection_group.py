"""Projector workers as a consumer group of real processes: members joining, leaving and
dying while events arrive; frozen (SIGSTOP) workers whose late transactions must never
apply events another worker owns.

Duplicates cannot hide: the ``balances`` projector inserts one row per event into a marker
table whose primary key is ``(topic, partition, offset)`` (and ``event_id`` is unique), so
applying an event twice raises inside the handler and would surface as a dead letter. Gaps
cannot hide either: the marker rows must be exactly the log's coordinates.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from projection_kit import (
    BOTH,
    Producer,
    Workers,
    child_env,
    fold_accounts,
    group_members,
    integrity,
    positions,
    read_balances,
    read_markers,
    view,
    wait_caught_up,
)

from eventlane.consumer.coordinator import GroupCoordinator
from eventlane.log import LogStore, TopicPartition


class MonotonicPositions(threading.Thread):
    """Samples the read model's positions every few ms; any step backwards is recorded."""

    def __init__(self, data: Path, name: str = "balances") -> None:
        super().__init__(daemon=True)
        self.data, self.name = data, name
        self.stop = threading.Event()
        self.backwards: list[tuple[TopicPartition, int, int]] = []
        self.samples = 0

    def run(self) -> None:
        last: dict[TopicPartition, int] = {}
        with view(self.data, self.name) as reader:
            while not self.stop.is_set():
                for tp, pos in reader.positions().items():
                    if pos < last.get(tp, -1):
                        self.backwards.append((tp, last[tp], pos))
                    last[tp] = max(pos, last.get(tp, -1))
                self.samples += 1
                time.sleep(0.005)

    def finish(self) -> None:
        self.stop.set()
        self.join()
        assert self.samples > 10
        assert self.backwards == []


def check_exactly_once(data: Path) -> None:
    fold = fold_accounts(data)
    markers = read_markers(data)
    assert len(markers) == len(set(markers))
    assert set(markers) == fold.events  # every event applied once: no gap, no duplicate
    assert read_balances(data) == fold.balances
    assert integrity(data, "balances") == "ok"
    with view(data, "balances") as reader:
        assert reader.dead_letter_counts() == {}


def group_owners(data: Path, group: str) -> dict[str, list[TopicPartition]]:
    log = LogStore(data)
    coord = GroupCoordinator(log, group)
    try:
        return {mid: sorted(m.owned) for mid, m in coord.current().members.items()}
    finally:
        coord.close()
        log.close()


def test_three_workers_six_partitions_members_join_and_leave(
    data: Path, workers: Workers, producer: Producer
) -> None:
    producer.deposits(6_000, accounts=120)
    sampler = MonotonicPositions(data)
    sampler.start()
    first = [workers.start(session_timeout_ms=1000, max_poll_records=100) for _ in range(3)]
    # The three share the six partitions, two each.
    deadline = time.monotonic() + 30
    while True:
        owners = group_owners(data, "balances")
        if len(owners) == 3 and sorted(len(v) for v in owners.values()) == [2, 2, 2]:
            break
        assert time.monotonic() < deadline, owners
        time.sleep(0.05)
    stop_producing = threading.Event()

    def produce() -> None:
        while not stop_producing.is_set():
            producer.deposits(300, accounts=120)
            time.sleep(0.05)

    feeder = threading.Thread(target=produce, daemon=True)
    feeder.start()
    try:
        time.sleep(1.0)
        joiner = workers.start(session_timeout_ms=1000, max_poll_records=100)  # joins
        workers.wait_joined(joiner)
        time.sleep(1.0)
        assert workers.term(first[0]) == 0  # graceful leave: its partitions move at once
        time.sleep(1.0)
        workers.kill9(first[1])  # dies: its partitions move after the session timeout
        time.sleep(1.5)
        late = workers.start(session_timeout_ms=1000, max_poll_records=100)  # joins
        workers.wait_joined(late)
        time.sleep(1.0)
        assert workers.term(joiner) == 0
        time.sleep(1.0)
    finally:
        stop_producing.set()
        feeder.join()
    wait_caught_up(data, "balances", timeout=120)
    assert workers.term(first[2]) == 0
    assert workers.term(late) == 0
    sampler.finish()
    check_exactly_once(data)


@BOTH
def test_frozen_worker_late_batch_is_fenced(
    data: Path, workers: Workers, producer: Producer, tmp_path: Path
) -> None:
    producer.deposits(4_000, accounts=100)
    flag = tmp_path / "zombie.json"
    sampler = MonotonicPositions(data)
    sampler.start()
    zombie = workers.start(
        session_timeout_ms=1000,
        module="tests.projection.bankapp",
        env=child_env(BANKAPP_SELF_STOP=str(flag)),
    )
    deadline = time.monotonic() + 30
    while not flag.exists() or not flag.read_text():
        assert zombie.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    in_hand = json.loads(flag.read_text())  # polled, not applied, process stopped
    other = workers.start(session_timeout_ms=1000)
    wait_caught_up(data, "balances", timeout=120)  # the other worker applied everything
    assert list(group_members(data, "balances")) == [other.pid]  # the zombie was evicted
    zombie.send_signal(__import__("signal").SIGCONT)
    log_text = ""
    deadline = time.monotonic() + 30
    while "ZOMBIE-RESULT" not in log_text:
        assert time.monotonic() < deadline, log_text[-2000:]
        time.sleep(0.05)
        log_text = zombie.log_path.read_text()  # type: ignore[attr-defined]
    assert "ZOMBIE-RESULT refused" in log_text
    assert "batch refused: partition owned by a newer generation" in log_text
    assert in_hand["spans"]
    # The zombie rejoins as a fresh member and shares the work from the stored positions.
    producer.deposits(2_000, accounts=100)
    wait_caught_up(data, "balances", timeout=120)
    assert workers.term(zombie) == 0
    assert workers.term(other) == 0
    sampler.finish()
    check_exactly_once(data)


def test_worker_frozen_inside_its_transaction(
    data: Path, workers: Workers, producer: Producer, tmp_path: Path
) -> None:
    """Frozen while holding SQLite's write lock: the new owner's claim waits for the lock,
    the frozen transaction (which passed the fencing check) commits on SIGCONT, and the new
    owner resumes after it: nothing applied twice, nothing skipped."""
    producer.deposits(3_000, accounts=100)
    flag = tmp_path / "stopped.json"
    sampler = MonotonicPositions(data)
    sampler.start()
    frozen = workers.start(
        session_timeout_ms=1000, env=child_env(BANKAPP_STOP_IN_HANDLER=str(flag))
    )
    deadline = time.monotonic() + 30
    while not flag.exists() or not flag.read_text():
        assert frozen.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    other = workers.start(session_timeout_ms=1000)
    # The frozen member is evicted and the other owns every partition; its claim now waits
    # for the write lock the frozen transaction holds.
    deadline = time.monotonic() + 120
    while list(group_members(data, "balances")) != [other.pid]:
        assert time.monotonic() < deadline, group_members(data, "balances")
        time.sleep(0.05)
    time.sleep(1.0)
    assert sum(positions(data, "balances").values()) < producer.count  # still blocked
    frozen.send_signal(__import__("signal").SIGCONT)
    wait_caught_up(data, "balances", timeout=120)
    producer.deposits(1_000, accounts=100)
    wait_caught_up(data, "balances", timeout=120)
    assert workers.term(frozen) == 0
    assert workers.term(other) == 0
    sampler.finish()
    check_exactly_once(data)
