"""``eventlane migrate-log``: the embedded log copied to the cluster with offsets preserved."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from eventlane.cli import main
from eventlane.log import LogStore
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog


def _records(log: LogStore | JetStreamLog, topic: str, p: int) -> list[tuple[object, ...]]:
    offset, out = log.offsets(topic, p).lwm, []
    while records := log.read(topic, p, offset)[0]:
        out.extend((r.offset, r.key, r.value, r.headers, r.timestamp) for r in records)
        offset = records[-1].offset + 1
    return out


def test_migrate_log_keeps_offsets_gaps_and_timestamps(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with LogStore(data) as emb:
        emb.create_topic("orders.v1", 3)
        for p in range(3):
            emb.append(
                "orders.v1", p, [(b"o%d" % i, b"v", (("h", b"x"),), 1000 + i) for i in range(40)]
            )
        emb.create_topic("state", 1, {"cleanup.policy": "compact", "segment.bytes": 200})
        for i in range(60):
            emb.append("state", 0, [(b"k%d" % (i % 4), b"%d" % i, (), None)])
        emb.compact("state")
        emb.create_topic("stamped", 1, {"timestamp.type": "LogAppendTime"})
        emb.append("stamped", 0, [(None, b"a", (), None)])
        source = {
            (t, p): _records(emb, t, p)
            for t in emb.list_topics()
            for p in range(3 if t == "orders.v1" else 1)
        }
        marks = {(t, p): emb.offsets(t, p) for t, p in source}
    assert len(source["state", 0]) < 60  # compaction left gaps to keep
    url = f"{cluster.url}"
    result = CliRunner().invoke(
        main, ["--data", str(data), "migrate-log", url, "--namespace", namespace]
    )
    assert result.exit_code == 0, result.output
    assert "copied" in result.output and "failed" not in result.output
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        for (t, p), records in source.items():
            on_cluster = _records(js, t, p)
            assert set(on_cluster) <= set(records)  # same offsets and contents
            if t == "state":  # compacted at once: at least the latest record of every key
                latest = {r[1]: r for r in records}
                assert set(latest.values()) <= set(on_cluster)
            else:
                assert on_cluster == records
            assert js.offsets(t, p).hwm == marks[t, p].hwm
        assert js.topic_config("stamped").log_append_time
    again = CliRunner().invoke(
        main, ["--data", str(data), "migrate-log", url, "--namespace", namespace]
    )
    assert again.exit_code == 1 and "already exists" in again.output
