"""Before/after: one benchmark script run in two checkouts, alternating, compared by ratio.

A refactor must leave no figure worse than noise. Absolute figures on a shared 2-core machine
move 20-25 % between runs, so this compares what each script already reports as its figure
of record, the ratio to a baseline measured in the same run (see ``_harness``), across two
checkouts (each with its own ``.venv``), in pairs whose order alternates (the second run of a
pair gains a few per cent from a warm page cache). Per figure it prints the median over pairs
of ``after ratio / before ratio`` with its range: 1.00 is unchanged, above 1 the after tree
reports the larger number (faster for a throughput, slower for a latency).

    .venv/bin/python benchmarks/compare_trees.py --before ../old --after . \\
        --pairs 3 bench_read.py -- --quick --runs 5

Each tree runs its own copy of the script (module paths differ between versions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def run_once(tree: Path, script: str, args: list[str]) -> dict[tuple[str, str], float]:
    """Run ``script`` in ``tree`` with ``--json``; the ratio of each row by (figure, series)."""
    results = tree / "benchmarks" / "results"
    for old in results.glob(Path(script).stem + "*.json"):
        old.unlink()  # the name may carry a suffix (``-quick``): take the one this run writes
    cmd = [str(tree / ".venv/bin/python"), str(tree / "benchmarks" / script), *args, "--json"]
    subprocess.run(cmd, cwd=tree, check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())
    (result,) = results.glob(Path(script).stem + "*.json")
    body = json.loads(result.read_text())
    return {
        (row["figure"], row["series"]): float(row["ratio"])
        for row in body["rows"]
        if row.get("ratio") is not None
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="the checkout before the change")
    p.add_argument("--after", type=Path, default=Path("."), help="the checkout after it")
    p.add_argument("--pairs", type=int, default=3, help="before/after pairs (order alternates)")
    p.add_argument("script", help="a script in benchmarks/, e.g. bench_read.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the script's own arguments")
    ns = p.parse_args(argv)
    args = [a for a in ns.args if a != "--"]
    trees = {"before": ns.before.resolve(), "after": ns.after.resolve()}
    ratios: dict[tuple[str, str], list[float]] = {}
    for pair in range(ns.pairs):
        order = ["before", "after"] if pair % 2 == 0 else ["after", "before"]
        got = {name: run_once(trees[name], ns.script, args) for name in order}
        print(f"pair {pair + 1}/{ns.pairs} ({' then '.join(order)})", file=sys.stderr)
        for key, before in got["before"].items():
            after = got["after"].get(key)
            if after is not None and before > 0:
                ratios.setdefault(key, []).append(after / before)
    load = os.getloadavg()[0]
    print(f"# {ns.script} {' '.join(args)}: after/before of each figure's ratio to its baseline,")
    print(f"# {ns.pairs} alternating pairs, load average {load:.1f} at the end")
    print("| figure | series | after/before (median) | min | max |")
    print("|---|---|---|---|---|")
    for (figure, series), values in sorted(ratios.items()):
        med = statistics.median(values)
        print(f"| {figure} | {series} | {med:.2f} | {min(values):.2f} | {max(values):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
