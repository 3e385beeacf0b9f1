"""Memory soak: the invoicing workload for a long time, each process's RSS printed over time.

    .venv/bin/python benchmarks/soak_memory.py --minutes 30
    nice .venv/bin/python benchmarks/soak_memory.py --minutes 5 --sample-s 10   # quick look

Runs what ``eventlane demo invoicing`` runs, without end: the command process executes the
seeded workload (customers, orders, changes, confirmations; a new ``run`` namespace per
round, so every round writes new aggregate keys) and pays the open invoices of each round,
while every projector of the app (the invoicing policy included) runs as a consumer group
of ``--workers`` worker processes. Every ``--sample-s`` seconds it prints one line per
process on stdout (tab-separated: ``elapsed_s process pid rss_mib``), then a table:
each process's RSS at the start, after a third and two thirds of the run, at the end, and
its growth over the last third as a share of its size. Verdict (the last line; exit status
1 if it fails): every process levels off, its growth over the last third below
``--max-growth`` (5 %). A worker replaced during the run (a crash: reported) starts a new
series. Diagnostics go to stderr; data lives in a temporary directory (``--dir``).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eventlane.observability import configure_logging
from eventlane.projection import Runner, open_readmodel, readmodel_path
from example_apps.invoicing.app import app
from example_apps.invoicing.demo import APP_SPEC, pay_open_invoices
from example_apps.invoicing.workload import Workload

MIB = 1 << 20


def _rss_mib(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).memory_info().rss) / MIB
    except psutil.Error:
        return None


def _cache_fill(runtime: Any) -> dict[str, int]:
    """How full the command process's per-key caches are (diagnostics: internals)."""
    out: dict[str, int] = {}
    with contextlib.suppress(Exception):
        out["stream_cache_events"] = runtime.store.cache._events
        keys = runtime.log.keys
        out["key_heads"] = sum(len(i._heads) for i in keys._indexes.values())
        out["key_indexes"] = len(keys._indexes)
        out["checked_heads"] = len(keys._checked)
        out["key_store_subjects"] = runtime.keys.cached_subjects
        cipher = runtime.codec._cipher
        out["aes_by_key"] = len(cipher._aeads)
        out["aes_by_subject"] = len(cipher._opened)
    return out


def _series_figures(
    points: list[tuple[float, float]], start: float, end: float
) -> dict[str, float]:
    """RSS at the start, a third, two thirds and the end of ``[start, end]`` (the sample
    nearest each), and the growth over the last third in percent of the size there."""

    def at(t: float) -> float:
        return min(points, key=lambda p: abs(p[0] - t))[1]

    span = end - start
    first, third, two_thirds, last = (at(start + span * f) for f in (0, 1 / 3, 2 / 3, 1))
    growth = 100.0 * (last - two_thirds) / two_thirds if two_thirds else 0.0
    return {"start": first, "third": third, "two_thirds": two_thirds, "end": last, "growth": growth}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="duration (default 30)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per projector")
    parser.add_argument("--orders", type=int, default=500, help="orders per workload round")
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--max-growth", type=float, default=5.0, help="percent, last third")
    parser.add_argument("--dir", type=Path, help="data directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()
    configure_logging(level="WARNING")  # diagnostics on stderr

    data = args.dir or Path(tempfile.mkdtemp(prefix="eventlane-soak-memory-"))
    data.mkdir(parents=True, exist_ok=True)
    series: dict[str, list[tuple[float, float]]] = {}
    labels: dict[int, str] = {}
    replaced: list[str] = []
    commands = rounds = 0
    print("elapsed_s\tprocess\tpid\trss_mib", flush=True)
    try:
        with app.open(data) as runtime:
            for name in app.projectors:
                open_readmodel(runtime, name, migrate=True).close()
            runners = {
                name: Runner(
                    APP_SPEC,
                    name,
                    data,
                    workers=args.workers,
                    restart=True,
                    session_timeout_ms=3000,
                    log_path=data / "workers.log",
                )
                for name in app.projectors
            }
            for runner in runners.values():
                runner.start()
            print(
                f"{len(runners)} projector groups x {args.workers} workers; data in {data}",
                file=sys.stderr,
            )
            t0 = time.monotonic()
            deadline = t0 + args.minutes * 60
            next_sample = t0

            def sample() -> None:
                now = time.monotonic() - t0
                procs = [("command", psutil.Process().pid)]
                for name, runner in runners.items():
                    for w in runner.procs:
                        label = labels.get(w.pid)
                        if label is None:  # a slot's first worker, or its replacement
                            label = f"{name}#{w.slot}"
                            if label in series:
                                label = f"{label}@{w.pid}"
                                replaced.append(label)
                            labels[w.pid] = label
                        procs.append((label, w.pid))
                for label, pid in procs:
                    rss = _rss_mib(pid)
                    if rss is None:
                        continue
                    series.setdefault(label, []).append((now, rss))
                    print(f"{now:.0f}\t{label}\t{pid}\t{rss:.1f}", flush=True)

            while time.monotonic() < deadline:
                rounds += 1
                workload = Workload(orders=args.orders, seed=7, run=rounds)
                for command in workload.commands():
                    runtime.execute(
                        command.cls, command.aggregate_id, command.action, create=command.create
                    )
                    commands += 1
                    if commands % 200 == 0:
                        for runner in runners.values():
                            runner.supervise_once()
                    if time.monotonic() >= next_sample:
                        sample()
                        next_sample += args.sample_s
                    if time.monotonic() >= deadline:
                        break
                with contextlib.suppress(Exception):  # the read model may lag: pay fewer
                    commands += pay_open_invoices(
                        runtime, readmodel_path(data, "invoices"), rounds, 7
                    )
            sample()
            end = time.monotonic() - t0
            print(f"command process caches at the end: {_cache_fill(runtime)}", file=sys.stderr)
            for runner in runners.values():
                runner.stop()
            crashes = [c for r in runners.values() for c in r.crashes]
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(data, ignore_errors=True)

    print(
        f"\n{commands} commands in {rounds} rounds, {end / 60:.1f} min; "
        f"worker crashes: {len(crashes)}; series restarted: {replaced or 'none'}"
    )
    print("process\tstart_mib\tthird_mib\ttwo_thirds_mib\tend_mib\tgrowth_last_third_pct")
    failed = []
    for label, points in series.items():
        if len(points) < 3 or points[-1][0] - points[0][0] < end / 2:
            continue  # a short-lived series (a replaced worker): too short to judge
        f = _series_figures(points, points[0][0], points[-1][0])
        print(
            f"{label}\t{f['start']:.1f}\t{f['third']:.1f}\t{f['two_thirds']:.1f}\t"
            f"{f['end']:.1f}\t{f['growth']:+.1f}"
        )
        if f["growth"] >= args.max_growth:
            failed.append(label)
    verdict = "PASS" if not failed else f"FAIL ({', '.join(failed)})"
    print(
        f"verdict: {verdict}: every process's RSS growth over the last third < "
        f"{args.max_growth:g} %"
    )
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
