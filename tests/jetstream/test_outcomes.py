"""What a caller is told when the cluster cannot answer (issue 26, defects 3 and 4), on a real
3-node cluster of the test's own (its nodes are SIGSTOPped, by PID).

* An append whose proposal a stream leader cannot commit (both followers frozen) is reported
  as :class:`OutcomeUnknownError`, never as refused: its retry with the same ``Nats-Msg-Id``
  gets "duplicate message id is in process" and the record may yet be stored. The oracle is
  the partition read back after the followers wake: the record is there at most once, and
  if the error had said "refused" it must not be there.
* A frozen follower answers no direct get routed to it: reads are asked again (another
  replica, then the leader) and never raise a raw ``nats`` error.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from eventlane.errors import FrameworkError, LogError, OutcomeUnknownError
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog


def _freeze(cluster: LocalCluster, names: list[str]) -> None:
    for name in names:
        os.kill(cluster.node(name).pid, signal.SIGSTOP)


def _thaw(cluster: LocalCluster, names: list[str]) -> None:
    for name in names:
        os.kill(cluster.node(name).pid, signal.SIGCONT)


def _values(js: JetStreamLog, topic: str) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while batch := js.read(topic, 0, offset)[0]:
        out.extend(r.value or b"" for r in batch)
        offset = batch[-1].offset + 1
    return out


def test_append_whose_proposal_is_pending_is_outcome_unknown_never_refused(
    own_cluster: LocalCluster, namespace: str
) -> None:
    js = JetStreamLog.from_url(own_cluster.url, namespace=namespace, timeout=1.0, retry_s=3.0)
    try:
        js.create_topic("pend", 1)
        js.append("pend", 0, [(b"k", b"before", (), None)])
        _, leader, replicas = js.placement("pend", 0)
        followers = [r for r in replicas if r != leader]
        assert leader is not None and len(followers) == 2
        _freeze(own_cluster, followers)
        try:
            with pytest.raises(LogError) as caught:
                js.append("pend", 0, [(b"k", b"pending", (), None)])
        finally:
            _thaw(own_cluster, followers)
        error = caught.value
        print(f"\nappend with frozen followers: {type(error).__name__}: {error}")
        assert isinstance(error, OutcomeUnknownError), f"reported as {type(error).__name__}"
        assert error.indeterminate and not error.retriable
        assert error.topic == "pend" and error.partition == 0
        deadline = time.monotonic() + 20
        while True:  # the cluster settles (a new election, or the old leader commits)
            try:
                values = _values(js, "pend")
                break
            except FrameworkError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert values.count(b"before") == 1
        assert values.count(b"pending") <= 1  # unknown: stored once or not at all
        js.append("pend", 0, [(b"k", b"after", (), None)])  # the partition works again
    finally:
        js.close()


def test_reads_when_the_connected_server_freezes_move_on_never_a_raw_nats_error(
    own_cluster: LocalCluster, namespace: str
) -> None:
    """The server a reader is connected to freezes (SIGSTOP: its socket stays open, nothing
    answers): the client's pings find it dead within seconds, it reconnects to another
    server and the reads are asked again there; a majority is up the whole time."""
    js = JetStreamLog.from_url(own_cluster.url, namespace=namespace, timeout=1.0, retry_s=15.0)
    try:
        js.create_topic("rd", 1)
        for i in range(20):
            js.append("rd", 0, [(b"k%d" % (i % 3), b"v%d" % i, (), None)])
        port = js.nc.connected_url.port
        frozen = next(n.name for n in own_cluster.nodes if n.client == port)
        _freeze(own_cluster, [frozen])
        slowest = 0.0
        try:
            for round_ in range(5):
                started = time.monotonic()
                records, _ = js.read("rd", 0, round_)
                assert [r.value for r in records] == [b"v%d" % i for i in range(round_, 20)]
                keyed = js.read_key("rd", 0, b"k1")
                assert [r.value for r in keyed] == [b"v%d" % i for i in range(1, 20, 3)]
                slowest = max(slowest, time.monotonic() - started)
        finally:
            _thaw(own_cluster, [frozen])
        print(f"\nslowest read round after the connected server froze: {slowest:.2f}s")
        assert slowest < 12.0
    finally:
        js.close()
