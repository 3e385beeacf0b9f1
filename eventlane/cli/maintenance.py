"""``eventlane compact``, ``cleanup``, ``dump`` and ``verify``: the log's maintenance tools.

* ``compact TOPIC`` runs the cleaner on every partition (:mod:`eventlane.log.embedded.cleaner`).
* ``cleanup TOPIC`` applies retention to every partition (:mod:`eventlane.log.embedded.retention`).
* ``dump FILE`` prints a segment's batches and records, or an index's entries, like Kafka's
  ``kafka-dump-log``; it reads the file directly and needs no data directory. Exit status 1
  when a batch fails its CRC or is malformed (the output says where).
* ``verify [TOPIC]`` checks every batch of every segment (framing, CRC32C, offset order).
  Exit status 1 when anything is corrupt, with one line per bad spot naming the topic,
  partition, file, byte position and offset. Then it compares the event store's key
  indexes (``<data>/store``) with the log (``Log.check_keys``); ``--repair``
  rebuilds those that differ. Exit status 1 when one differs and was not repaired.

``compact``, ``cleanup`` and ``verify`` go through the log port (its ``progress`` callback
drives the bars); ``dump`` reads one file of the embedded engine
(:mod:`eventlane.log.embedded.dump`), as ``kafka-dump-log`` does for Kafka's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from eventlane.cli.context import (
    TOPIC,
    app,
    data_option,
    json_option,
    stderr_console,
    stdout_console,
)
from eventlane.cli.render import human_bytes, simple_table
from eventlane.errors import ConfigError, CorruptRecordError, ReadOnlyDataError
from eventlane.log.embedded.dump import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    batches,
    index_entries,
)
from eventlane.log.port import MaintainedLog, maintained_log
from eventlane.log.record import Record
from eventlane.log.types import KeyIndexReport
from eventlane.log.types import Progress as LogProgress

if TYPE_CHECKING:
    from eventlane.projection.postgres import SchemaCheck


def _progress(label: str) -> Progress:
    console = stderr_console()
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[what]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def _json_out(value: object) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


@contextmanager
def _partition_bar(label: str) -> Iterator[LogProgress]:
    """A progress bar driven by the log's ``progress(done, total, partition)`` callback."""
    with _progress(label) as progress:
        task = progress.add_task(label, total=None, what="")

        def report(done: int, total: int, partition: int) -> None:
            progress.update(task, completed=done, total=total, what=f"partition {partition}")

        yield report


# ---------------------------------------------------------------------------- compact
@click.command()
@click.argument("topic", type=TOPIC)
@json_option
@data_option
def compact(topic: str, as_json: bool) -> None:
    """Compact TOPIC: keep the last record of every key, offsets unchanged."""
    log = maintained_log(app().open_log(), "eventlane compact")
    config = log.topic_config(topic)
    if not config.compact:
        raise ConfigError(
            f"topic {topic!r} has cleanup_policy={config.cleanup_policy}: compaction applies"
            f" only to compact or compact,delete topics (eventlane topics alter {topic}"
            " --config cleanup.policy=compact)",
            topic=topic,
        )
    with _partition_bar(f"compacting {topic}") as progress:
        reports = log.compact(topic, progress=progress)
    if as_json:
        _json_out([r._asdict() for r in reports])
        return
    stdout_console().print(
        simple_table(
            f"Compaction of {topic}",
            ("partition", "segments", "records scanned", "records kept", "bytes", "seconds"),
            (
                (
                    r.partition,
                    f"{r.segments_before} -> {r.segments_after}",
                    r.records_scanned,
                    r.records_kept,
                    f"{human_bytes(r.bytes_before)} -> {human_bytes(r.bytes_after)}",
                    r.seconds,
                )
                for r in reports
            ),
        )
    )
    if not any(r.segments_before for r in reports):
        click.echo(
            "nothing was cleanable: compaction skips the active segment and records younger"
            f" than min_compaction_lag_ms ({config.min_compaction_lag_ms} ms)"
        )


# ---------------------------------------------------------------------------- cleanup
@click.command()
@click.argument("topic", type=TOPIC)
@json_option
@data_option
def cleanup(topic: str, as_json: bool) -> None:
    """Apply TOPIC's retention: delete old segments, advancing the low-water mark."""
    log = maintained_log(app().open_log(), "eventlane cleanup")
    config = log.topic_config(topic)
    if not config.delete:
        raise ConfigError(
            f"topic {topic!r} has cleanup_policy={config.cleanup_policy}: retention applies"
            " only to delete or compact,delete topics",
            topic=topic,
        )
    with _partition_bar(f"retention on {topic}") as progress:
        reports = log.cleanup(topic, progress=progress)
    if as_json:
        _json_out([r._asdict() for r in reports])
        return
    stdout_console().print(
        simple_table(
            f"Retention of {topic} (retention_ms={config.retention_ms},"
            f" retention_bytes={config.retention_bytes})",
            ("partition", "LWM before", "LWM after", "segments deleted", "bytes deleted"),
            (
                (
                    r.partition,
                    r.old_lwm,
                    r.new_lwm,
                    r.segments_deleted,
                    human_bytes(r.bytes_deleted),
                )
                for r in reports
            ),
        )
    )


