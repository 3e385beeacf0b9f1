"""Shared benchmark harness: repeated runs, same-run raw baselines, ratios, a table, JSON.

The machines this project runs on have 2 cores and noisy neighbours, so no absolute figure is
trusted alone. Every benchmark script here therefore:

* runs each *subject* (the framework doing X) and its *baseline* (plain Python doing the
  least that X must do: write + fsync, read + parse + CRC, a pipe wake-up, ...) in the same
  process, **interleaved round by round** (baseline, subject, subject, ... then again), so a
  noisy minute hurts both sides alike;
* repeats that ``runs`` times (at least 5) and reports the median, min and max of each;
* reports ``ratio = subject median / baseline median`` (the figure of record; above 1 means
  the subject reports a larger number than the baseline: faster for a throughput, slower for
  a latency) and a pass/fail against the absolute target of brief section 4;
* prints the machine's context: a calibration loop, CPU steal and how busy *other*
  processes kept the machine during the run (``/proc/stat`` minus this process tree) and the
  load average, so two result files can be compared and a contended run recognised.

A measurement function takes no arguments and returns either one number or a mapping of
named numbers (``{"p50": ..., "p99": ...}``): each name becomes its own series
``"<measurement>.<name>"``. Setup that must not be timed belongs outside the function, or
inside it before the function's own clock starts (each function times itself).

JSON (``--json``) goes to ``benchmarks/results/<script>.json`` (git-ignored)::

    {"script", "argv", "started", "seconds", "machine": {...}, "contention": {...},
     "notes": [...], "rows": [{"figure", "unit", "series", "median", "min", "max", "runs",
     "baseline", "baseline_median", "ratio", "target", "passed", "note"}],
     "series": {"name": [values...]}, "markdown": "the rows as a markdown table"}
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import structlog

from eventlane.log.embedded import batch

RESULTS_DIR = Path(__file__).resolve().parent / "results"

Measure = Callable[[], "float | Mapping[str, float]"]


# ---------------------------------------------------------------------------------- stats
def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values, by linear interpolation."""
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac)


@dataclass(frozen=True)
class Target:
    """An absolute target: ``median <op> value`` where ``op`` is ``">="`` or ``"<"``."""

    op: str
    value: float

    def check(self, median: float) -> bool:
        return median >= self.value if self.op == ">=" else median < self.value

    def __str__(self) -> str:
        return f"{self.op} {fmt(self.value)}"


@dataclass
class Row:
    """One line of the results table."""

    figure: str
    unit: str
    series: str
    baseline: str | None = None
    target: Target | None = None
    note: str = ""
    # Filled in by Bench.rows_table():
    median: float = float("nan")
    min: float = float("nan")
    max: float = float("nan")
    runs: int = 0
    baseline_median: float | None = None
    ratio: float | None = None
    passed: bool | None = None


def fmt(value: float | None) -> str:
    """A number in a short, human form: 1.23M, 45.6k, 0.812, 1.9e-05."""
    if value is None or value != value:  # None or NaN
        return "-"
    mag = abs(value)
    if mag >= 1e6:
        return f"{value / 1e6:.2f}M"
    if mag >= 1e4:
        return f"{value / 1e3:.1f}k"
    if mag >= 100:
        return f"{value:.0f}"
    if mag >= 1:
        return f"{value:.2f}"
    if mag == 0:
        return "0"
    if mag >= 1e-3:
        return f"{value:.3f}"
    return f"{value:.1e}"


# ---------------------------------------------------------------------------------- machine
class CpuSample(NamedTuple):
    """Machine-wide CPU counters (seconds, all cores) and this process's own CPU seconds."""

    total: float
    steal: float
    idle: float
    own: float


def cpu_sample() -> CpuSample:
    """Read ``/proc/stat`` (zeros where there is none) and ``os.times()``.

    ``own`` includes waited-for children (the benchmark's worker processes).
    """
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    times = os.times()
    own = times.user + times.system + times.children_user + times.children_system
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return CpuSample(0.0, 0.0, 0.0, own)
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    values += [0] * (8 - len(values))
    return CpuSample(sum(values[:8]) / tick, values[7] / tick, (values[3] + values[4]) / tick, own)


