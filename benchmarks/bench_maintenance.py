"""Compaction and retention throughput (figure 6).

For each key space (``--keys``, default 10k and 500k distinct keys) a master copy of one
partition is written once: ``--records`` records (default 2M; 100-byte values, ~10-byte
keys drawn round-robin from the key space), 16 MiB segments, so all but the last segment are
closed and cleanable. Every run works on a fresh copy of that directory (copied before the
clock starts; the copy is in the page cache, as is the baseline's input). Each round runs:

* ``raw``         baseline: plain sequential read + parse (no CRC) of the same closed
                  segments, every record into an ``(offset, key, value)`` tuple
                  (:func:`_raw.read_parse`)
* ``compact``     ``LogStore.compact(topic)``: records scanned per second of wall time
                  (scan = the key → offset map pass; the copy pass re-reads the same
                  records; both, plus fsyncs and the swap, are inside the time)
* ``retention``   ``LogStore.cleanup(topic)`` on a ``delete`` topic whose
                  ``retention_bytes`` (4 MiB) deletes every closed segment: records deleted
                  per second (retention deletes whole segments, so this is cheap by design)

    .venv/bin/python benchmarks/bench_maintenance.py [--quick] [--runs 5] [--json]
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from _harness import Bench, Target, bench_from_args, parser, quiet_logs, scratch_dir
from _raw import read_parse

from eventlane.log.embedded.segment import list_segment_bases, log_path
from eventlane.log.embedded.store import LogStore

VALUE_SIZE = 100
SEGMENT_BYTES = 16 << 20
TOPIC = "maint"


def build(root: Path, count: int, keys: int, config: Mapping[str, object]) -> Path:
    """Write the master copy; return its data directory."""
    data = root / "master"
    store = LogStore(data)
    store.create_topic(TOPIC, 1, dict(config))
    value = os.urandom(VALUE_SIZE)
    batch = 10_000
    for start in range(0, count, batch):
        store.append(
            TOPIC,
            0,
            [
                (b"key-%06d" % (i % keys), value, (), None)
                for i in range(start, min(start + batch, count))
            ],
        )
    store.close()
    return data


def closed_segments(data: Path) -> list[Path]:
    part = data / "topics" / TOPIC / "0"
    bases = list_segment_bases(part)
    return [log_path(part, b) for b in bases[:-1]]


class Copies:
    def __init__(self, root: Path, master: Path) -> None:
        self.root, self.master, self.n = root, master, 0

    def fresh(self) -> Path:
        self.n += 1
        target = self.root / f"copy-{self.n}"
        shutil.copytree(self.master, target)
        return target


def figure6_compaction(bench: Bench, root: Path, count: int, keys: int) -> None:
    master = build(
        root,
        count,
        keys,
        {"cleanup_policy": "compact", "segment_bytes": SEGMENT_BYTES, "min_compaction_lag_ms": 0},
    )
    segments = closed_segments(master)
    copies = Copies(root, master)
    label = f"{keys // 1000}k keys"

    def raw() -> Mapping[str, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        got = read_parse(segments, verify_crc=False)
        return {
            "wall": got / (time.perf_counter() - t0),
            "cpu": got / (time.process_time() - c0),
        }

    def compact() -> Mapping[str, float]:
        data = copies.fresh()
        store = LogStore(data)
        store.partition(TOPIC, 0)
        t0, c0 = time.perf_counter(), time.process_time()
        reports: list[Any] = store.compact(TOPIC)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        report = reports[0]
        store.close()
        shutil.rmtree(data)
        return {
            "scanned_per_s": report.records_scanned / seconds,
            "scanned_per_cpu_s": report.records_scanned / cpu,
            "kept_fraction": report.records_kept / max(report.records_scanned, 1),
        }

    bench.rounds({f"raw_{keys}": raw, f"compact_{keys}": compact}, warmup=True)
    bench.add(f"6. baseline: read + parse closed segments ({label})", "rec/s", f"raw_{keys}.wall")
    bench.add(
        f"6. compaction, records scanned ({label})",
        "rec/s",
        f"compact_{keys}.scanned_per_s",
        baseline=f"raw_{keys}.wall",
        target=Target(">=", 1_000_000),
    )
    # per CPU second of this process (the cleaner runs in it): the code's own cost, which
    # the neighbours on a shared machine move far less than the wall rate
    bench.add(f"6. baseline per CPU second ({label})", "rec/s", f"raw_{keys}.cpu")
    bench.add(
        f"6. compaction per CPU second ({label})",
        "rec/s",
        f"compact_{keys}.scanned_per_cpu_s",
        baseline=f"raw_{keys}.cpu",
    )
    bench.add(f"6.   kept / scanned ({label})", "ratio", f"compact_{keys}.kept_fraction")
    shutil.rmtree(master)


def figure6_retention(bench: Bench, root: Path, count: int) -> None:
    master = build(
        root,
        count,
        10_000,
        {
            "cleanup_policy": "delete",
            "segment_bytes": SEGMENT_BYTES,
            "retention_bytes": SEGMENT_BYTES // 4,
            "retention_ms": -1,
        },
    )
    segments = closed_segments(master)
    copies = Copies(root, master)

    def raw() -> float:
        t0 = time.perf_counter()
        got = read_parse(segments, verify_crc=False)
        return got / (time.perf_counter() - t0)

    def retention() -> Mapping[str, float]:
        data = copies.fresh()
        store = LogStore(data)
        store.partition(TOPIC, 0)
        t0 = time.perf_counter()
        reports: list[Any] = store.cleanup(TOPIC)
        seconds = time.perf_counter() - t0
        report = reports[0]
        assert report.records_deleted > 0, report
        store.close()
        shutil.rmtree(data)
        return {
            "deleted_per_s": report.records_deleted / seconds,
            "deleted": report.records_deleted,
        }

    bench.rounds({"raw_retention": raw, "retention": retention}, warmup=True)
    bench.add("6. baseline: read + parse closed segments (retention log)", "rec/s", "raw_retention")
    bench.add(
        "6. retention, records deleted",
        "rec/s",
        "retention.deleted_per_s",
        baseline="raw_retention",
        target=Target(">=", 1_000_000),
    )
    shutil.rmtree(master)


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=None, help="records in the partition")
    p.add_argument(
        "--keys",
        type=int,
        nargs="+",
        default=[10_000, 500_000],
        help="distinct keys, one compaction figure each",
    )
    args = p.parse_args(argv)
    count = args.records or (300_000 if args.quick else 2_000_000)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    bench.notes.append(
        f"{count:,} records of {VALUE_SIZE} B values, ~10 B keys,"
        f" {SEGMENT_BYTES >> 20} MiB segments; each run on a fresh copy"
    )
    with scratch_dir(args.tmp, "maintenance") as root:
        for keys in args.keys:
            figure6_compaction(bench, root, count, min(keys, count))
        figure6_retention(bench, root, count)
    bench.finish()


if __name__ == "__main__":
    main()
