"""``eventlane migrate-log kafka://...``: the embedded log and a JetStream log copied onto a
real 3-broker Kafka cluster, offsets kept where Kafka can keep them, then verified.

The model is the source itself, read back before the copy: a list of (offset, key, value,
headers, timestamp) per partition. An event topic must come back identical (offsets, marks);
a compacted topic with gaps must come back with every copied record equal to the source
record at its source offset (the header says which when Kafka shifted it), and the latest
record of every key present.
"""

from __future__ import annotations

import random
from pathlib import Path

from click.testing import CliRunner

from eventlane.cli import main
from eventlane.log import LogStore
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.kafka.migrate import SOURCE_OFFSET, migrate, source_offset, verify_partition
from eventlane.log.port import Log
from eventlane.log.record import Record

Row = tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


def rows(log: Log | KafkaLog, topic: str, p: int) -> list[Record]:
    offset, out = log.offsets(topic, p).lwm, []
    while records := log.read(topic, p, offset)[0]:
        out.extend(records)
        offset = records[-1].offset + 1
    return out


def shape(r: Record) -> Row:
    return (r.offset, r.key, r.value, r.headers, r.timestamp)


def test_migrate_log_to_kafka_keeps_offsets_marks_and_timestamps(
    kafka_cluster: LocalKafkaCluster, namespace: str, tmp_path: Path
) -> None:
    rng = random.Random(33)
    data = tmp_path / "data"
    with LogStore(data) as emb:
        emb.create_topic("orders.v1", 3)
        for p in range(3):
            for _ in range(rng.randint(3, 6)):
                batch = [
                    (b"o%d" % rng.randrange(50), b"v%d" % rng.randrange(10**6), (("h", b"x"),), ts)
                    for ts in range(1000, 1000 + rng.randint(1, 12))
                ]
                emb.append("orders.v1", p, batch)
        emb.delete_records("orders.v1", 1, 7)  # a head removed: the copy starts at 7 too
        emb.create_topic("state", 1, {"cleanup.policy": "compact", "segment.bytes": 200})
        for i in range(60):
            emb.append("state", 0, [(b"k%d" % rng.randrange(4), b"%d" % i, (), None)])
        emb.compact("state")
        emb.create_topic("stamped", 1, {"timestamp.type": "LogAppendTime"})
        emb.append("stamped", 0, [(None, b"a", (), None)])
        parts = {"orders.v1": 3, "state": 1, "stamped": 1}
        source = {(t, p): rows(emb, t, p) for t, n in parts.items() for p in range(n)}
        marks = {(t, p): emb.offsets(t, p) for t, p in source}
    state = [r.offset for r in source["state", 0]]
    assert state != list(range(state[0], state[0] + len(state)))  # compaction left gaps
    assert marks["orders.v1", 1].lwm == 7
    url = f"{kafka_cluster.url}?namespace={namespace}"

    result = CliRunner().invoke(main, ["--data", str(data), "migrate-log", url])
    assert result.exit_code == 0, result.output
    assert "copied" in result.output and "failed" not in result.output

    with KafkaLog.from_url(url) as kafka:
        for p in range(3):  # an event topic: record for record, offset for offset
            assert [shape(r) for r in rows(kafka, "orders.v1", p)] == [
                shape(r) for r in source["orders.v1", p]
            ]
            assert kafka.offsets("orders.v1", p)[:2] == marks["orders.v1", p][:2]
        copied = rows(kafka, "state", 0)
        by_offset = {r.offset: r for r in source["state", 0]}
        for r in copied:  # each copy equals its source record, shifted or not
            want = by_offset[source_offset(r)]
            assert (r.key, r.value, r.timestamp) == (want.key, want.value, want.timestamp)
            assert (SOURCE_OFFSET in dict(r.headers)) == (r.offset != want.offset)
        latest = {r.key: r.offset for r in source["state", 0]}
        assert set(latest.values()) <= {source_offset(r) for r in copied}
        assert any(r.offset != source_offset(r) for r in copied)
        assert "shifted" in result.output
        assert kafka.topic_config("stamped").log_append_time
        assert [shape(r) for r in rows(kafka, "stamped", 0)] == [
            shape(r) for r in source["stamped", 0]
        ]
        # the verifier can fail: a record the source does not have
        kafka.append("orders.v1", 0, [(b"extra", b"x", (), None)])
        with LogStore(data) as emb:
            problems = list(verify_partition(emb, kafka, "orders.v1", 0))
    assert any("differs" in p for p in problems) and any("high-water" in p for p in problems)

    again = CliRunner().invoke(main, ["--data", str(data), "migrate-log", url])
    assert again.exit_code == 1 and "already exists" in again.output


def test_migrate_from_jetstream_to_kafka(
    kafka_cluster: LocalKafkaCluster, namespace: str, tmp_path: Path
) -> None:
    with LocalCluster.create(tmp_path / "nats", nodes=3) as nats:
        with JetStreamLog.from_url(nats.url, namespace=namespace) as js:
            js.create_topic("orders.v1", 2)
            for p in range(2):
                js.append(
                    "orders.v1",
                    p,
                    [(b"o%d" % i, b"v", (("h", b"y"),), 5000 + i) for i in range(25)],
                )
            js.delete_records("orders.v1", 0, 10)
            source = {p: rows(js, "orders.v1", p) for p in range(2)}
            with KafkaLog(kafka_cluster.bootstrap, namespace=namespace) as kafka:
                copies = migrate(js, kafka)
                assert [c.problems for c in copies] == [(), ()]
                for p in range(2):
                    assert [shape(r) for r in rows(kafka, "orders.v1", p)] == [
                        shape(r) for r in source[p]
                    ]
                assert kafka.offsets("orders.v1", 0).lwm == 10
