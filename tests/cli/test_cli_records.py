"""``eventlane produce`` / ``consume`` in-process: records, placement, offsets, bad input."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from eventlane.log import LogStore
from eventlane.log.partitioner import partition_for_key


def consume(cli, *args: str) -> list[dict]:
    result = cli("consume", *args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def orders(cli) -> str:
    assert cli("topics", "create", "orders", "--partitions", "3").exit_code == 0
    return "orders"


def test_round_trip_with_key_separator(cli, orders: str) -> None:
    lines = ["alice:1", "bob:2", "alice:3", "no separator here", "k:v:with:colons", ":empty key"]
    result = cli("produce", orders, "--key-separator", ":", input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # no --print-offsets: nothing on stdout
    records = consume(cli, orders)
    assert len(records) == len(lines)
    for r in records:
        assert set(r) == {"topic", "partition", "offset", "key", "value", "timestamp", "headers"}
        assert r["topic"] == orders and r["headers"] == [] and isinstance(r["timestamp"], int)
        if r["key"] is not None:  # Kafka's placement
            assert r["partition"] == partition_for_key(r["key"].encode(), 3)
    pairs = sorted((r["key"], r["value"]) for r in records if r["key"] is not None)
    assert pairs == [("", "empty key"), ("alice", "1"), ("alice", "3"), ("bob", "2"),
                     ("k", "v:with:colons")]  # fmt: skip
    assert [r["value"] for r in records if r["key"] is None] == ["no separator here"]
    alice = [r for r in records if r["key"] == "alice"]
    assert [r["value"] for r in alice] == ["1", "3"]  # per-key order
    assert alice[0]["offset"] < alice[1]["offset"]


def test_print_offsets_prints_partition_and_offset_per_record(cli, orders: str) -> None:
    keys = [f"key-{i % 7}" for i in range(50)]
    stdin = "".join(f"{k}\t{i}\n" for i, k in enumerate(keys))
    result = cli("produce", orders, "--key-separator", "\t", "--print-offsets", input=stdin)
    assert result.exit_code == 0, result.output
    printed = result.stdout.splitlines()
    assert len(printed) == len(keys)
    assert all(re.fullmatch(r"\d+ \d+", line) for line in printed)
    acks = [tuple(map(int, line.split())) for line in printed]
    next_offset = {0: 0, 1: 0, 2: 0}
    for key, (partition, offset) in zip(keys, acks, strict=True):
        assert partition == partition_for_key(key.encode(), 3)
        assert offset == next_offset[partition]  # dense, in input order, from 0
        next_offset[partition] += 1
    by_offset = {(r["partition"], r["offset"]): r["value"] for r in consume(cli, orders)}
    assert [by_offset[a] for a in acks] == [str(i) for i in range(50)]


def test_explicit_partition_and_keyless_records(cli, orders: str) -> None:
    result = cli("produce", orders, "--partition", "2", "--print-offsets", input="a\nb\nc\n")
    assert result.stdout.splitlines() == ["2 0", "2 1", "2 2"]
    keyless = cli("produce", orders, "--print-offsets", input="x\ny\n").stdout.splitlines()
    assert len({line.split()[0] for line in keyless}) == 1  # one batch sticks to one partition
    bad = cli("produce", orders, "--partition", "3", input="a\n")
    assert bad.exit_code == 1 and "partition 3 does not exist" in bad.stderr
    negative = cli("produce", orders, "--partition", "-1", input="a\n")
    assert negative.exit_code == 2 and "--partition" in negative.stderr
    assert sum(len(consume(cli, orders, "--partition", str(p))) for p in range(3)) == 5


def test_line_endings_and_a_last_line_without_newline(cli, orders: str) -> None:
    cli("produce", orders, "--partition", "0", input=b"crlf\r\nlf\n\nlast")
    values = [r["value"] for r in consume(cli, orders, "--partition", "0")]
    assert values == ["crlf", "lf", "", "last"]


def test_null_marker_produces_tombstones(cli) -> None:
    cli("topics", "create", "state", "--compact")
    result = cli(
        "produce", "state", "--key-separator", "=", "--null-marker", "NULL", input="a=1\na=NULL\n"
    )
    assert result.exit_code == 0, result.output
    assert [(r["key"], r["value"]) for r in consume(cli, "state")] == [("a", "1"), ("a", None)]


def test_non_utf8_bytes_are_replaced_or_base64(cli, orders: str) -> None:
    raw = b"\xff\xfeok"
    cli(
        "produce", orders, "--partition", "1", "--key-separator", "|", input=b"k\x80|" + raw + b"\n"
    )
    [text] = consume(cli, orders, "--partition", "1")
    assert text["value"] == "\ufffd\ufffdok" and text["key"] == "k\ufffd"
    [b64] = consume(cli, orders, "--partition", "1", "--base64")
    assert base64.b64decode(b64["value"]) == raw
    assert base64.b64decode(b64["key"]) == b"k\x80"


def test_headers_are_name_value_pairs(cli, orders: str, data_dir: Path) -> None:
    with LogStore(data_dir) as log:
        log.append(orders, 0, [(b"k", b"v", (("trace", b"abc"), ("empty", None)), 1234)])
    [record] = consume(cli, orders, "--partition", "0")
    assert record["headers"] == [["trace", "abc"], ["empty", None]]
    assert record["timestamp"] == 1234


def test_offset_variants_and_max(cli, orders: str) -> None:
    cli("produce", orders, "--partition", "0", input="".join(f"v{i}\n" for i in range(10)))
    cli("produce", orders, "--partition", "1", input="w0\nw1\n")
    offsets = lambda rs: [(r["partition"], r["offset"]) for r in rs]  # noqa: E731
    assert len(consume(cli, orders)) == 12  # default: earliest, every partition
    assert len(consume(cli, orders, "--offset", "earliest")) == 12
    assert consume(cli, orders, "--offset", "latest") == []
    assert offsets(consume(cli, orders, "--partition", "0", "--offset", "7")) == [
        (0, 7), (0, 8), (0, 9)]  # fmt: skip
    assert consume(cli, orders, "--partition", "0", "--offset", "10") == []  # = LEO: ok, empty
    assert offsets(consume(cli, orders, "--partition", "0", "--max", "3")) == [
        (0, 0), (0, 1), (0, 2)]  # fmt: skip
    assert len(consume(cli, orders, "--max", "11")) == 11
    assert consume(cli, orders, "--max", "0") == []


@pytest.mark.parametrize("bad", ["-1", "-5", "abc", "1.5", "", "0x10", "earliest2"])
def test_garbage_offsets_are_refused_clearly(cli, orders: str, bad: str) -> None:
    result = cli("consume", orders, "--partition", "0", "--offset", bad)
    assert result.exit_code == 2
    assert "--offset" in result.stderr and "offset must be" in result.stderr
    assert result.stdout == ""


def test_offsets_out_of_range_are_errors(cli, orders: str) -> None:
    cli("produce", orders, "--partition", "0", input="a\nb\n")
    past = cli("consume", orders, "--partition", "0", "--offset", "3")
    assert past.exit_code == 1
    assert "out of range" in past.stderr and "offset=3" in past.stderr
    assert "partition=0" in past.stderr and "topic=orders" in past.stderr
    no_partition = cli("consume", orders, "--offset", "1")
    assert no_partition.exit_code == 1 and "--partition" in no_partition.stderr
    missing = cli("consume", orders, "--partition", "9")
    assert missing.exit_code == 1 and "partition 9 does not exist" in missing.stderr


def test_offset_below_the_low_water_mark_is_an_error(cli) -> None:
    cli("topics", "create", "clicks", "--segment-bytes", "200", "--retention-bytes", "300")
    for i in range(12):
        cli("produce", "clicks", input=f"click number {i}\n")
    assert cli("cleanup", "clicks").exit_code == 0
    lwm = json.loads(cli("topics", "describe", "clicks", "--json").stdout)["partitions"][0]["lwm"]
    assert lwm > 0
    below = cli("consume", "clicks", "--partition", "0", "--offset", str(lwm - 1))
    assert below.exit_code == 1
    assert "out of range" in below.stderr and f"offset={lwm - 1}" in below.stderr
    earliest = consume(cli, "clicks", "--offset", "earliest")
    assert earliest[0]["offset"] == lwm


def test_compacted_topic_refuses_a_keyless_line_after_appending_the_ones_before(cli) -> None:
    cli("topics", "create", "state", "--compact")
    result = cli(
        "produce", "state", "--key-separator", "=", "--print-offsets", input="a=1\nno key\nb=2\n"
    )
    assert result.exit_code == 1
    assert "line 2 has no key" in result.stderr
    assert result.stdout.splitlines() == ["0 0"]  # line 1 acknowledged, nothing after line 2
    assert [r["key"] for r in consume(cli, "state")] == ["a"]


def test_oversized_record_is_refused_naming_its_line(cli) -> None:
    cli("topics", "create", "small", "--config", "max.record.bytes=100")
    result = cli("produce", "small", "--print-offsets", input="ok\n" + "x" * 200 + "\nafter\n")
    assert result.exit_code == 1
    assert "line 2" in result.stderr and "max_record_bytes" in result.stderr
    assert result.stdout.splitlines() == ["0 0"]
    assert [r["value"] for r in consume(cli, "small")] == ["ok"]


def test_timeout_waits_then_stops(cli, orders: str) -> None:
    result = cli("consume", orders, "--timeout", "0.3")
    assert result.exit_code == 0 and result.stdout == ""


def test_produce_to_a_missing_topic_is_an_error(cli, orders: str) -> None:
    result = cli("produce", "nope", input="a\n")
    assert result.exit_code == 1 and "'nope' does not exist" in result.stderr
    empty_sep = cli("produce", orders, "--key-separator", "", input="a\n")
    assert empty_sep.exit_code == 2 and "--key-separator" in empty_sep.stderr
