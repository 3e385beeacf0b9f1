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

    ``-H name=value`` (repeatable) adds the same header to every record of the plain mode.

    ``--json`` reads exactly what ``consume`` prints, one JSON object per line: ``key``,
    ``value`` (strings, or ``null``), ``headers`` (a list of ``[name, value]``), ``timestamp``
    (ms since the epoch; absent or ``null``: now) and ``partition`` (absent or ``null``: the
    key's placement; ``--partition`` overrides it); ``topic`` and ``offset`` are ignored.
    Strings are UTF-8 text, or with ``--base64`` base64 text, as ``consume --base64`` writes
    them. So ``eventlane consume A --base64 | eventlane produce B --json --base64`` copies
    topic A into B faithfully: same keys, values, headers, timestamps and partitions (B
    needs at least A's partition count; the offsets are B's own).

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
import select
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import click
import orjson
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from eventlane.cli.context import (
    OFFSET,
    PARTITION,
    SECONDS,
    TOPIC,
    app,
    data_option,
    stderr_console,
)
from eventlane.cli.groups import GROUP, consume_group
from eventlane.consumer.free import Consumer
from eventlane.errors import (
    ConfigError,
    FrameworkError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from eventlane.log.config import TopicConfig
from eventlane.log.names import refuse_internal
from eventlane.log.port import Log
from eventlane.log.producer import Producer
from eventlane.log.record import (
    RECORD_OVERHEAD,
    ProducerRecord,
    Record,
    RecordMetadata,
    TopicPartition,
)

READ_CHUNK = 1 << 20
"""Most bytes read from stdin per batch."""


# ---------------------------------------------------------------------------- produce
def _stdin_chunks(stream: IO[bytes]) -> Iterator[bytes]:
    """Yield what standard input has ready, up to :data:`READ_CHUNK` bytes at a time.

    One blocking read waits for data; then, while more is ready at once (``select`` with a
    zero timeout) and the chunk is under 1 MiB, it is added to the chunk. A fast writer
    therefore gives ~1 MiB batches and a slow one (a person typing, a trickling pipe) gets
    each line produced as it arrives, never waiting for end of input. Streams without a file
    descriptor (test runners) are read with ``read1``.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        read = getattr(stream, "read1", stream.read)
        while chunk := read(READ_CHUNK):
            yield chunk
        return
    while chunk := os.read(fd, READ_CHUNK):
        parts, size = [chunk], len(chunk)
        while size < READ_CHUNK and select.select([fd], [], [], 0)[0]:
            more = os.read(fd, READ_CHUNK - size)
            if not more:
                break  # end of input; the next read returns b"" too
            parts.append(more)
            size += len(more)
        yield parts[0] if len(parts) == 1 else b"".join(parts)


def _stdin_lines(stream: IO[bytes]) -> Iterator[list[bytes]]:
    """Yield the complete lines of each chunk (a partial last line waits for the next one)."""
    pending = b""
    for chunk in _stdin_chunks(stream):
        data = pending + chunk if pending else chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            pending = data
            continue
        pending = data[cut + 1 :]
        yield data[:cut].split(b"\n")
    if pending:
        yield [pending]


def _parse_json_lines(
    lines: list[bytes], first_line: int, topic: str, decode: Callable[[str], bytes]
) -> tuple[list[ProducerRecord], list[int | None], tuple[int, FrameworkError] | None]:
    """JSON lines -> records and their partitions, up to the first bad line (and its error)."""
    records: list[ProducerRecord] = []
    targets: list[int | None] = []
    for i, line in enumerate(lines):
        try:
            record, target = _parse_json_line(line, first_line + i, topic, decode)
        except InvalidRecordError as err:
            return records, targets, (i, err)
        records.append(record)
        targets.append(target)
    return records, targets, None


def _send_runs(
    producer: Producer,
    topic: str,
    records: list[ProducerRecord],
    targets: list[int | None],
) -> list[RecordMetadata]:
    """Append ``records``, each run of one target partition as one batch, in input order."""
    out: list[RecordMetadata] = []
    start = 0
    while start < len(records):
        end = start + 1
        while end < len(records) and targets[end] == targets[start]:
            end += 1
        out.extend(producer.send_batch(topic, records[start:end], partition=targets[start]))
        start = end
    return out


def _parse_line(
    line: bytes,
    sep: bytes | None,
    null_marker: bytes | None,
    headers: tuple[tuple[str, bytes], ...] = (),
) -> ProducerRecord:
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
    return ProducerRecord(key, value, headers)


def _json_field(obj: dict[str, object], name: str, line: int, topic: str) -> str | None:
    value = obj.get(name)
    if value is None or isinstance(value, str):
        return value
    raise InvalidRecordError(
        f"line {line}: {name!r} must be a string or null, got {type(value).__name__}", topic=topic
    )


def _parse_json_line(
    raw: bytes, line: int, topic: str, decode: Callable[[str], bytes]
) -> tuple[ProducerRecord, int | None]:
    """One line as ``consume`` prints it -> ``(record, partition or None)``.

    Raises :class:`InvalidRecordError` naming the line for anything ``consume`` would not
    have written (not JSON, a field of the wrong type, bad base64).
    """
    try:
        obj = orjson.loads(raw)
        if not isinstance(obj, dict):
            raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
        key = _json_field(obj, "key", line, topic)
        value = _json_field(obj, "value", line, topic)
        headers: list[tuple[str, bytes | None]] = []
        for pair in obj.get("headers") or []:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise TypeError(f"a header must be [name, value], got {pair!r}")
            if pair[1] is not None and not isinstance(pair[1], str):
                raise TypeError(f"header {pair[0]!r}: value must be a string or null")
            headers.append((pair[0], None if pair[1] is None else decode(pair[1])))
        timestamp = obj.get("timestamp")
        partition = obj.get("partition")
        for name, number in (("timestamp", timestamp), ("partition", partition)):
            if number is not None and (type(number) is not int or number < 0):
                raise TypeError(f"{name!r} must be an integer >= 0 or null, got {number!r}")
        record = ProducerRecord(
            None if key is None else decode(key),
            None if value is None else decode(value),
            tuple(headers),
            timestamp,
        )
        return record, partition
    except InvalidRecordError:
        raise
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise InvalidRecordError(
            f"line {line} is not a record as `eventlane consume` prints it: {exc}", topic=topic
        ) from None


def _decode_base64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _decode_utf8(text: str) -> bytes:
    return text.encode("utf-8")


class HeaderPairType(click.ParamType):  # type: ignore[type-arg]
    """``name=value``: one header for every record of the plain mode."""

    name = "name=value"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, bytes]:
        if isinstance(value, tuple):
            return value
        name, sep, text = str(value).partition("=")
        if not sep or not name:
            self.fail(f"expected name=value, got {value!r}", param, ctx)
        return name, text.encode()


def _first_refused(
    records: Sequence[ProducerRecord], config: TopicConfig, topic: str, first_line: int
) -> tuple[int, FrameworkError] | None:
    """The index of the first record the log would refuse, and an error naming its line.

    Checked before a chunk is appended, so the lines before a bad one are appended and
    acknowledged, and none after it.
    """
    limit = config.max_record_bytes
    for i, (key, value, _, _) in enumerate(records):
        line = first_line + i
        if config.compact and key is None:
            return i, InvalidRecordError(
                f"line {line} has no key, and topic {topic!r} is compacted: every record needs"
                " a key (use --key-separator)",
                topic=topic,
            )
        size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
        if size > limit:
            return i, RecordTooLargeError(
                f"line {line} is a record of {size} bytes; max_record_bytes is {limit}",
                topic=topic,
            )
    return None


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so Python's exit-time flush of a closed pipe cannot fail."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


@contextlib.contextmanager
def _stop_on_closed_stdout(acknowledged: Callable[[], int]) -> Iterator[None]:
    """Turn a closed standard output (the reader of ``--print-offsets`` went away) into a
    clear error: nobody receives acknowledgements any more, so producing stops."""
    try:
        yield
    except BrokenPipeError:
        _silence_stdout()
        raise click.ClickException(
            f"standard output was closed: stopped producing; {acknowledged()} record(s) were"
            " acknowledged before (the batch being printed was appended too)"
        ) from None


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
@click.option(
    "-H",
    "--header",
    "headers",
    type=HeaderPairType(),
    multiple=True,
    help="Add header name=value to every record (repeatable; plain mode).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Read JSON lines as `consume` prints them (key, value, headers, timestamp, partition).",
)
@click.option(
    "--base64",
    "as_base64",
    is_flag=True,
    help="With --json: keys, values and header values are base64 (as `consume --base64`).",
)
@data_option
def produce(
    topic: str,
    key_separator: str | None,
    partition: int | None,
    print_offsets: bool,
    null_marker: str | None,
    headers: tuple[tuple[str, bytes], ...],
    as_json: bool,
    as_base64: bool,
) -> None:
    """Append one record per line of standard input to TOPIC."""
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    refuse_internal(topic, "produce to it")
    if as_json and (key_separator is not None or null_marker is not None or headers):
        raise click.UsageError("--json reads whole records: no --key-separator/--null-marker/-H")
    if as_base64 and not as_json:
        raise click.UsageError("--base64 applies to --json input")
    log = app().open_log()
    config = log.topic_config(topic)
    count = log.partition_count(topic)
    if partition is not None and partition >= count:
        raise UnknownPartitionError(
            f"partition {partition} does not exist (topic has {count})",
            topic=topic,
            partition=partition,
        )
    producer = Producer(log)
    sep = key_separator.encode() if key_separator is not None else None
    marker = null_marker.encode() if null_marker is not None else None
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    console = stderr_console()
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
    with progress, _stop_on_closed_stdout(lambda: line_no - 1):
        task = progress.add_task("produce", total=_stdin_size(stdin), topic=topic, records=0)
        decode = _decode_base64 if as_base64 else _decode_utf8
        for lines in _stdin_lines(stdin):
            refused: tuple[int, FrameworkError] | None = None
            if as_json:
                records, targets, refused = _parse_json_lines(lines, line_no, topic, decode)
                if partition is not None:
                    targets = [partition] * len(records)
            else:
                records = [_parse_line(line, sep, marker, headers) for line in lines]
                targets = [partition] * len(records)
            first_refused = _first_refused(records, config, topic, line_no)
            if first_refused is not None:
                refused = first_refused
            if refused is not None:
                records = records[: refused[0]]  # the lines before the bad one still go
                targets = targets[: refused[0]]
            bad_target = next((t for t in targets if t is not None and t >= count), None)
            if bad_target is not None:
                at = targets.index(bad_target)
                refused = (
                    at,
                    UnknownPartitionError(
                        f"line {line_no + at}: partition {bad_target} does not exist"
                        f" (topic has {count})",
                        topic=topic,
                        partition=bad_target,
                    ),
                )
                records, targets = records[:at], targets[:at]
            # send_batch returns once every record is durable: only then are offsets printed.
            metadata = _send_runs(producer, topic, records, targets)
            if print_offsets and metadata:
                stdout.write(b"".join(b"%d %d\n" % (m.partition, m.offset) for m in metadata))
                stdout.flush()
            if refused is not None:
                raise refused[1]
            line_no += len(records)
            consumed += sum(len(line) + 1 for line in lines)
            progress.update(task, completed=consumed, records=line_no - 1)
    if console.is_terminal:
        console.print(f"produced {line_no - 1} record(s) to {topic}")


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


def _free_consumer(log: Log, topic: str, partition: int | None, offset: str | int) -> Consumer:
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
    type=SECONDS,
    metavar="S",
    help="Wait for new records like --follow, but stop after S seconds without one.",
)
@click.option(
    "--base64", "as_base64", is_flag=True, help="Keys, values and header values as base64."
)
@click.option("--group", type=GROUP, help="Consume as a member of consumer group G (commits).")
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(min=100),
    default=10_000,
    show_default=True,
    metavar="MS",
    help="With --group: evicted after MS silent.",
)
@click.option(
    "--commit",
    type=click.Choice(["before", "after"]),
    default="after",
    show_default=True,
    help="With --group: commit before printing (at-most-once) or after (at-least-once).",
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
    group: str | None,
    session_timeout_ms: int,
    commit: str,
) -> None:
    """Print TOPIC's records as JSON lines (with --group: as a consumer-group member)."""
    if group is not None:
        if partition is not None or isinstance(offset, int):
            raise click.UsageError("--group assigns partitions itself: no --partition/--offset N")
        encode = _b64 if as_base64 else _text
        return consume_group(
            topic,
            group,
            offset=str(offset),
            commit=commit,
            session_timeout_ms=session_timeout_ms,
            follow=follow,
            timeout=timeout,
            max_records=max_records,
            render=lambda r: record_json(r, encode),
        )
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
        _silence_stdout()  # the reader went away (`| head`): stop quietly
    except KeyboardInterrupt:
        stdout.flush()
        raise click.exceptions.Exit(130) from None
    finally:
        consumer.close()