def contention(before: CpuSample, after: CpuSample) -> dict[str, float | None]:
    """Steal % and the share of the machine other processes used between two samples.

    ``others_busy_percent`` is busy CPU time not spent by this process (or its children)
    as a % of all cores' time: above ~10 % the run competed with other work and its
    absolute figures are suspect (ratios suffer less, the two sides being interleaved).
    """
    total = after.total - before.total
    if total <= 0:
        return {"steal_percent": None, "others_busy_percent": None}
    busy = total - (after.idle - before.idle) - (after.steal - before.steal)
    others = max(0.0, busy - (after.own - before.own))
    return {
        "steal_percent": round(100.0 * (after.steal - before.steal) / total, 1),
        "others_busy_percent": round(100.0 * others / total, 1),
    }


def calibrate(rounds: int = 2000) -> float:
    """Microseconds for ``sum(range(1000))``: a CPU-speed probe to compare machines/runs."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(rounds):
            sum(range(1000))
        best = min(best, (time.perf_counter() - t0) / rounds * 1e6)
    return best


def machine_info() -> dict[str, object]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    native = bool(batch.NATIVE)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "native_extension": native,
        "calibration_us_sum_range_1000": round(calibrate(), 2),
    }


# ---------------------------------------------------------------------------------- bench
@dataclass
class Bench:
    """Collects series of repeated measurements and turns them into table rows."""

    script: str
    runs: int
    quick: bool
    json_out: bool = False
    series: dict[str, list[float]] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    _t0: float = field(default_factory=time.perf_counter)
    _cpu0: CpuSample = field(default_factory=cpu_sample)
    _machine: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._machine = machine_info()
        print(
            f"# {self.script}: median of {self.runs} runs{' (--quick)' if self.quick else ''};"
            f" {self._machine['cpus']} CPUs ({self._machine['cpu_model']}),"
            f" Python {self._machine['python']}, native={self._machine['native_extension']},"
            f" calib sum(range(1000)) = {self._machine['calibration_us_sum_range_1000']} us",
            flush=True,
        )

    def record(self, name: str, result: float | Mapping[str, float]) -> None:
        if isinstance(result, Mapping):
            for key, value in result.items():
                self.series.setdefault(f"{name}.{key}", []).append(float(value))
        else:
            self.series.setdefault(name, []).append(float(result))

    def rounds(
        self,
        measures: Mapping[str, Measure],
        *,
        runs: int | None = None,
        warmup: bool = False,
        between: Callable[[], None] | None = None,
    ) -> None:
        """Run every measure once per round, in the given order, for ``runs`` rounds.

        ``warmup`` runs each measure once first without recording it (page cache, imports,
        allocator). ``between`` is called before every measure (e.g. to reset a directory).
        """
        n = runs or self.runs
        if warmup:
            for fn in measures.values():
                if between is not None:
                    between()
                fn()
        for i in range(n):
            for name, fn in measures.items():
                if between is not None:
                    between()
                gc.collect()
                self.record(name, fn())
            print(f"  round {i + 1}/{n} done", file=sys.stderr, flush=True)

    def paired(self, series: str, baseline: str) -> str:
        """Record ``series / baseline`` round by round as the series ``paired.<series>.<baseline>``
        (returned): with both measured in every round, the median of these ratios is less at
        the mercy of a slow moment of a shared machine than the ratio of the two medians."""
        name = f"paired.{series}.{baseline}"
        self.series[name] = [
            a / b for a, b in zip(self.series[series], self.series[baseline], strict=True)
        ]
        return name

    def add(
        self,
        figure: str,
        unit: str,
        series: str,
        *,
        baseline: str | None = None,
        target: Target | None = None,
        note: str = "",
    ) -> None:
        """Declare a table row: ``series`` (and its ``baseline`` series) must be recorded."""
        self.rows.append(Row(figure, unit, series, baseline, target, note))

    def _fill(self) -> None:
        for row in self.rows:
            values = self.series.get(row.series, [])
            if not values:
                continue
            row.median = statistics.median(values)
            row.min, row.max, row.runs = min(values), max(values), len(values)
            if row.baseline is not None and self.series.get(row.baseline):
                row.baseline_median = statistics.median(self.series[row.baseline])
                if row.baseline_median:
                    row.ratio = row.median / row.baseline_median
            if row.target is not None:
                row.passed = row.target.check(row.median)

    def contention(self) -> dict[str, float | None]:
        """CPU steal and other processes' load since the bench started (see ``contention``)."""
        out = contention(self._cpu0, cpu_sample())
        with contextlib.suppress(OSError):
            out["loadavg_1min"] = os.getloadavg()[0]
        return out

    def table(self) -> str:
        self._fill()
        header = ("figure", "unit", "median", "min", "max", "baseline", "ratio", "target", "pass")
        lines = [header]
        for r in self.rows:
            lines.append(
                (
                    r.figure,
                    r.unit,
                    fmt(r.median),
                    fmt(r.min),
                    fmt(r.max),
                    fmt(r.baseline_median),
                    "-" if r.ratio is None else f"{r.ratio:.2f}x",
                    "-" if r.target is None else str(r.target),
                    "-" if r.passed is None else ("PASS" if r.passed else "FAIL"),
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        out = []
        for n, line in enumerate(lines):
            cells = [line[0].ljust(widths[0]), line[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(line[2:], widths[2:], strict=True)]
            out.append("  ".join(cells))
            if n == 0:
                out.append("  ".join("-" * w for w in widths))
        return "\n".join(out)

    def markdown(self) -> str:
        """The same table as GitHub markdown (for docs/performance.md)."""
        self._fill()
        out = [
            "| figure | median | min | max | baseline (median) | ratio | target | |",
            "|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in self.rows:
            base = "-" if r.baseline is None else f"{fmt(r.baseline_median)} ({r.baseline})"
            out.append(
                f"| {r.figure} | {fmt(r.median)} {r.unit} | {fmt(r.min)} | {fmt(r.max)} | "
                f"{base} | {'-' if r.ratio is None else f'{r.ratio:.2f}x'} | "
                f"{'-' if r.target is None else str(r.target)} | "
                f"{'-' if r.passed is None else ('PASS' if r.passed else 'FAIL')} |"
            )
        return "\n".join(out)

    def finish(self) -> None:
        """Print the table (and notes), and write JSON if asked."""
        seconds = time.perf_counter() - self._t0
        load = self.contention()
        print()
        print(self.table())
        print()
        for note in self.notes:
            print(f"note: {note}")
        print(
            f"steal {load.get('steal_percent')}%, other processes busy"
            f" {load.get('others_busy_percent')}% of the machine, load average"
            f" {load.get('loadavg_1min')}; wall {seconds:.0f} s"
        )
        if self.json_out:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            path = RESULTS_DIR / f"{Path(self.script).stem}{'-quick' if self.quick else ''}.json"
            body = {
                "script": self.script,
                "argv": sys.argv[1:],
                "started": self.started,
                "seconds": round(seconds, 1),
                "contention": load,
                "machine": self._machine,
                "notes": self.notes,
                "rows": [
                    {**asdict(r), "target": None if r.target is None else str(r.target)}
                    for r in self.rows
                ],
                "series": self.series,
                "markdown": self.markdown(),
            }
            path.write_text(json.dumps(body, indent=2, default=str) + "\n")
            print(f"wrote {path}")


def parser(description: str) -> argparse.ArgumentParser:
    """The common command line: ``--quick``, ``--runs``, ``--json``, ``--tmp``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and 5 runs: a smoke run, figures not meaningful",
    )
    p.add_argument("--runs", type=int, default=None, help="rounds (median of; at least 5)")
    p.add_argument(
        "--json", action="store_true", help="also write benchmarks/results/<script>.json"
    )
    p.add_argument("--tmp", default="/tmp", help="parent directory for scratch data")
    return p


def bench_from_args(script: str, args: argparse.Namespace, default_runs: int = 5) -> Bench:
    runs = max(5, args.runs if args.runs is not None else default_runs)
    return Bench(Path(script).name, runs, args.quick, args.json)


@contextlib.contextmanager
def scratch_dir(parent: str, prefix: str) -> Iterator[Path]:
    """A fresh directory under ``parent`` (default /tmp), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=f"eventlane-bench-{prefix}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def quiet_logs() -> None:
    """Silence structlog's info lines (topic created, partition recovered) during timing."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def timed_rate(count: int, fn: Callable[[], object]) -> float:
    """``count / seconds`` of one call of ``fn``."""
    t0 = time.perf_counter()
    fn()
    return count / (time.perf_counter() - t0)
