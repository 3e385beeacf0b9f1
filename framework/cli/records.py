"""``eventlane produce`` and ``eventlane consume``: records from stdin, records as JSON lines.

produce
    One record per line of standard input (``\\n`` ends a line; a ``\\r`` before it is
    dropped; the last line needs no newline). With ``--key-separator SEP`` a line
    ``key SEP value`` is split at the first ``SEP``; a line without ``SEP`` is a value with no
    key. Bytes are stored as given (no decoding). ``--null-marker M`` turns a value equal to
    ``M`` into a null value (a tombstone). The partition is ``--partition P``, else Kafka's
    ``murmur2(key)`` placement, else keyless records are spread (sticky per batch).

    Durability and ``--print-offsets``: input is read in chunks of whatever is available
    (up to 1 MiB, never waiting for end of input); each chunk's complete lines are appended
    as one batch per partition, and only after the append returned (the records are durable
    per the topic's flush policy) is one ``partition offset`` line per record printed and
    standard output flushed. A process killed at any moment has printed only records that
    are durable. A bad line (a keyless record on a compacted topic, a record over
    ``max_record_bytes``) stops the command with an error naming the line number; the lines
    before it are appended and printed, none after it.

consume
    Prints one JSON object per record and line::

        {"topic", "partition", "offset", "key", "value", "timestamp", "headers"}

    ``key``/``value`` are the bytes decoded as UTF-8, with invalid bytes replaced by U+FFFD
    (lossy), ``null`` when absent; ``headers`` is a list of ``[name, value]``. With
    ``--base64`` keys, values and header values are base64 text instead (lossless).
"""

from __future__ import annotations

import base64
import contextlib
import os
import stat
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import IO

import click
import orjson
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from framework.cli.context import OFFSET, PARTITION, TOPIC, app, data_option, stderr_console
from framework.consumer.free import Consumer
from framework.errors import (
    ConfigError,
    FrameworkError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from framework.log.partition import RECORD_OVERHEAD, RecordTuple
from framework.log.partitioner import KeylessSpreader, partitions_for_keys
from framework.log.record import Record, TopicPartition
from framework.log.store import LogStore

READ_CHUNK = 1 << 20
"""Most bytes read from stdin per batch."""


# ---------------------------------------------------------------------------- produce
def _stdin_lines(stream: IO[bytes]) -> Iterator[list[bytes]]:
    """Yield lists of complete lines, one list per chunk of what stdin had available.

    ``read1`` returns what is buffered or what one ``read`` system call gives: on a pipe or
    terminal that is the data ready now, so a slow writer's lines are produced as they come,
    not at end of input.
    """
    read = getattr(stream, "read1", stream.read)
    pending = b""
    while True:
        chunk = read(READ_CHUNK)
        if not chunk:
            break
        data = pending + chunk if pending else chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            pending = data
            continue
        pending = data[cut + 1 :]
        yield data[:cut].split(b"\n")
    if pending:
        yield [pending]


def _parse_line(line: bytes, sep: bytes | None, null_marker: bytes | None) -> RecordTuple:
    if line.endswith(b"\r"):
        line = line[:-1]
    key: bytes | None = None
    value: bytes | None = line
    if sep is not None:
        head, found, tail = line.partition(sep)
        if found:
            key, value = head, tail
    if null_marker is not None and value == null_marker:
        value = None
    return (key, value, (), None)


class _Appender:
    """Places records in partitions and appends them, one append per partition per batch."""

    def __init__(self, log: LogStore, topic: str, partition: int | None) -> None:
        self.log = log
        self.topic = topic
        self.partition = partition
        self.config = log.topic_config(topic)
        self.spreader: KeylessSpreader | None = None
        self.count = 0
        self._partitions = log.partition_count(topic)
        if partition is not None and partition >= self._partitions:
            raise UnknownPartitionError(
                f"partition {partition} does not exist (topic has {self._partitions})",
                topic=topic,
                partition=partition,
            )

    def check(
        self, records: Sequence[RecordTuple], first_line: int
    ) -> tuple[int, FrameworkError] | None:
        """The index of the first record the log would refuse, and the error naming its line."""
        limit = self.config.max_record_bytes
        for i, (key, value, _, _) in enumerate(records):
            line = first_line + i
            if self.config.compact and key is None:
                return i, InvalidRecordError(
                    f"line {line} has no key, and topic {self.topic!r} is compacted: every"
                    " record needs a key (use --key-separator)",
                    topic=self.topic,
                )
            size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
            if size > limit:
                return i, RecordTooLargeError(
                    f"line {line} is a record of {size} bytes; max_record_bytes is {limit}",
                    topic=self.topic,
                )
        return None

    def placements(self, records: Sequence[RecordTuple]) -> list[int]:
        if self.partition is not None:
            return [self.partition] * len(records)
        count = self.log.partition_count(self.topic)
        if count != self._partitions or self.spreader is None:
            self._partitions = count
            self.spreader = KeylessSpreader(count)
        keyed = [i for i, r in enumerate(records) if r[0] is not None]
        out = [-1] * len(records)
        if keyed:
            keys = [records[i][0] or b"" for i in keyed]
            for i, p in zip(keyed, partitions_for_keys(keys, count), strict=True):
                out[i] = p
        if len(keyed) < len(records):
            sticky = self.spreader.next_partition()  # Kafka's sticky partitioner: one per batch
            out = [sticky if p < 0 else p for p in out]
        return out

    def append(self, records: Sequence[RecordTuple]) -> list[tuple[int, int]]:
        """Append ``records``; return ``(partition, offset)`` of each, in input order."""
        if not records:
            return []
        placed = self.placements(records)
        by_partition: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(placed):
            by_partition[p].append(i)
        out: list[tuple[int, int]] = [(0, 0)] * len(records)
        for p, indexes in by_partition.items():
            chunk = records if len(by_partition) == 1 else [records[i] for i in indexes]
            result = self.log.append(self.topic, p, chunk)
            for n, i in enumerate(indexes):
                out[i] = (p, result.base_offset + n)
        self.count += len(records)
        return out


def _stdin_size(stream: IO[bytes]) -> int | None:
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) and st.st_size > 0 else None


