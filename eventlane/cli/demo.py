"""``eventlane demo log``: a short walkthrough of the embedded log, narrated step by step.

It creates (or reuses) three topics in the data directory and exercises the log through its
public API only (the :class:`~eventlane.log.Log` port, :class:`~eventlane.log.Producer`,
:class:`~eventlane.consumer.Consumer`): keyed produce with Kafka's partitioner, reading a
partition by offset, the low-water mark / high-water mark / log end offset, compaction by key
(offsets kept, gaps appear), size-based retention (the low-water mark advances and older
offsets become out of range), describe and verify. Running it again on the same directory
reuses the topics and appends more records; every step still shows what it shows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import click
import orjson
from rich.console import Console
from rich.rule import Rule

from eventlane.cli.context import app, data_option, stdout_console
from eventlane.cli.maintenance import verify_log
from eventlane.cli.plugins import LazyGroup
from eventlane.cli.render import config_table, human_bytes, partitions_table, simple_table
from eventlane.consumer.free import Consumer
from eventlane.errors import OffsetOutOfRangeError
from eventlane.log.partitioner import murmur2
from eventlane.log.port import Log, MaintainedLog, maintained_log
from eventlane.log.producer import Producer
from eventlane.log.record import ProducerRecord, Record, TopicPartition

ORDERS = "demo.orders"
CUSTOMERS = "demo.customers"
CLICKS = "demo.clicks"


@click.group(cls=LazyGroup, plugins="eventlane.demos")
@data_option
def demo() -> None:
    """Guided walkthroughs."""


def _read(log: Log, topic: str, partition: int, start: int | None = None) -> list[Record]:
    """Every record of one partition from ``start`` (default: the low-water mark) to the HWM."""
    consumer = Consumer(log, auto_offset_reset="earliest")
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    if start is None:
        consumer.seek_to_beginning(tp)
    else:
        consumer.seek(tp, start)
    out: list[Record] = []
    while batch := consumer.poll(timeout=0):
        out.extend(batch)
    consumer.close()
    return out


def _text(raw: bytes | None) -> str:
    return "null (tombstone)" if raw is None else raw.decode("utf-8", errors="replace")


class _Narrator:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.step = 0

    def title(self, text: str) -> None:
        self.step += 1
        self.console.print()
        self.console.print(Rule(f"[bold]{self.step}. {text}[/bold]", align="left"))

    def say(self, text: str) -> None:
        self.console.print(text)

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]")


def _topics(n: _Narrator, log: Log) -> None:
    n.title("Topics")
    n.note("A topic is split into partitions; each partition is an ordered, append-only log.")
    specs: Sequence[tuple[str, int, dict[str, object], str]] = (
        (ORDERS, 3, {}, "3 partitions, cleanup_policy=delete (retention 7 days)"),
        (
            CUSTOMERS,
            1,
            {"cleanup_policy": "compact", "segment_bytes": 512},
            "1 partition, cleanup_policy=compact: keeps the last record of every key",
        ),
        (
            CLICKS,
            1,
            {"segment_bytes": 512, "retention_bytes": 1024, "retention_ms": -1},
            "1 partition, retention by size: keep about 1 KiB",
        ),
    )
    for name, partitions, config, what in specs:
        existed = log.topic_exists(name)
        log.create_topic(name, partitions, config, exist_ok=True)
        verb = "reused " if existed else "created"
        n.say(f"  {verb} [bold]{name}[/bold]: {what}")


def _produce(n: _Narrator, log: Log, run: str) -> tuple[int, int]:
    n.title(f"Produce keyed records to {ORDERS}")
    n.note(
        "A record's key picks its partition exactly as Kafka's default partitioner does:"
        " (murmur2(key) & 0x7fffffff) % partitions. All records of one key land in one"
        " partition, in order, and a topic moved to Kafka keeps this placement."
    )
    producer = Producer(log)
    records = [
        ProducerRecord(
            key=f"customer-{c}".encode(),
            value=orjson.dumps({"order": f"{run}-{c}{i}", "amount": 10 * c + i}),
        )
        for i in range(2)
        for c in range(1, 6)
    ]
    started = time.perf_counter()
    metadata = producer.send_batch(ORDERS, records)
    elapsed = (time.perf_counter() - started) * 1000
    rows = []
    for record, meta in zip(records, metadata, strict=True):
        key = record.key or b""
        rows.append(
            (
                key.decode(),
                murmur2(key),
                meta.partition,
                meta.offset,
                (record.value or b"").decode(),
            )
        )
    n.console.print(
        simple_table(
            "Where each record landed",
            ("key", "murmur2(key)", "partition", "offset", "value"),
            rows,
        )
    )
    n.note(
        f"{len(records)} records appended in {elapsed:.1f} ms, one write + fsync per partition;"
        " each offset was returned only once its record was durable."
    )
    first = metadata[0]
    return first.partition, first.offset


def _consume(n: _Narrator, log: Log, partition: int, start: int) -> None:
    n.title(f"Consume partition {partition} of {ORDERS} from offset {start}")
    n.note(
        "A consumer reads one partition in offset order, up to the high-water mark. Offsets"
        " are per partition: there is no order across partitions."
    )
    records = _read(log, ORDERS, partition, start)
    n.console.print(
        simple_table(
            f"{ORDERS} / partition {partition}",
            ("offset", "key", "value", "timestamp"),
            ((r.offset, _text(r.key), _text(r.value), r.timestamp) for r in records),
        )
    )


def _marks(n: _Narrator, log: Log) -> None:
    n.title("Low-water mark, high-water mark, log end offset")
    n.note(
        "LWM: the first offset still readable (retention moves it up). HWM: records below it"
        " are durable and visible to consumers. LEO: the offset the next record gets."
        " Always LWM <= HWM <= LEO; on one node, HWM = LEO once an append is fsynced."
    )
    n.console.print(partitions_table(log.describe_topic(ORDERS)))


def _compaction(n: _Narrator, log: MaintainedLog, run: str) -> None:
    n.title(f"Compaction by key on {CUSTOMERS}")
    n.note(
        "Three customers change their e-mail address four times; carol is then deleted with a"
        " tombstone (a null value). Each update is its own append, as in real life."
    )
    names = ("alice", "bob", "carol")
    for version in range(1, 5):
        for name in names:
            value: bytes | None = orjson.dumps({"email": f"{name}+{run}.{version}@example.com"})
            if name == "carol" and version == 4:
                value = None
            log.append(CUSTOMERS, 0, [(name.encode(), value, (), None)])
    before = _read(log, CUSTOMERS, 0)
    segments_before = log.describe_topic(CUSTOMERS).partition_details[0].segments
    report = log.compact(CUSTOMERS)[0]
    after = _read(log, CUSTOMERS, 0)
    segments_after = log.describe_topic(CUSTOMERS).partition_details[0].segments
    n.say(
        f"  before: {len(before)} records in {segments_before} segments;"
        f" after: {len(after)} records in {segments_after} segments"
        f" (the cleaner scanned {report.records_scanned} and kept {report.records_kept};"
        f" {human_bytes(report.bytes_before)} -> {human_bytes(report.bytes_after)})"
    )
    kept = {r.offset for r in after}
    active_base = log.describe_topic(CUSTOMERS).partition_details[0].active_base
    n.console.print(
        simple_table(
            f"{CUSTOMERS} / partition 0 after compaction",
            ("offset", "key", "value", "segment"),
            (
                (
                    r.offset,
                    _text(r.key),
                    _text(r.value),
                    "active, not compacted" if r.offset >= active_base else "compacted",
                )
                for r in after
            ),
        )
    )
    gaps = [r.offset for r in before if r.offset not in kept]
    n.note(
        f"Offsets are preserved: {len(gaps)} superseded offsets are now gaps"
        f" (e.g. {', '.join(map(str, gaps[:6]))}). The cleaner never touches the active (last)"
        " segment, and it keeps the last record of each key among the closed segments, so"
        " a key may appear twice until the active segment rolls and is cleaned in turn."
        " carol's tombstone stays for delete_retention_ms (1 day) so consumers see the"
        " deletion."
    )


def _retention(n: _Narrator, log: MaintainedLog, run: str) -> None:
    n.title(f"Retention on {CLICKS}")
    n.note(
        "Retention deletes whole old segments and advances the low-water mark. This topic"
        " keeps about 1 KiB (retention_bytes=1024); retention_ms (7 days by default) works"
        " the same way by age."
    )
    for i in range(16):
        log.append(CLICKS, 0, [(None, f"click {run}-{i:02d} on /page/{i % 4}".encode(), (), None)])
    marks = log.offsets(CLICKS, 0)
    report = log.cleanup(CLICKS)[0]
    after = log.offsets(CLICKS, 0)
    n.console.print(
        simple_table(
            f"{CLICKS} / partition 0",
            ("", "LWM", "HWM", "LEO"),
            [
                ("before cleanup", marks.lwm, marks.hwm, marks.leo),
                ("after cleanup", after.lwm, after.hwm, after.leo),
            ],
        )
    )
    n.say(
        f"  {report.segments_deleted} segment(s) deleted"
        f" ({human_bytes(report.bytes_deleted)}); the LWM moved from {report.old_lwm}"
        f" to {after.lwm}."
    )
    if after.lwm > 0:
        try:
            log.read(CLICKS, 0, after.lwm - 1)
        except OffsetOutOfRangeError as err:
            n.say(f"  reading offset {after.lwm - 1} now fails: [italic]{err}[/italic]")
    n.note(
        "A consumer resolves this per its auto_offset_reset: 'earliest' jumps to the LWM,"
        " 'latest' to the HWM, 'error' (the default for projectors) refuses to skip silently."
    )


def _describe(n: _Narrator, log: Log) -> None:
    n.title(f"Describe {ORDERS}")
    description = log.describe_topic(ORDERS)
    n.console.print(config_table(description.config, title=f"Config of {ORDERS}"))
    n.console.print(partitions_table(description))


def _verify(n: _Narrator, log: MaintainedLog) -> None:
    n.title("Verify")
    checked, problems = verify_log(log, [ORDERS, CUSTOMERS, CLICKS])
    if problems:
        for err in problems:
            n.say(f"  [red]CORRUPT[/red] {err}")
        raise click.ClickException(f"{len(problems)} corrupt spot(s) found")
    n.say(
        f"  {checked} partitions checked: every batch's CRC32C and framing is intact, and"
        " offsets strictly increase."
    )


@demo.command(name="log")
@data_option
def log_walkthrough() -> None:
    """Walk through the embedded log: topics, keys, offsets, compaction, retention."""
    ctx = app()
    started = time.perf_counter()
    console = stdout_console()
    narrator = _Narrator(console)
    console.print(
        f"[bold]eventlane demo log[/bold]: a walkthrough of the embedded log in"
        f" [bold]{ctx.data}[/bold]"
    )
    log = maintained_log(ctx.open_log(create=True), "eventlane demo")
    run = time.strftime("%H%M%S")
    _topics(narrator, log)
    partition, offset = _produce(narrator, log, run)
    _consume(narrator, log, partition, offset)
    _marks(narrator, log)
    _compaction(narrator, log, run)
    _retention(narrator, log, run)
    _describe(narrator, log)
    _verify(narrator, log)
    console.print()
    console.print(
        f"Done in {time.perf_counter() - started:.1f} s. Try next:\n"
        f"  eventlane --data {ctx.data} topics list\n"
        f"  eventlane --data {ctx.data} consume {ORDERS} --partition {partition} --max 5\n"
        f"  echo 'customer-9:hello' | eventlane --data {ctx.data} produce {ORDERS}"
        " --key-separator : --print-offsets\n"
        f"  eventlane --data {ctx.data} verify"
    )
