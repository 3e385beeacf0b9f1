"""``eventlane compact``, ``cleanup``, ``dump`` and ``verify`` on real segment files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eventlane.log import LogStore


@pytest.fixture
def segments(cli, data_dir: Path) -> Path:
    """Topic ``t`` (1 partition, 300-byte segments) holding 12 records in several segments."""
    assert cli("topics", "create", "t", "--segment-bytes", "300").exit_code == 0
    with LogStore(data_dir) as log:
        for i in range(12):
            log.append("t", 0, [(b"key-%d" % (i % 3), b"value number %d" % i, (), 1000 + i)])
    return data_dir / "topics" / "t" / "0"


def dump_json(cli, path: Path) -> list[dict]:
    result = cli("dump", str(path), "--json")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_dump_prints_batches_and_records(cli, segments: Path) -> None:
    first = sorted(segments.glob("*.log"))[0]
    result = cli("dump", str(first))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"Dumping {first}" in out
    assert "baseOffset: 0 lastOffset: 0 count: 1 position: 0" in out
    assert "crcValid: true" in out and "timestampType: CreateTime" in out
    assert '| offset: 0 timestamp: 1000 key: "key-0" value: "value number 0" headers: []' in out
    assert "| offset" not in cli("dump", str(first), "--batches-only").stdout

    batches = dump_json(cli, first)
    assert [b["base_offset"] for b in batches] == list(range(len(batches)))
    position = 0
    for b in batches:
        assert b["position"] == position and b["crc_valid"] and b["error"] is None
        assert b["count"] == 1 and b["timestamp_type"] == "CreateTime"
        position += b["size"]
        [record] = b["records"]
        assert record["offset"] == b["base_offset"]
        assert record["value"] == f"value number {b['base_offset']}"
    assert position == first.stat().st_size


def test_dump_of_indexes(cli, segments: Path) -> None:
    second = sorted(segments.glob("*.log"))[1]
    base = int(second.name[:20])
    index = dump_json(cli, second.with_suffix(".index"))
    assert index[0] == {"offset": base, "position": 0}
    times = dump_json(cli, second.with_suffix(".timeindex"))
    assert times[0]["offset"] == base
    assert f"offset: {base} position: 0" in cli("dump", str(second.with_suffix(".index"))).stdout


def test_dump_refuses_what_is_not_a_segment(cli, segments: Path) -> None:
    not_segment = cli("dump", str(segments / "state"))
    assert not_segment.exit_code == 1 and "not a segment file" in not_segment.stderr
    missing = cli("dump", str(segments / "00000000000000000999.log"))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def flip_byte(path: Path, position: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x20
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("which", ["closed", "active"])
def test_verify_names_file_position_and_offset_of_a_flipped_byte(
    cli, segments: Path, which: str
) -> None:
    assert cli("verify").exit_code == 0
    files = sorted(segments.glob("*.log"))
    target = files[0] if which == "closed" else files[-1]
    batches = dump_json(cli, target)
    bad = batches[-1] if which == "active" else batches[1]
    flip_byte(target, bad["position"] + bad["size"] - 5)  # inside the record's value

    for args in (("verify",), ("verify", "t")):
        result = cli(*args)
        assert result.exit_code == 1
        assert f"file={target}" in result.stdout
        assert f"position={bad['position']}" in result.stdout
        assert f"offset={bad['base_offset']}" in result.stdout
        assert "CRC32C mismatch" in result.stdout
        assert "1 corrupt spot" in result.stderr
    report = json.loads(cli("verify", "--json").stdout)
    assert report["problems"] == [
        {
            "topic": "t",
            "partition": 0,
            "file": str(target),
            "position": bad["position"],
            "offset": bad["base_offset"],
            "problem": "CRC32C mismatch",
        }
    ]
    dumped = cli("dump", str(target))
    assert dumped.exit_code == 1 and "crcValid: false" in dumped.stdout


def test_verify_of_an_unknown_topic_is_an_error(cli, segments: Path) -> None:
    result = cli("verify", "nope")
    assert result.exit_code == 1 and "'nope' does not exist" in result.stderr


def test_compact_keeps_the_last_record_per_key_and_preserves_offsets(cli, data_dir: Path) -> None:
    assert cli("topics", "create", "s", "--compact", "--segment-bytes", "300").exit_code == 0
    with LogStore(data_dir) as log:
        for i in range(20):
            log.append("s", 0, [(b"k%d" % (i % 3), b"v%d" % i, (), None)])
        active_base = log.partition("s", 0).offsets().active_base
    before = cli("consume", "s").stdout.splitlines()
    result = cli("compact", "s", "--json")
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)
    assert report["partition"] == 0 and report["records_kept"] == 3
    assert report["records_scanned"] == active_base
    after = [json.loads(line) for line in cli("consume", "s").stdout.splitlines()]
    offsets = [r["offset"] for r in after]
    assert offsets == sorted(offsets) and set(offsets) <= set(range(20))
    compacted = [r for r in after if r["offset"] < active_base]
    assert sorted(r["key"] for r in compacted) == ["k0", "k1", "k2"]  # one per key
    for r in compacted:  # each is the last of its key below the active segment
        last = max(i for i in range(active_base) if f"k{i % 3}" == r["key"])
        assert (r["offset"], r["value"]) == (last, f"v{last}")
    untouched = [json.loads(line) for line in before if json.loads(line)["offset"] >= active_base]
    assert [r for r in after if r["offset"] >= active_base] == untouched
    human = cli("compact", "s")
    assert human.exit_code == 0 and "Compaction of s" in human.stdout


def test_compact_and_cleanup_refuse_the_wrong_policy(cli) -> None:
    cli("topics", "create", "plain")
    cli("topics", "create", "state", "--compact")
    compact = cli("compact", "plain")
    assert compact.exit_code == 1 and "cleanup_policy=delete" in compact.stderr
    cleanup = cli("cleanup", "state")
    assert cleanup.exit_code == 1 and "cleanup_policy=compact" in cleanup.stderr


def test_cleanup_applies_retention_and_advances_the_low_water_mark(cli, data_dir: Path) -> None:
    cli("topics", "create", "clicks", "--segment-bytes", "200", "--retention-bytes", "400")
    with LogStore(data_dir) as log:
        for i in range(20):
            log.append("clicks", 0, [(None, b"click %d" % i, (), None)])
    result = cli("cleanup", "clicks", "--json")
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)
    assert report["old_lwm"] == 0 and report["new_lwm"] > 0 and report["segments_deleted"] > 0
    marks = json.loads(cli("topics", "describe", "clicks", "--json").stdout)["partitions"][0]
    assert marks["lwm"] == report["new_lwm"] and marks["hwm"] == marks["leo"] == 20
    again = cli("cleanup", "clicks")
    assert again.exit_code == 0 and "Retention of clicks" in again.stdout
