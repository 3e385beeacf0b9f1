"""Power-loss soak: record a larger workload and check many more crash states.

Same explorer as ``tests/powerloss/test_powerloss.py`` (``tests/powerloss/explore.py``):
records the workload's file-system calls with strace, generates the states a power loss may
leave under ext4 ``data=ordered`` (``docs/reliability.md``), recovers each with eventlane and
checks it against the workload's acknowledgements. Prints the figures; exit status 1 if any
state fails.

    .venv/bin/python benchmarks/soak_powerloss.py --size 8 --crash-points 400 --states 5
    .venv/bin/python benchmarks/soak_powerloss.py --journaling   # fsync commits dir changes
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eventlane.observability import configure_logging
from tests.powerloss.explore import explore


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8, help="workload rounds")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--crash-points", type=int, default=400)
    parser.add_argument("--states", type=int, default=5, help="states per crash point")
    parser.add_argument("--deadline", type=float, default=3000.0, help="seconds of checking")
    parser.add_argument(
        "--journaling",
        action="store_true",
        help="assume an fsync also commits earlier directory changes (ext4)",
    )
    parser.add_argument("--keep", type=Path, help="copy failing states here")
    args = parser.parse_args()
    configure_logging("error")
    fig = explore(
        args.size,
        args.seed,
        args.crash_points,
        args.states,
        keep_failures=args.keep,
        deadline_s=args.deadline,
        strict_dirs=not args.journaling,
    )
    print(fig.summary())
    kinds = collections.Counter(p.split(":")[0] for f in fig.failures for p in f.problems)
    for kind, count in kinds.most_common():
        print(f"  {count:5d}  {kind}")
    for failure in fig.failures[:5]:
        print(f"  e.g. {failure.state}: {failure.problems[0]}")
    return 1 if fig.failures else 0


if __name__ == "__main__":
    sys.exit(main())
