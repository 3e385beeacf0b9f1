"""Failover on a real 3-node cluster (its own, since these tests kill and wipe nodes).

The oracle is the producers' acknowledgements (``A`` lines of ``procs.py produce``): every
acknowledged record must be in the partition exactly once, at the acknowledged offset, after
the stream leader was SIGKILLed mid-run and restarted; a node whose data directory was wiped
must be repopulated by its peers.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eventlane.log import Record
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog

PROCS = Path(__file__).parent / "procs.py"


class Producer:
    """A ``procs.py produce`` child and the lines it printed (read by a thread)."""

    def __init__(self, cluster: LocalCluster, ns: str, tag: str, stop: Path) -> None:
        args = {"url": cluster.url, "namespace": ns, "topic": "fo", "tag": tag}
        args |= {"stop": str(stop), "seconds": 90}
        self.proc = subprocess.Popen(
            [sys.executable, str(PROCS), "produce", json.dumps(args)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def acks(self) -> list[tuple[int, str, float]]:
        return [
            (int(p[1]), p[2], float(p[3]))
            for p in (line.split() for line in list(self.lines))
            if p and p[0] == "A"
        ]

    def dump(self) -> list[str]:
        """The last lines, after asking the child to print its threads' stacks to stderr."""
        self.proc.send_signal(signal.SIGUSR1)
        return self.lines[-2:]

    def stop(self) -> None:
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(timeout=10)


def _until(what: str, check, timeout: float = 60.0, detail=None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {detail and detail()}"
        time.sleep(0.1)


def _stall(producer: Producer, since: float) -> float:
    times = [t for *_, t in producer.acks()]
    return max(b - a for a, b in itertools.pairwise(times) if b > since)


def _check_oracle(js: JetStreamLog, producers: list[Producer]) -> list[Record]:
    """Every acknowledged record is in the partition once, at its acknowledged offset."""
    records: list[Record] = []
    offset = 0
    while batch := js.read("fo", 0, offset)[0]:
        records.extend(batch)
        offset = batch[-1].offset + 1
    ids = [r.value.decode() for r in records if r.value is not None]
    assert len(ids) == len(set(ids)), "a record was stored twice"
    at = {r.offset: r.value.decode() for r in records if r.value is not None}
    acked = [a for p in producers for a in p.acks()]
    lost = [(o, i) for o, i, _ in acked if at.get(o) != i]
    assert not lost, f"acknowledged records lost or moved: {lost[:5]}"
    return records


def test_leader_sigkill_loses_and_duplicates_nothing_and_nodes_rejoin(
    own_cluster: LocalCluster, tmp_path: Path, namespace: str
) -> None:
    js = JetStreamLog.from_url(own_cluster.url, namespace=namespace)
    stop = tmp_path / "stop"
    producers: list[Producer] = []
    try:
        js.create_topic("fo", 1)
        stream, leader, _ = js.placement("fo", 0)
        assert leader is not None
        producers = [Producer(own_cluster, namespace, tag, stop) for tag in ("p", "q")]
        _until("first appends", lambda: all(len(p.acks()) >= 30 for p in producers))
        killed_at = time.time()
        own_cluster.kill(leader, signal.SIGKILL)
        _until(
            "appends after the kill",
            lambda: all(sum(t > killed_at for *_, t in p.acks()) >= 30 for p in producers),
        )
        # an append in flight at the kill may still be acked by the old leader: the stall is
        # the longest gap between a producer's consecutive acks from the kill on
        stall = max(_stall(p, killed_at) for p in producers)
        print(f"\nappends resumed {stall:.2f}s after SIGKILL of stream leader {leader}")
        own_cluster.start_node(leader)  # restarted with its data: catches up
        stop.touch()
        for p in producers:
            p.stop()
        _until("replicas current", lambda: js.verify("fo") == [])
        _, new_leader, _ = js.placement("fo", 0)
        assert new_leader is not None

        acked = [a for p in producers for a in p.acks()]
        records = _check_oracle(js, producers)
        conditional_after = [i for _, i, t in acked if t > killed_at and int(i[2:]) % 2 == 0]
        assert conditional_after, "conditional appends did not resume"
        hwm = js.offsets("fo", 0).hwm
        state = own_cluster.stream_state(leader, stream)
        assert state is not None and state["last_seq"] == hwm  # the restarted node caught up

        # a node whose data directory is wiped rejoins and is repopulated by its peers
        victim = next(n.name for n in own_cluster.nodes if n.name != new_leader)
        own_cluster.kill(victim, signal.SIGKILL)
        own_cluster.wipe(victim)
        own_cluster.start_node(victim)
        _until(
            "wiped node repopulated",
            lambda: (
                (own_cluster.stream_state(victim, stream) or {}).get("messages") == len(records)
            ),
        )
        assert js.verify("fo") == []
    finally:
        stop.touch()
        for p in producers:
            p.stop()
        js.close()


@pytest.mark.soak
def test_soak_repeated_leader_kills(
    own_cluster: LocalCluster, tmp_path: Path, namespace: str
) -> None:
    """Eight cycles: SIGKILL the stream leader under load, restart it, wait until current."""
    js = JetStreamLog.from_url(own_cluster.url, namespace=namespace)
    stop = tmp_path / "stop"
    producers: list[Producer] = []
    stalls = []
    try:
        js.create_topic("fo", 1)
        producers = [Producer(own_cluster, namespace, tag, stop) for tag in ("p", "q", "r")]
        for _ in range(8):
            _, leader, _ = js.placement("fo", 0)
            assert leader is not None
            before = [len(p.acks()) for p in producers]
            _until(
                "appends",
                lambda b=before: all(
                    len(p.acks()) >= n + 20 for p, n in zip(producers, b, strict=True)
                ),
            )
            killed_at = time.time()
            own_cluster.kill(leader, signal.SIGKILL)
            _until(
                "appends after the kill",
                lambda k=killed_at: all(sum(t > k for *_, t in p.acks()) >= 20 for p in producers),
                detail=lambda: [p.dump() for p in producers],
            )
            stalls.append(max(_stall(p, killed_at) for p in producers))
            own_cluster.start_node(leader)
            _until("replicas current", lambda: js.verify("fo") == [])
        stop.touch()
        for p in producers:
            p.stop()
        _check_oracle(js, producers)
        print(f"\nstalls after each leader kill (s): {[round(s, 2) for s in stalls]}")
    finally:
        stop.touch()
        for p in producers:
            p.stop()
        js.close()