# ---------------------------------------------------------------------------- dump
def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="replace")


def _record_dict(r: Record) -> dict[str, Any]:
    return {
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": _text(r.key),
        "value": _text(r.value),
        "headers": [[name, _text(value)] for name, value in r.headers],
    }


def _quote(text: str | None) -> str:
    return "null" if text is None else orjson.dumps(text).decode()


def _dump_log(path: Path, as_json: bool, with_records: bool) -> int:
    problems = 0
    if not as_json:
        click.echo(f"Dumping {path}")
    for batch in batches(path):
        if batch["error"] is not None:
            problems += 1
        if "last_offset" not in batch:  # a malformed header: nothing more can be read
            if as_json:
                click.echo(orjson.dumps(batch).decode())
            else:
                click.echo(
                    f"ERROR at position {batch['position']}"
                    f" (offset {batch.get('base_offset', '?')}): {batch['error']}"
                )
            break
        records: list[Record] = batch.pop("records")
        if as_json:
            batch["records"] = [_record_dict(r) for r in records] if with_records else None
            click.echo(orjson.dumps(batch).decode())
            continue
        click.echo(
            f"baseOffset: {batch['base_offset']} lastOffset: {batch['last_offset']}"
            f" count: {batch['count']} position: {batch['position']} size: {batch['size']}"
            f" magic: {batch['magic']} crc: 0x{batch['crc']:08x}"
            f" crcValid: {str(batch['crc_valid']).lower()}"
            f" timestampType: {batch['timestamp_type']}"
            f" baseTimestamp: {batch['base_timestamp']} maxTimestamp: {batch['max_timestamp']}"
            + (f" ERROR: {batch['error']}" if batch["error"] else "")
        )
        if with_records:
            for r in records:
                headers = ", ".join(f"{name}={_quote(_text(v))}" for name, v in r.headers)
                click.echo(
                    f"| offset: {r.offset} timestamp: {r.timestamp} key: {_quote(_text(r.key))}"
                    f" value: {_quote(_text(r.value))} headers: [{headers}]"
                )
    return problems


def _dump_index(path: Path, as_json: bool) -> int:
    rows, trailing = index_entries(path)
    if not as_json:
        click.echo(f"Dumping {path} ({len(rows)} entries)")
    for row in rows:
        if as_json:
            click.echo(orjson.dumps(row).decode())
        else:
            click.echo(" ".join(f"{k}: {v}" for k, v in row.items()))
    if trailing:
        click.echo(f"trailing {trailing} byte(s) are not a whole entry", err=True)
        return 1
    return 0


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
@click.option("--batches-only", is_flag=True, help="Print batch headers without their records.")
@data_option
def dump(file: Path, as_json: bool, batches_only: bool) -> None:
    """Print the batches and records of segment FILE (or the entries of a .index/.timeindex).

    With --json, one JSON object per batch (or index entry) and line.
    """
    if file.name.endswith(LOG_SUFFIX):
        problems = _dump_log(file, as_json, not batches_only)
    elif file.name.endswith((INDEX_SUFFIX, TIMEINDEX_SUFFIX)):
        problems = _dump_index(file, as_json)
    else:
        raise ConfigError(
            f"{file.name!r} is not a segment file: expected <offset>.log, .index or .timeindex",
            path=file,
        )
    if problems:
        raise click.ClickException(f"{problems} bad batch(es) in {file}")


# ---------------------------------------------------------------------------- verify
def _problem_dict(err: CorruptRecordError) -> dict[str, Any]:
    return {
        "topic": err.topic,
        "partition": err.partition,
        "file": err.path,
        "position": err.position,
        "offset": err.offset,
        "problem": err.message,
    }


def verify_log(
    log: MaintainedLog, topics: list[str], *, skip_lost: bool = False
) -> tuple[int, list[CorruptRecordError]]:
    """Check every partition of ``topics``; return how many were checked and the problems.

    With ``skip_lost``, a partition that refuses to open because acknowledged offsets are
    missing (:class:`DataLossError`) is repaired by skipping them for good (the log says
    which, as a warning), then checked.
    """
    counts = {t: log.partition_count(t) for t in topics}
    problems: list[CorruptRecordError] = []
    with _progress("verifying") as bar:
        task = bar.add_task("verify", total=sum(counts.values()), what="")
        before = 0
        for topic in topics:

            def advance(
                done: int, total: int, partition: int, topic: str = topic, before: int = before
            ) -> None:
                bar.update(task, completed=before + done, what=f"{topic}/{partition}")

            # only when asked: an engine that never skips offsets (JetStream) has no such option
            lost = {"skip_lost_offsets": True} if skip_lost else {}
            for err in log.verify(topic, progress=advance, **lost):
                if not isinstance(err, CorruptRecordError):
                    raise err
                problems.append(err)
            before += counts[topic]
    return sum(counts.values()), problems


