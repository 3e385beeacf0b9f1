"""Key → partition placement, byte-for-byte compatible with Kafka's default partitioner.

A keyed record goes to partition ``(murmur2(key) & 0x7fffffff) % num_partitions``, with
``murmur2`` exactly Kafka's ``org.apache.kafka.common.utils.Utils.murmur2(byte[])``: 32-bit
MurmurHash2, seed ``0x9747b28c``, ``m = 0x5bd1e995``, ``r = 24``, little-endian 4-byte
blocks, the 1-3 tail bytes folded in as Kafka's ``switch`` does, and the result read as a
Java ``int`` (signed 32 bits). ``& 0x7fffffff`` is Kafka's ``Utils.toPositive`` (not
``abs``), and the whole formula is Kafka's ``BuiltInPartitioner.partitionForKey``. A topic
moved to Kafka therefore keeps every key on the partition it had here (as long as the
partition count is the same).

The hash runs in the C extension ``eventlane.log._native`` when it was built (``NATIVE`` is
then true); :func:`murmur2_py` is the pure-Python reference and fallback. Both are proven
against Kafka's own test vectors.

Records without a key are spread by :class:`KeylessSpreader`.

>>> murmur2(b"21")
-973932308
>>> to_positive(-973932308)
1173551340
>>> partition_for_key(b"21", 6)
0
>>> partitions_for_keys([b"", b"a", b"abc"], 1000)
[681, 524, 107]
"""

from __future__ import annotations

import importlib
import itertools
import random
import struct
from collections.abc import Callable, Sequence
from types import ModuleType

__all__ = [
    "NATIVE",
    "murmur2",
    "murmur2_py",
    "to_positive",
    "partition_for_key",
    "partitions_for_keys",
    "KeylessSpreader",
]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF


def murmur2_py(data: bytes) -> int:
    """Kafka's ``Utils.murmur2(data)`` in pure Python: a signed 32-bit int (Java's ``int``).

    The reference for the C implementation, and the fallback when it is not built.

    >>> murmur2_py(b"foobar")
    -790332482
    >>> murmur2_py(b"abc")
    479470107
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    length4 = length // 4
    for block in struct.unpack_from(f"<{length4}I", data) if length4 else ():
        k = (block * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length & ~3
    extra = length & 3
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's ``Utils.toPositive``: ``n & 0x7fffffff`` (a bit mask, not ``abs``).

    >>> to_positive(-1)
    2147483647
    >>> to_positive(5)
    5
    """
    return n & 0x7FFFFFFF


def _check_partitions(num_partitions: int) -> None:
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, not {num_partitions}")


def _py_partition_for_key(key: bytes, num_partitions: int) -> int:
    _check_partitions(num_partitions)
    if key is None:
        raise TypeError("a keyless record has no key partition")
    return (murmur2_py(key) & 0x7FFFFFFF) % num_partitions


def _py_partitions_for_keys(keys: Sequence[bytes], num_partitions: int) -> list[int]:
    _check_partitions(num_partitions)
    out: list[int] = []
    for index, key in enumerate(keys):
        if key is None:
            raise TypeError(f"key {index} is None: a keyless record has no key partition")
        if not isinstance(key, bytes | bytearray | memoryview):
            raise TypeError(f"key {index} must be bytes, not {type(key).__name__}")
        out.append((murmur2_py(key) & 0x7FFFFFFF) % num_partitions)
    return out


def _load_native() -> ModuleType | None:
    try:
        return importlib.import_module("eventlane.log._native")
    except ImportError:  # pragma: no cover - only without a C compiler
        return None


_native = _load_native()

NATIVE: bool = _native is not None
"""Whether the C implementations are in use."""

murmur2: Callable[[bytes], int]
"""Kafka's ``Utils.murmur2(data)``: a signed 32-bit int. Native when built, else
:func:`murmur2_py`."""

partition_for_key: Callable[[bytes, int], int]
"""``partition_for_key(key, num_partitions)``: Kafka's ``BuiltInPartitioner.partitionForKey``,
``to_positive(murmur2(key)) % num_partitions`` = ``(murmur2(key) & 0x7fffffff) %
num_partitions``. ``ValueError`` if ``num_partitions < 1``, ``TypeError`` for a ``None`` key."""

partitions_for_keys: Callable[[Sequence[bytes], int], list[int]]
"""``partitions_for_keys(keys, num_partitions)``: :data:`partition_for_key` of every key, as a
list, in one native loop."""

if _native is not None:
    murmur2 = _native.murmur2
    partition_for_key = _native.partition_for_key
    partitions_for_keys = _native.partitions_for_keys
else:  # pragma: no cover - only without a C compiler
    murmur2 = murmur2_py
    partition_for_key = _py_partition_for_key
    partitions_for_keys = _py_partitions_for_keys


class KeylessSpreader:
    """Spreads records without a key across a topic's partitions.

    Kafka's sticky partitioner in spirit (KIP-480/KIP-794): all the keyless records of one
    batch go to one partition, so a batch stays one append, and successive batches move on
    round-robin, so the partitions fill evenly. Call :meth:`next_partition` once per batch of
    keyless records (a single-record ``send`` is a batch of one, which makes single sends
    plain round-robin). The first partition is random unless ``start`` is given, so producers
    in several processes do not all begin on partition 0.

    Thread-safe: ``itertools.count`` advances atomically under the GIL. Build a new spreader
    when the topic's partition count changes.

    >>> spreader = KeylessSpreader(3, start=1)
    >>> [spreader.next_partition() for _ in range(5)]
    [1, 2, 0, 1, 2]
    """

    __slots__ = ("_counter", "num_partitions")

    def __init__(self, num_partitions: int, *, start: int | None = None) -> None:
        _check_partitions(num_partitions)
        self.num_partitions = num_partitions
        first = random.randrange(num_partitions) if start is None else start % num_partitions
        self._counter = itertools.count(first)

    def next_partition(self) -> int:
        """The partition for the next batch of keyless records."""
        return next(self._counter) % self.num_partitions

    def __repr__(self) -> str:
        return f"KeylessSpreader(num_partitions={self.num_partitions})"
