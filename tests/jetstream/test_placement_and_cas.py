"""Key placement and per-key conditional appends on a real 3-node JetStream cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlane.errors import ConcurrencyError
from eventlane.log import Log, LogStore, Producer, ProducerRecord
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import Expect, JetStreamLog
from eventlane.log.partitioner import partition_for_key

PROCS = Path(__file__).parent / "procs.py"
# dpkp/kafka-python's Java-compatibility vectors: partition among 1000 partitions. With 8
# partitions (8 divides 1000) the partition is that number mod 8.
KAFKA_PARTITIONS_OF_1000 = [
    (b"", 681),
    (b"a", 524),
    (b"ab", 434),
    (b"abc", 107),
    (b"123456789", 566),
    (b"\x00 ", 742),
]


@pytest.fixture
def js(cluster: LocalCluster, namespace: str) -> Iterator[JetStreamLog]:
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as log:
        yield log


def _placement(log: Log, keys: list[bytes]) -> dict[bytes, int]:
    log.create_topic("placement", 8)
    Producer(log).send_batch("placement", [ProducerRecord(k, b"v") for k in keys])
    where: dict[bytes, int] = {}
    for p in range(8):
        offset = 0
        while records := log.read("placement", p, offset)[0]:
            for r in records:
                assert r.key is not None and r.key not in where
                where[r.key] = p
            offset = records[-1].offset + 1
    return where


def test_3000_keys_land_where_the_embedded_log_and_kafka_put_them(
    js: JetStreamLog, tmp_path: Path
) -> None:
    keys = [b"customer-%d" % i for i in range(3000 - len(KAFKA_PARTITIONS_OF_1000))]
    keys += [k for k, _ in KAFKA_PARTITIONS_OF_1000]
    on_cluster = _placement(js, keys)  # type: ignore[arg-type]
    with LogStore(tmp_path / "embedded") as embedded:
        assert on_cluster == _placement(embedded, keys)
    assert len(on_cluster) == 3000
    assert all(on_cluster[k] == partition_for_key(k, 8) for k in keys)
    for key, of_1000 in KAFKA_PARTITIONS_OF_1000:
        assert on_cluster[key] == of_1000 % 8


def test_expect_is_checked_by_the_server_per_key(js: JetStreamLog) -> None:
    js.create_topic("orders", 1)
    a1 = js.append("orders", 0, [(b"A", b"1", (), None)], expect=Expect(b"A", None))
    js.append("orders", 0, [(b"B", b"1", (), None)], expect=Expect(b"B", None))
    assert js.key_head("orders", 0, b"A") == a1.base_offset == 0
    with pytest.raises(ConcurrencyError) as info:  # stale: A already has a record
        js.append("orders", 0, [(b"A", b"x", (), None)], expect=Expect(b"A", None))
    assert (info.value.expected, info.value.actual) == (-1, 0)
    with pytest.raises(ConcurrencyError):  # atomic batch refused as a whole
        js.append("orders", 0, [(b"A", b"y", (), None)] * 3, expect=Expect(b"A", 7), atomic=True)
    res = js.append("orders", 0, [(b"A", b"2", (), None)] * 2, expect=Expect(b"A", 0), atomic=True)
    assert (res.base_offset, res.last_offset) == (2, 3)
    assert [r.offset for r in js.read_key("orders", 0, b"A")] == [0, 2, 3]
    assert [r.offset for r in js.read_key("orders", 0, b"A", after=0)] == [2, 3]
    assert js.offsets("orders", 0).hwm == 4  # the refused appends left nothing
    long_key = b"k" * 1000  # hashed subject token, key kept in a header
    js.append("orders", 0, [(long_key, b"v", (), None)], expect=Expect(long_key, None))
    assert [r.key for r in js.read_key("orders", 0, long_key)] == [long_key]


def _children(cluster: LocalCluster, namespace: str, tmp: Path, retry: bool, count: int):  # type: ignore[no-untyped-def]
    go = tmp / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(PROCS),
                "cas",
                json.dumps(
                    {
                        "url": cluster.url,
                        "namespace": namespace,
                        "topic": "agg",
                        "key": "order-1",
                        "tag": tag,
                        "count": count,
                        "retry": retry,
                        "go": str(go),
                    }
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for tag in ("p", "q")
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "R"
        go.touch()
        outs = [p.communicate(timeout=240)[0].split("\n") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def test_two_processes_500_conditional_appends_each_on_one_key(
    js: JetStreamLog, cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    js.create_topic("agg", 1)
    outs = _children(cluster, namespace, tmp_path, retry=True, count=500)
    acked = {line.split()[2]: int(line.split()[1]) for o in outs for line in o if line[:1] == "A"}
    assert len(acked) == 1000
    records = js.read_key("agg", 0, b"order-1")
    values = [r.value.decode() for r in records if r.value is not None]
    assert sorted(values) == sorted(acked) and len(set(values)) == 1000  # exactly once
    assert [r.offset for r in records] == list(range(1000))  # versions 1..1000, no gaps
    assert {r.value.decode(): r.offset for r in records if r.value} == acked


def test_without_retry_the_loser_gets_a_conflict_and_writes_nothing(
    js: JetStreamLog, cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    js.create_topic("agg", 1)
    js.append("agg", 0, [(b"order-1", b"created", (), None)])
    outs = _children(cluster, namespace, tmp_path, retry=False, count=200)
    lost = [o for o in outs if "L" in o]
    assert len(lost) >= 1, outs  # someone lost a race and stopped at once
    acked = sum(line[:1] == "A" for o in outs for line in o)
    assert js.offsets("agg", 0).hwm == 1 + acked  # a refused append wrote nothing