def _echo_index_reports(reports: list[KeyIndexReport]) -> None:
    for r in reports:
        where = f"topic={r.topic} partition={r.partition} file={r.path}"
        if r.repaired:
            click.echo(f"REPAIRED key index {where}: {r.problem_count} problem(s), rebuilt")
        for problem in () if r.repaired else r.problems:
            click.echo(f"KEY INDEX {where}: {problem}")
        if not r.repaired and r.problem_count > len(r.problems):
            click.echo(f"KEY INDEX {where}: … and {r.problem_count - len(r.problems)} more")
    if all(r.ok for r in reports):
        click.echo(f"checked {len(reports)} key index(es): consistent with the log")


@click.command()
@click.argument("topic", type=TOPIC, required=False)
@click.option("--repair", is_flag=True, help="Rebuild key indexes that differ from the log.")
@click.option(
    "--skip-lost-offsets",
    is_flag=True,
    help="Open partitions whose acknowledged offsets are missing by skipping those offsets"
    " for good (logged; they are never reused).",
)
@click.option(
    "--readmodels",
    metavar="URL",
    envvar="EVENTLANE_READMODELS",
    help="Also check the read models in this PostgreSQL database (postgresql://...): every"
    " table reads, no position past the log's high-water mark [env EVENTLANE_READMODELS].",
)
@json_option
@data_option
def verify(
    topic: str | None,
    repair: bool,
    skip_lost_offsets: bool,
    readmodels: str | None,
    as_json: bool,
) -> None:
    """Check the CRC and framing of every batch of TOPIC (default: every topic), then the
    event store's key indexes against the log (--repair rebuilds those that differ), and
    the read models in the PostgreSQL database --readmodels names."""
    log = maintained_log(app().open_log(), "eventlane verify")
    topics = [topic] if topic is not None else log.list_topics()
    if topic is not None:
        log.partition_count(topic)  # an unknown topic is an error, not "0 problems"
    checked, problems = verify_log(log, topics, skip_lost=skip_lost_offsets)
    # Key indexes are derived from the log: check them only against an intact log.
    index_topics = None if topic is None else [topic]
    read_only = not os.access(log.local.root, os.W_OK)  # a read-only mount: the log only
    if read_only and repair:
        raise ReadOnlyDataError("--repair must write, and the data directory is read-only")
    if read_only:
        stderr_console().print("key indexes not checked: the data directory is read-only")
    skip = problems or read_only
    indexes = [] if skip else log.check_keys(index_topics, repair=repair)
    bad_indexes = [r for r in indexes if not r.ok and not r.repaired]
    from eventlane.projection.readmodel import (  # noqa: PLC0415 - only verify needs it
        SQLITE_VERSION,
        sqlite_note,
    )

    note = sqlite_note()
    schemas = [] if topic is not None else _check_readmodels(log, readmodels)
    bad_schemas = [c for c in schemas if c.problems]
    if as_json:
        _json_out(
            {
                "partitions_checked": checked,
                "problems": [_problem_dict(e) for e in problems],
                "key_indexes": [r._asdict() for r in indexes],
                "sqlite": {"version": SQLITE_VERSION, "note": note},
                "readmodels": [c.to_json() for c in schemas],
            }
        )
    elif not problems:
        click.echo(
            f"verified {checked} partition(s) of {len(topics)} topic(s): every batch is intact"
        )
    for err in problems:
        if not as_json:
            click.echo(
                f"CORRUPT topic={err.topic} partition={err.partition} file={err.path}"
                f" position={err.position} offset={err.offset}: {err.message}"
            )
    if not as_json and not problems:
        _echo_index_reports(indexes)
    if not as_json and note is not None:
        click.echo(f"note: {note}")
    for check in [] if as_json else schemas:
        click.echo(
            f"read model schema {check.schema}: {check.tables} table(s),"
            f" {check.positions} position(s), {len(check.problems) or 'no'} problem(s)"
        )
        for problem in check.problems:
            click.echo(f"READ MODEL schema={check.schema}: {problem}")
    if problems:
        raise click.ClickException(
            f"{len(problems)} corrupt spot(s) in {checked} partition(s) checked"
        )
    if bad_indexes:
        raise click.ClickException(
            f"{len(bad_indexes)} key index(es) differ from the log (eventlane verify --repair"
            " rebuilds them)"
        )
    if bad_schemas:
        raise click.ClickException(
            f"{len(bad_schemas)} read model schema(s) with problems: "
            + ", ".join(c.schema for c in bad_schemas)
        )


def _check_readmodels(log: MaintainedLog, url: str | None) -> list[SchemaCheck]:
    """The PostgreSQL read models' checks (none without a ``postgresql://`` URL)."""
    from eventlane.projection.postgres import check_schemas, is_postgres_url  # noqa: PLC0415

    if url is None or not is_postgres_url(url):
        return []

    def hwm(topic: str, partition: int) -> int | None:
        if not log.topic_exists(topic) or partition >= log.partition_count(topic):
            return None
        return log.offsets(topic, partition).hwm

    return check_schemas(url, hwm)
