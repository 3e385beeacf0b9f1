"""Reading segment and index files as they are on disk, for ``eventlane dump``.

Like Kafka's ``kafka-dump-log``: a tool of the embedded storage engine that reads one file
directly and needs no data directory. A malformed batch ends the scan with an ``error``
entry instead of raising, so a damaged file can be inspected.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from framework.log.batch import (
    HEADER_SIZE,
    BatchHeader,
    batch_crc_ok,
    check_header,
    decode_records,
    parse_header,
)
from framework.log.config import TIMESTAMP_TYPES
from framework.log.record import Record
from framework.log.segment import (
    INDEX_SUFFIX as INDEX_SUFFIX,  # noqa: PLC0414 (re-exported)
)
from framework.log.segment import (
    LOG_SUFFIX as LOG_SUFFIX,  # noqa: PLC0414 (re-exported)
)
from framework.log.segment import (
    OFFSET_ENTRY,
    TIME_ENTRY,
)
from framework.log.segment import (
    TIMEINDEX_SUFFIX as TIMEINDEX_SUFFIX,  # noqa: PLC0414 (re-exported)
)

__all__ = ["INDEX_SUFFIX", "LOG_SUFFIX", "TIMEINDEX_SUFFIX", "batches", "index_entries"]


def _coordinates(path: Path) -> tuple[str, int]:
    """``(topic, partition)`` from ``<topic>/<partition>/<segment>``, when the path has them."""
    partition = path.parent.name
    return path.parent.parent.name or "?", int(partition) if partition.isdigit() else -1


def _segment_base(path: Path) -> int:
    stem = path.name.split(".", 1)[0]
    return int(stem) if stem.isdigit() else 0


def batches(path: Path) -> Iterator[dict[str, Any]]:
    """Every batch of a segment file as a dict; a malformed one ends the scan with ``error``."""
    topic, partition = _coordinates(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            head = os.pread(fd, HEADER_SIZE, pos)
            if len(head) < HEADER_SIZE:
                yield {"position": pos, "error": f"truncated batch header ({len(head)} bytes)"}
                return
            h: BatchHeader = parse_header(head, 0)
            problem = check_header(h)
            if problem is None and pos + h.size > size:
                problem = f"batch of {h.size} bytes runs past the end of the file ({size})"
            if problem is not None:
                yield {"position": pos, "base_offset": h.base_offset, "error": problem}
                return
            buf = os.pread(fd, h.size, pos)
            crc_valid = batch_crc_ok(buf, 0, h)
            batch: dict[str, Any] = {
                "position": pos,
                "base_offset": h.base_offset,
                "last_offset": h.last_offset,
                "count": h.record_count,
                "size": h.size,
                "magic": h.magic,
                "crc": h.crc,
                "crc_valid": crc_valid,
                "timestamp_type": TIMESTAMP_TYPES[h.timestamp_type],
                "base_timestamp": h.base_timestamp,
                "max_timestamp": h.max_timestamp,
                "error": None if crc_valid else "CRC32C mismatch",
            }
            try:
                batch["records"] = decode_records(
                    buf,
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
            pos += h.size
    finally:
        os.close(fd)


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
