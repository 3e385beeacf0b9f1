"""Crash soak: ``kill -9`` producers mid-append for many cycles, and printed figures.

Runs the same harnesses as ``tests/log/test_crash.py`` (``tests/log/procs.py``), for as many
cycles as asked, and prints: cycles, kills (how many at a chosen storage call, how many with
two producers at once), simulated reboots, acknowledged records, records in the log, records
a tailing reader saw, every anomaly count (lost, misplaced, reordered, duplicated, corrupt,
vanished from a reader's view, wrong content, child errors) and recovery time statistics.
Exit status 1 if any anomaly was found.

    .venv/bin/python benchmarks/soak_crash.py --cycles 1000
    .venv/bin/python benchmarks/soak_crash.py --cycles 200 --sweep 60 \\
        --compaction-cycles 50 --retention-cycles 50

Each producer cycle starts one producer process (two every fifth cycle), kills it with
SIGKILL after a random delay or at a random storage call of its own, simulates a reboot
every fourth cycle, reopens the log (timed: the recovery) and checks it against the
acknowledgements. ``--sweep N`` also kills a scripted producer at each of its first N storage
calls. The maintenance loops kill a process in the middle of compaction and of retention.
Data lives in a temporary directory (``--dir`` to choose one, ``--keep`` to keep it).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eventlane.observability import configure_logging

PROCS_PATH = Path(__file__).resolve().parent.parent / "tests" / "log" / "procs.py"


def load_procs() -> Any:
    spec = importlib.util.spec_from_file_location("eventlane_log_procs", PROCS_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=1000, help="producer kill cycles")
    parser.add_argument(
        "--sweep",
        type=int,
        default=0,
        help="also kill a scripted producer at each of its first N calls",
    )
    parser.add_argument("--compaction-cycles", type=int, default=0)
    parser.add_argument("--retention-cycles", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--topic-cycles",
        type=int,
        default=50,
        help="start a fresh topic every N cycles (bounds the re-reads)",
    )
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--log-level",
        default="error",
        help="this process's log level (recoveries log warnings; children log to files)",
    )
    args = parser.parse_args()

    configure_logging(level=args.log_level)
    procs = load_procs()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    root = args.dir or Path(tempfile.mkdtemp(prefix="eventlane-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"seed={seed} dir={root}", flush=True)
    failed = False
    started = time.monotonic()

    def progress(label: str, every: int) -> Any:
        def report(done: int, figures: Any) -> None:
            if done % every == 0:
                bad = {k: v for k, v in figures.anomalies.items() if v}
                print(
                    f"  {label}: {done} cycles, {time.monotonic() - started:.0f} s, "
                    f"acked={figures.acked} anomalies={bad or 0}",
                    file=sys.stderr,
                    flush=True,
                )

        return report

    def show(title: str, figures: Any, seconds: float) -> None:
        nonlocal failed
        print(f"\n== {title} ({seconds:.0f} s)\n{figures.summary()}", flush=True)
        failed = failed or not figures.clean()

    try:
        if args.cycles:
            t0 = time.monotonic()
            loop = procs.ProducerCrashLoop(
                root / "producers", seed=seed, topic_cycles=args.topic_cycles, keep_files=args.keep
            )
            show(
                f"kill -9 of producers mid-append, {args.cycles} cycles",
                loop.run(args.cycles, progress("producers", 25)),
                time.monotonic() - t0,
            )
        if args.sweep:
            t0 = time.monotonic()
            loop = procs.ProducerCrashLoop(
                root / "sweep",
                seed=seed,
                partitions=1,
                segment_bytes=12 * 1024,
                with_reader=False,
                keep_files=args.keep,
            )
            show(
                f"kill -9 at each of the first {args.sweep} storage calls",
                loop.sweep(range(1, args.sweep + 1), plan=[40] * 8),
                time.monotonic() - t0,
            )
        if args.compaction_cycles:
            t0 = time.monotonic()
            compaction = procs.CompactionCrashLoop(root / "compaction", seed=seed)
            show(
                f"kill -9 during compaction, {args.compaction_cycles} cycles",
                compaction.run(args.compaction_cycles, progress("compaction", 10)),
                time.monotonic() - t0,
            )
        if args.retention_cycles:
            t0 = time.monotonic()
            retention = procs.RetentionCrashLoop(root / "retention", seed=seed)
            show(
                f"kill -9 during retention, {args.retention_cycles} cycles",
                retention.run(args.retention_cycles, progress("retention", 10)),
                time.monotonic() - t0,
            )
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{'FAILED' if failed else 'clean'}: total {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
