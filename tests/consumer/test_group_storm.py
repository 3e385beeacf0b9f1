"""Rebalance storms and repeated zombies (reliability plan G1/G2), across real processes.

The default suite runs a short storm and a few zombie rounds; ``-m soak`` runs the long
versions (``EVENTLANE_SOAK_SECONDS``, default 60; ``EVENTLANE_SOAK_ZOMBIES``, default 50).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from group_members import (
    GROUP,
    TOPIC,
    Feeder,
    Member,
    all_committed,
    hwms,
    overlaps,
    processed,
    produce,
    start_member,
    wait_for,
)

from eventlane.consumer.offsets import OffsetStore
from eventlane.log import LogStore, TopicPartition

START_S = 60.0


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogStore]:
    store = LogStore(tmp_path / "data")
    yield store
    store.close()


def intervals_until(
    members: list[Member], ended: dict[str, float], end: float, *, evictions: bool = True
) -> dict[int, list[tuple[float, float, str]]]:
    """Ownership intervals; a killed member's open intervals end when it was killed, and
    intervals ended by eviction are left out: only live members must not overlap.

    A member learns of its eviction later (``lost``); a killed member never does, so its
    open interval of a partition that another member was given before the kill (without a
    release: only an eviction does that) ended by eviction too (``evictions=False``: kept,
    ending at the kill)."""
    given: dict[int, list[tuple[float, str]]] = {}  # partition -> (when, to whom)
    for m in members:
        for ev in m.of("assigned"):
            for p in ev["tps"]:
                given.setdefault(p, []).append((ev["t"], m.name))
    out: dict[int, list[tuple[float, float, str]]] = {}
    for m in members:
        since: dict[int, float] = {}
        for ev in m.read():
            if ev["ev"] == "assigned":
                for p in ev["tps"]:
                    since[p] = ev["t"]
            elif ev["ev"] == "revoked":
                for p in ev["tps"]:
                    out.setdefault(p, []).append((since.pop(p), ev["t"], m.name))
            elif ev["ev"] == "lost":
                for p in ev["tps"]:
                    since.pop(p)
        killed = ended.get(m.name)
        for p, t in since.items():
            if (
                evictions
                and killed is not None
                and any(t < when <= killed and who != m.name for when, who in given.get(p, []))
            ):
                continue  # evicted before it was killed: it would have reported ``lost``
            out.setdefault(p, []).append((t, ended.get(m.name, end), m.name))
    return out


def storm(store: LogStore, members: list[Member], tmp_path: Path, seconds: float) -> None:
    rng = random.Random(20240501)
    store.create_topic(TOPIC, 6)
    common = {
        "data": str(store.path),
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 150,
        "delay": 0.03,  # processing takes a while: a premature grant would show
        "commit": "after",
    }
    alive: list[Member] = []
    ended: dict[str, float] = {}
    counter = 0

    def spawn() -> None:
        nonlocal counter
        m = start_member(f"s{counter}", tmp_path, **common)
        counter += 1
        members.append(m)
        alive.append(m)

    for _ in range(3):
        spawn()
    wait_for(lambda: all(m.of("assigned") for m in alive), START_S, "first members", alive)
    kills = closes = 0
    with Feeder(store, 6):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.15, 0.4))
            if len(alive) < 2 or (len(alive) < 6 and rng.random() < 0.5):
                spawn()
                continue
            victim = alive.pop(rng.randrange(len(alive)))
            if (kills + closes) % 2 == 0:
                victim.proc.kill()
                ended[victim.name] = time.monotonic()
                victim.proc.wait()
                kills += 1
            else:
                victim.signal(signal.SIGTERM)  # graceful: revoke, commit, leave
                closes += 1
    spawn()
    wait_for(lambda: all_committed(store, 6), 120, "everything committed", alive)
    for m in alive:
        m.stop()
    end = time.monotonic()
    for m in members:
        if m.proc.poll() is None:
            m.proc.wait(30)
    assert kills >= 2 and closes >= 2
    assert overlaps(intervals_until(members, ended, end)) == []
    done = set(processed(members))
    marks = hwms(store, 6)
    assert [(p, o) for p in range(6) for o in range(marks[p]) if (p, o) not in done] == []
    for m in members:  # a member only ever sees generations grow
        gens = [(ev["member"], ev["gen"]) for ev in m.read() if ev["ev"] == "records"]
        for (m1, g1), (m2, g2) in itertools.pairwise(gens):
            assert m1 != m2 or g1 <= g2


def zombie_rounds(store: LogStore, members: list[Member], tmp_path: Path, rounds: int) -> None:
    """SIGSTOP one of two members past its session timeout, ``rounds`` times: every commit
    it attempts as its old self is rejected, and committed offsets never go back."""
    store.create_topic(TOPIC, 4)
    produce(store, 400, 4)
    common = {
        "data": str(store.path),
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": 1000,
        "heartbeat_interval_ms": 100,
        "delay": 0.15,
        "max_records": 20,
        "commit": "after",
    }
    a, b = start_member("a", tmp_path, **common), start_member("b", tmp_path, **common)
    members.extend([a, b])
    rejected = 0
    for n in range(rounds):
        zombie, other = (a, b) if n % 2 == 0 else (b, a)
        wait_for(lambda: len(a.owned()) == len(b.owned()) == 2, START_S, "2/2", members)
        seen = len(zombie.of("processing"))
        produce(store, 40, 4, start=1000 * (n + 1))
        wait_for(lambda: len(zombie.of("processing")) > seen, 30, "processing", members)
        zombie.signal(signal.SIGSTOP)
        stopped = time.monotonic()
        old = zombie.of("records")[-1]["member"]
        wait_for(lambda: other.owned() == set(range(4)), 30, "takeover", [other])
        assert time.monotonic() - stopped < 1.0 + 3.0
        zombie.signal(signal.SIGCONT)
        wait_for(
            lambda: (
                any(e["member"] != old and e["t"] > stopped for e in zombie.of("records"))
                or any(e["t0"] > stopped for e in zombie.of("commit"))
            ),
            30,
            "zombie resumes",
            members,
        )
        late = [e for e in zombie.of("commit") if e["t0"] > stopped and e["member"] == old]
        assert all(not e["ok"] for e in late), late
        rejected += len(late)
    wait_for(lambda: all_committed(store, 4), 60, "everything committed", members)
    for m in members:
        m.stop()
    print(f"zombie rounds: {rounds}, late commits attempted and rejected: {rejected}")
    assert rejected >= rounds * 3 // 4  # most rounds stop it mid-batch, with a commit to refuse
    last: dict[TopicPartition, int] = {}
    for _, tp, offset in OffsetStore(store).history(GROUP):
        assert offset is not None and offset >= last.get(tp, 0)
        last[tp] = offset


def test_short_rebalance_storm(log, members, tmp_path) -> None:
    storm(log, members, tmp_path, seconds=6.0)


def test_a_few_zombies(log, members, tmp_path) -> None:
    zombie_rounds(log, members, tmp_path, rounds=2)


@pytest.mark.soak
def test_rebalance_storm_soak(log, members, tmp_path) -> None:
    storm(log, members, tmp_path, seconds=float(os.environ.get("EVENTLANE_SOAK_SECONDS", "60")))


@pytest.mark.soak
def test_zombies_soak(log, members, tmp_path) -> None:
    zombie_rounds(log, members, tmp_path, int(os.environ.get("EVENTLANE_SOAK_ZOMBIES", "50")))
