"""Reading segment and index files as they are on disk, for ``eventlane dump``.

Like Kafka's ``kafka-dump-log``: a tool of the embedded storage engine that reads one file
directly and needs no data directory. A malformed batch ends the scan with an ``error``
entry instead of raising, so a damaged file can be inspected.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eventlane.log.config import TIMESTAMP_TYPES
from eventlane.log.embedded.batch import HEADER_SIZE, decode_records
from eventlane.log.embedded.segment import (
    INDEX_SUFFIX as INDEX_SUFFIX,  # noqa: PLC0414 (re-exported)
)
from eventlane.log.embedded.segment import (
    LOG_SUFFIX as LOG_SUFFIX,  # noqa: PLC0414 (re-exported)
)
from eventlane.log.embedded.segment import (
    OFFSET_ENTRY,
    TIME_ENTRY,
    Segment,
)
from eventlane.log.embedded.segment import (
    TIMEINDEX_SUFFIX as TIMEINDEX_SUFFIX,  # noqa: PLC0414 (re-exported)
)
from eventlane.log.record import Record

__all__ = ["INDEX_SUFFIX", "LOG_SUFFIX", "TIMEINDEX_SUFFIX", "batches", "index_entries"]


def _coordinates(path: Path) -> tuple[str, int]:
    """``(topic, partition)`` from ``<topic>/<partition>/<segment>``, when the path has them."""
    partition = path.parent.name
    return path.parent.parent.name or "?", int(partition) if partition.isdigit() else -1


def _segment_base(path: Path) -> int:
    stem = path.name.split(".", 1)[0]
    return int(stem) if stem.isdigit() else 0


def batches(path: Path) -> Iterator[dict[str, Any]]:
    """Every batch of a segment file as a dict (:meth:`Segment.scan_lenient
    <eventlane.log.embedded.segment.Segment.scan_lenient>`): a CRC mismatch or a malformed record is
    reported in ``error`` and the scan goes on; a malformed header ends it with an entry that
    has ``error`` and no ``last_offset``."""
    topic, partition = _coordinates(path)
    for found in Segment(path.parent, _segment_base(path)).scan_lenient():
        h = found.header
        if h is None or not found.raw:
            yield {
                "position": found.position,
                **({} if h is None else {"base_offset": h.base_offset}),
                "error": found.error,
            }
            return
        batch: dict[str, Any] = {
            "position": found.position,
            "base_offset": h.base_offset,
            "last_offset": h.last_offset,
            "count": h.record_count,
            "size": h.size,
            "magic": h.magic,
            "crc": h.crc,
            "crc_valid": found.error is None,
            "timestamp_type": TIMESTAMP_TYPES[h.timestamp_type],
            "base_timestamp": h.base_timestamp,
            "max_timestamp": h.max_timestamp,
            "error": found.error,
        }
        try:
            batch["records"] = decode_records(
                found.raw,
                HEADER_SIZE,
                h.size,
                h.base_offset,
                h.base_timestamp,
                h.timestamp_type,
                topic,
                partition,
                0,
                Record,
            )
        except ValueError as exc:
            batch["records"] = []
            batch["error"] = f"malformed record: {exc}"
        yield batch


def index_entries(path: Path) -> tuple[list[dict[str, int]], int]:
    """The entries of a ``.index`` (``{"offset", "position"}``) or ``.timeindex``
    (``{"timestamp", "offset"}``) file, and the count of trailing bytes that are not a
    whole entry."""
    base = _segment_base(path)
    raw = path.read_bytes()
    time_index = path.name.endswith(TIMEINDEX_SUFFIX)
    entry = TIME_ENTRY if time_index else OFFSET_ENTRY
    rows: list[dict[str, int]] = []
    for fields in entry.iter_unpack(raw[: len(raw) - len(raw) % entry.size]):
        if time_index:
            ts, rel = fields
            rows.append({"timestamp": ts, "offset": base + rel})
        else:
            rel, position = fields
            rows.append({"offset": base + rel, "position": position})
    return rows, len(raw) % entry.size
