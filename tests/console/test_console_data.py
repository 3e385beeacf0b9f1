"""The console's data module on a plain log (no app, no server): paging, starts, filters,
the scan bound, export, names. The browser tests cover the same through the pages."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import structlog
from click.testing import CliRunner

import eventlane.console.data as console_data
from eventlane.cli import main
from eventlane.console import ConsoleData, Filters, open_log
from eventlane.errors import ConfigError, FrameworkError
from eventlane.log import LogStore, Producer, ProducerRecord

T0 = 1_700_000_000_000


@pytest.fixture
def console(tmp_path: Path) -> Iterator[ConsoleData]:
    log = LogStore(tmp_path / "data")
    log.create_topic("t", 2)
    records = [
        ProducerRecord(
            f"k{i % 3}".encode(),
            orjson.dumps({"i": i, "data": {"even": i % 2 == 0, "tags": [f"t{i}"]}}),
            (("event-type", b"Even" if i % 2 == 0 else b"Odd"),),
            T0 + i * 1000,
        )
        for i in range(300)
    ]
    with Producer(log) as producer:
        producer.send_batch("t", records, partition=0)
        producer.send("t", b"not json", key=b"k9", partition=1).result()
        producer.send("t", b"\x00\xff\xfe", key=b"k9", partition=1).result()
    data = ConsoleData(log)
    yield data
    data.close()


def offsets(page: dict[str, object]) -> list[int]:
    return [r["offset"] for r in page["records"]]  # type: ignore[attr-defined,index]


def test_pages_follow_each_other_without_gap_or_overlap(console: ConsoleData) -> None:
    seen: list[int] = []
    page = console.browse("t", 0, limit=70)
    while True:
        seen += offsets(page)
        if page["next"] is None:
            break
        page = console.browse("t", 0, start="offset", value=str(page["next"]), limit=70)
    assert seen == list(range(300))


def test_starts_oldest_newest_offset_and_timestamp(console: ConsoleData) -> None:
    assert offsets(console.browse("t", 0, limit=3)) == [0, 1, 2]
    assert offsets(console.browse("t", 0, start="newest", limit=3)) == [297, 298, 299]
    middle = console.browse("t", 0, start="offset", value="150", limit=70)
    assert offsets(middle)[:2] == [150, 151] and (middle["prev"], middle["next"]) == (80, 220)
    assert console.browse("t", 0, limit=5)["prev"] is None
    at = console.browse("t", 0, start="timestamp", value=str(T0 + 42_500), limit=1)
    assert offsets(at) == [43]
    iso = console.browse("t", 0, start="timestamp", value="2023-11-14T22:14:00Z", limit=1)
    assert offsets(iso) == [40]  # T0 is 2023-11-14T22:13:20Z
    with pytest.raises(ConfigError, match="start must be"):
        console.browse("t", 0, start="middle")
    with pytest.raises(ConfigError, match="partition 5 does not exist"):
        console.browse("t", 5)


def test_filters_by_key_header_text_and_json_path(console: ConsoleData) -> None:
    by_key = console.browse("t", 0, filters=Filters(key="k1"), limit=500)
    assert offsets(by_key) == list(range(1, 300, 3))
    assert by_key["lookup"] == "index"  # the embedded log reads a key through its index
    odd = console.browse("t", 0, filters=Filters(header="Odd"), limit=500)
    assert offsets(odd) == list(range(1, 300, 2))
    same = console.browse("t", 0, filters=Filters(header="event-type=Odd"), limit=500)
    assert offsets(same) == offsets(odd)
    assert offsets(console.browse("t", 0, filters=Filters(text='"i":7,'))) == [7]
    tagged = console.browse("t", 0, filters=Filters(jpath="data.tags.0=t11"))
    assert offsets(tagged) == [11]
    evens = console.browse("t", 0, filters=Filters(jpath="$.data.even=true"), limit=500)
    assert offsets(evens) == list(range(0, 300, 2))
    both = console.browse("t", 0, filters=Filters(key="k0", header="Odd"), limit=500)
    assert offsets(both) == [i for i in range(300) if i % 3 == 0 and i % 2 == 1]
    raw = console.browse("t", 1, filters=Filters(jpath="data"))
    assert raw["records"] == []  # not JSON: no path matches
    text, binary = console.browse("t", 1)["records"]
    assert (text["value"], text["binary"]) == ("not json", False)
    assert (binary["value"], binary["binary"]) == ("00 ff fe", True)  # bytes, not mojibake


def test_a_filtered_page_reads_a_bounded_number_of_records(
    console: ConsoleData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console_data, "SCAN_LIMIT", 100)
    page = console.browse("t", 0, filters=Filters(text="no such text"))
    assert page["records"] == []
    assert page["scanned"] == 100
    assert page["next"] == 100  # the next page goes on from where this one stopped


def test_export_is_ndjson_of_the_matching_records(console: ConsoleData) -> None:
    lines = b"".join(console.export("t", 0, Filters(key="k2"))).splitlines()
    docs = [orjson.loads(line) for line in lines]
    assert [d["offset"] for d in docs] == list(range(2, 300, 3))
    assert docs[0]["headers"] == [["event-type", "Even"]] and docs[0]["key"] == "k2"


def test_topic_details_and_live_reads(console: ConsoleData) -> None:
    topic = console.topic("t")
    assert topic["records"] == 302
    rows = {r["partition"]: r for r in topic["partition_details"]}
    assert (rows[0]["lwm"], rows[0]["hwm"], rows[0]["last_append_ms"]) == (0, 300, T0 + 299_000)
    positions = console.positions_at_end("t", None)
    assert positions == {0: 300, 1: 2}
    with Producer(console.log) as producer:
        producer.send("t", b"new", key=b"k", partition=1).result()
    new = console.read_new("t", positions, Filters())
    assert [(r["partition"], r["value"]) for r in new] == [(1, "new")]
    assert positions == {0: 300, 1: 3}


@pytest.mark.parametrize("name", ["..", "a/b", "../../etc", "x\x00y", ""])
def test_bad_topic_names_are_refused_before_any_file_is_touched(
    console: ConsoleData, name: str
) -> None:
    with pytest.raises(FrameworkError):
        console.topic(name)


def test_views_that_need_an_app_say_so(console: ConsoleData) -> None:
    assert console.projectors() == [] and console.readmodel_files() == {}
    with pytest.raises(ConfigError, match="needs an APP"):
        console.aggregate("Order", "o-1", None)
    with pytest.raises(ConfigError, match="needs an APP"):
        console.dead_letters("invoices")


def test_open_log_refuses_a_directory_without_a_log(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no eventlane data"):
        open_log(tmp_path, None)
    with pytest.raises(ConfigError, match="no log engine for URL scheme"):
        open_log(None, "nosuchengine://127.0.0.1:4222")
    with pytest.raises(ConfigError, match="name different logs"):
        open_log(tmp_path / "a", f"file://{tmp_path}/b")
    assert not (tmp_path / "topics").exists()


def test_cli_refuses_a_missing_log_and_contradicting_locations(tmp_path: Path) -> None:
    LogStore(tmp_path / "d").close()
    (tmp_path / "d" / "topics").mkdir(exist_ok=True)
    runner = CliRunner(env={"EVENTLANE_DATA": str(tmp_path / "elsewhere")})
    saved = structlog.get_config()  # the CLI configures logging for its process
    try:
        both = runner.invoke(
            main, ["console", "--data", str(tmp_path / "d"), "--log", f"file://{tmp_path}/e"]
        )
        missing = runner.invoke(main, ["console", "--log", f"file://{tmp_path}/none"])
    finally:
        structlog.configure(**saved)
    assert both.exit_code == 1 and "name different logs" in both.output
    assert missing.exit_code == 1 and "no eventlane data" in missing.output  # env not counted
    assert not (tmp_path / "none").exists()


def test_the_backend_is_named_as_users_know_it(console: ConsoleData) -> None:
    """ "embedded log", not the class name ``LogStore``."""
    assert console.backend()["engine"] == "embedded log"
    assert console.overview()["backend"]["engine"] == "embedded log"


@pytest.mark.jetstream
def test_a_jetstream_backend_is_named_jetstream(tmp_path: Path) -> None:
    """A real standalone nats-server with JetStream (one process, a fraction of a second)."""
    pytest.importorskip("nats", reason="the nats extra is not installed")
    from eventlane.log.jetstream.cluster import free_ports, nats_server_binary  # noqa: PLC0415

    (port,) = free_ports(1)
    server = subprocess.Popen(
        [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"nats://127.0.0.1:{port}?namespace=console&replicas=1"
        deadline = time.monotonic() + 30
        while True:
            try:
                log = open_log(tmp_path / "local", url)
                break
            except FrameworkError:
                assert time.monotonic() < deadline and server.poll() is None, "no nats-server"
                time.sleep(0.2)
        data = ConsoleData(log)
        try:
            assert data.backend()["engine"] == "JetStream"
        finally:
            data.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