@click.command()
@click.argument("topic", type=TOPIC)
@click.option(
    "--key-separator",
    metavar="SEP",
    help="Split each line at the first SEP into key and value (no SEP: value only).",
)
@click.option("--partition", type=PARTITION, help="Append every record to partition P.")
@click.option(
    "--print-offsets", is_flag=True, help="Print 'partition offset' per record once durable."
)
@click.option(
    "--null-marker", metavar="M", help="A value equal to M is produced as null (a tombstone)."
)
@data_option
def produce(
    topic: str,
    key_separator: str | None,
    partition: int | None,
    print_offsets: bool,
    null_marker: str | None,
) -> None:
    """Append one record per line of standard input to TOPIC."""
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    log = app().open_log()
    appender = _Appender(log, topic, partition)
    sep = key_separator.encode() if key_separator is not None else None
    marker = null_marker.encode() if null_marker is not None else None
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    console = stderr_console()
    total = _stdin_size(stdin)
    progress = Progress(
        TextColumn("producing to [bold]{task.fields[topic]}[/bold]"),
        BarColumn(),
        TextColumn("{task.fields[records]} records"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    line_no = 1
    consumed = 0
    with progress:
        task = progress.add_task("produce", total=total, topic=topic, records=0)
        for lines in _stdin_lines(stdin):
            records = [_parse_line(line, sep, marker) for line in lines]
            problem = appender.check(records, line_no)
            if problem is not None:
                records = records[: problem[0]]  # the lines before the bad one still go
            placed = appender.append(records)
            if print_offsets and placed:
                stdout.write(b"".join(b"%d %d\n" % po for po in placed))
                stdout.flush()
            if problem is not None:
                raise problem[1]
            line_no += len(records)
            consumed += sum(len(line) + 1 for line in lines)
            progress.update(task, completed=consumed, records=appender.count)
    if console.is_terminal:
        console.print(f"produced {appender.count} record(s) to {topic}")


# ---------------------------------------------------------------------------- consume
def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="replace")


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def record_json(record: Record, encode: Callable[[bytes | None], str | None] = _text) -> bytes:
    """One record as the JSON line ``consume`` prints (without the newline)."""
    return orjson.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "key": encode(record.key),
            "value": encode(record.value),
            "timestamp": record.timestamp,
            "headers": [[name, encode(value)] for name, value in record.headers],
        }
    )


