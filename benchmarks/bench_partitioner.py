"""Kafka murmur2 key → partition: pure Python vs the C extension.

Prints, as the median of ``--runs`` runs (>= 5) over the same keys, keys/s for:

* ``murmur2_py``               the pure-Python reference (the raw baseline of this run),
* ``murmur2``                  native, one call per key,
* ``partition_for_key``        native, one call per key (what a single ``send`` pays),
* ``partitions_for_keys``      native, one call for all keys (the batch producer path),

each with its ratio to the pure-Python baseline. Keys default to 36-byte UUID strings (the
shape of aggregate ids); ``--key-bytes`` picks another length.

    .venv/bin/python benchmarks/bench_partitioner.py [--keys 200000] [--runs 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable, Sequence

from eventlane.log import partitioner
from eventlane.log.partitioner import (
    murmur2,
    murmur2_py,
    partition_for_key,
    partitions_for_keys,
)

NUM_PARTITIONS = 12


def make_keys(count: int, key_bytes: int | None, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    if key_bytes is None:
        return [str(uuid.UUID(int=rng.getrandbits(128), version=4)).encode() for _ in range(count)]
    return [rng.randbytes(key_bytes) for _ in range(count)]


def per_key(fn: Callable[[bytes], int]) -> Callable[[Sequence[bytes]], object]:
    def run(keys: Sequence[bytes]) -> object:
        return [fn(k) for k in keys]

    return run


def per_key_partition(keys: Sequence[bytes]) -> object:
    return [partition_for_key(k, NUM_PARTITIONS) for k in keys]


def batch_partitions(keys: Sequence[bytes]) -> object:
    return partitions_for_keys(keys, NUM_PARTITIONS)


def measure(fn: Callable[[Sequence[bytes]], object], keys: Sequence[bytes], runs: int) -> float:
    """Median keys/s over ``runs`` timed runs (after one warm-up run)."""
    fn(keys)
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(keys)
        rates.append(len(keys) / (time.perf_counter() - t0))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="keys per run")
    parser.add_argument("--runs", type=int, default=7, help="timed runs (median; >= 5)")
    parser.add_argument("--key-bytes", type=int, default=None, help="random keys of N bytes")
    args = parser.parse_args()
    runs = max(args.runs, 5)
    keys = make_keys(args.keys, args.key_bytes)
    # The pure-Python baseline is ~60x slower: time it on a slice so runs stay short.
    py_keys = keys[: max(len(keys) // 20, 1000)]

    assert per_key(murmur2)(keys) == per_key(murmur2_py)(keys), "native != pure Python"
    shape = "uuid36" if args.key_bytes is None else f"{args.key_bytes}-byte"
    print(f"murmur2 partitioner, {shape} keys, {NUM_PARTITIONS} partitions, median of {runs}")
    print(f"native extension loaded: {partitioner.NATIVE}")

    baseline = measure(per_key(murmur2_py), py_keys, runs)
    rows = [
        ("murmur2_py (pure Python, baseline)", baseline),
        ("murmur2 (native, per key)", measure(per_key(murmur2), keys, runs)),
        ("partition_for_key (native, per key)", measure(per_key_partition, keys, runs)),
        ("partitions_for_keys (native, batch)", measure(batch_partitions, keys, runs)),
    ]
    for name, rate in rows:
        print(
            f"  {name:<40} {rate / 1e6:8.3f} M keys/s  {1e9 / rate:9.1f} ns/key  "
            f"{rate / baseline:7.1f}x"
        )


if __name__ == "__main__":
    main()
