"""``eventlane demo log``: the README's main job runs, narrates each step, and is re-runnable."""

from __future__ import annotations

import json
import time
from pathlib import Path

from eventlane.log import LogStore


def test_demo_runs_twice_on_the_same_data_dir(cli, data_dir: Path) -> None:
    started = time.monotonic()
    first = cli("demo", "log")
    assert first.exit_code == 0, first.output
    out = first.stdout
    for step in (
        "Topics",
        "Produce keyed records",
        "murmur2(key)",
        "Consume partition",
        "Low-water mark, high-water mark, log end offset",
        "Compaction by key",
        "Offsets are preserved",
        "Retention on demo.clicks",
        "out of range",
        "Describe demo.orders",
        "every batch's CRC32C and framing is intact",
    ):
        assert step in out, step
    assert "created demo.orders" in out

    second = cli("demo", "log")
    assert second.exit_code == 0, second.output
    assert "reused  demo.orders" in second.stdout
    assert time.monotonic() - started < 60  # a few seconds normally; slack for a noisy machine

    with LogStore(data_dir) as log:
        assert log.list_topics() == ["demo.clicks", "demo.customers", "demo.orders"]
        orders = log.describe_topic("demo.orders")
        assert sum(p.hwm for p in orders.partition_details) == 20  # 10 records per run
        assert log.offsets("demo.clicks", 0).lwm > 0  # retention moved the low-water mark
        assert log.verify() == []
    listed = json.loads(cli("topics", "list", "--json").stdout)
    assert {t["name"]: t["config"]["cleanup_policy"] for t in listed}["demo.customers"] == "compact"