def _free_consumer(log: LogStore, topic: str, partition: int | None, offset: str | int) -> Consumer:
    """A free consumer positioned per ``--partition``/``--offset``.

    (A later ``--group`` builds a group member here instead.)
    """
    count = log.partition_count(topic)
    if partition is not None and partition >= count:
        raise UnknownPartitionError(
            f"partition {partition} does not exist (topic has {count})",
            topic=topic,
            partition=partition,
        )
    if isinstance(offset, int) and partition is None:
        raise ConfigError("--offset N needs --partition P (an offset belongs to one partition)")
    reset = offset if isinstance(offset, str) else "error"
    consumer = Consumer(log, auto_offset_reset=reset)
    wanted = [
        TopicPartition(topic, p) for p in ([partition] if partition is not None else range(count))
    ]
    consumer.assign(wanted)
    if isinstance(offset, int):
        marks = log.offsets(topic, wanted[0].partition)
        if not marks.lwm <= offset <= marks.leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range: partition {wanted[0].partition} holds"
                f" [{marks.lwm}, {marks.leo}) (low-water mark, log end offset)",
                topic=topic,
                partition=wanted[0].partition,
                offset=offset,
                lwm=marks.lwm,
                leo=marks.leo,
            )
        consumer.seek(wanted[0], offset)
    elif offset == "earliest":
        consumer.seek_to_beginning(*wanted)
    else:
        consumer.seek_to_end(*wanted)
    return consumer


@click.command()
@click.argument("topic", type=TOPIC)
@click.option("--partition", type=PARTITION, help="Read only partition P (default: all).")
@click.option(
    "--offset",
    type=OFFSET,
    default="earliest",
    show_default=True,
    help="Start at the low-water mark, the high-water mark, or offset N (needs --partition).",
)
@click.option("--max", "max_records", type=click.IntRange(min=0), help="Stop after N records.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new records (tail -f).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    metavar="S",
    help="Wait for new records like --follow, but stop after S seconds without one.",
)
@click.option(
    "--base64", "as_base64", is_flag=True, help="Keys, values and header values as base64."
)
@data_option
def consume(
    topic: str,
    partition: int | None,
    offset: str | int,
    max_records: int | None,
    follow: bool,
    timeout: float | None,
    as_base64: bool,
) -> None:
    """Print TOPIC's records as JSON lines."""
    log = app().open_log()
    consumer = _free_consumer(log, topic, partition, offset)
    stdout = sys.stdout.buffer
    encode = _b64 if as_base64 else _text
    waiting = follow or timeout is not None
    left = max_records
    idle_since = time.monotonic()
    try:
        while left is None or left > 0:
            wait = 0.0
            if waiting:
                wait = 1.0
                if timeout is not None:
                    wait = max(0.0, min(wait, idle_since + timeout - time.monotonic()))
            records = consumer.poll(timeout=wait, max_records=min(left or 500, 500))
            if records:
                stdout.write(b"".join(record_json(r, encode) + b"\n" for r in records))
                stdout.flush()
                idle_since = time.monotonic()
                if left is not None:
                    left -= len(records)
                continue
            if not waiting:
                break  # caught up with every partition's high-water mark
            if timeout is not None and time.monotonic() - idle_since >= timeout:
                break
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's exit-time flush
        # of stdout from failing again.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
    except KeyboardInterrupt:
        stdout.flush()
        raise click.exceptions.Exit(130) from None
    finally:
        consumer.close()
